"""The 16-point randomized Hadamard transform of the weight-gradient operands (transform 'rht16', knob wgrad_rht;
docs/numerics.md section 11): against a TransformerEngine-formula oracle (tests/helpers/rht_oracle.py), the
Triton kernel against the reference (interpreter here, the GPU below), the plan, the dense op and the config."""

from dataclasses import replace

import pytest
import torch

from tests.helpers.interpreter import configs_checked
from tests.helpers.rht_cases import REALISTIC, edge_matrix, realistic, same_bits
from tests.helpers.rht_oracle import TE_SIGNS, exact_blocks, te_rht_columns, te_rht_last_dim, te_rht_matrix
from titan_fp4six import FourOverSixRecipe, four_over_six_mm
from titan_fp4six.quant.quantize import run_quantize, run_quantize_token_blocks
from titan_fp4six.numerics.formats import RHT_SIGNS
from titan_fp4six.numerics.hadamard import rht16_blocks, rht16_columns_reference
from titan_fp4six.numerics.groups import TokenBlocks
from titan_fp4six.numerics.spec import NVFP4, OperandSpec
from titan_fp4six.quant.recipe import plan_of_key

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place of finite 16-bit values of one sign (sign-magnitude order)."""
    def key(t):
        i = t.view(BITS[t.dtype]).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (key(a) - key(b)).abs()


# ---- the transform itself ----

def test_sign_vector_and_matrix_are_transformer_engines():
    assert list(RHT_SIGNS) == TE_SIGNS
    eye = torch.eye(16)
    assert torch.equal(rht16_blocks(eye), te_rht_matrix(torch.float32))  # row i: the transform of e_i
    t = te_rht_matrix(torch.float32)
    assert torch.equal(t @ t.t(), eye)  # orthogonal: sums of 16 terms +-1/16, exact


def test_inverse_is_the_transpose():
    """H = diag(s) H16 / 4 is orthogonal: applying H^T to the transform gives x back (FP32: within FP32 rounding of
    two 16-term sums, here 2^-20 of the block's largest value); the butterfly without the signs is an involution."""
    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
    back = rht16_blocks(x) @ te_rht_matrix(torch.float32).t()
    assert ((back - x).abs() <= x.abs().amax(-1, keepdim=True) * 2 ** -20).all()
    unsigned = (rht16_blocks(x * torch.tensor(RHT_SIGNS, dtype=torch.float32)) * torch.tensor(RHT_SIGNS,
                                                                                              dtype=torch.float32))
    h16 = te_rht_matrix(torch.float32) * torch.tensor(RHT_SIGNS, dtype=torch.float32)[:, None]  # H16 / 4
    assert torch.allclose(unsigned, x @ h16 @ torch.diag(torch.tensor(RHT_SIGNS, dtype=torch.float32)), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", REALISTIC)
def test_equals_transformer_engine_on_realistic_data(name, dtype):
    """bf16 / fp16 input: every FP32 sum of the block is exact where the block's exponents span little
    (rht_oracle.exact_blocks), and then the butterfly and TE's matmul round the same exact sum once: bitwise
    equal there. On these distributions the few blocks outside the condition agree too (measured on 2^20
    elements: 0 differing bf16 elements for each; fp16 a handful)."""
    g = torch.Generator().manual_seed(REALISTIC.index(name))
    x = realistic(name, 1 << 16, g).to(dtype).view(-1, 16)
    got, want = rht16_blocks(x), te_rht_last_dim(x)
    exact = exact_blocks(x)
    assert same_bits(got[exact], want[exact])
    if dtype == torch.bfloat16:
        assert same_bits(got, want)
    else:
        assert (_ulps(got, want) <= 1).all()


def test_wide_blocks_differ_from_the_matmul_only_by_fp32_rounding(dtype=torch.bfloat16):
    """bf16 (TE's RHT takes bf16 only): blocks whose exponents span more than 12 binades may round a sum in FP32;
    the project's rule is the fixed butterfly order, TE's the matmul's. Measured: bitwise equal on every exact
    block; elsewhere a rare element differs, by the FP32 roundings of the sums (relative to the block's sum of
    |x|/4, where large terms cancel) plus one rounding to the output dtype."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(1 << 16, generator=g).sign() * torch.exp(6 * torch.randn(1 << 16, generator=g)))
    x = x.clamp(-6e4, 6e4).to(dtype).view(-1, 16)
    got, want = rht16_blocks(x), te_rht_last_dim(x)
    exact = exact_blocks(x)
    assert exact.any() and same_bits(got[exact], want[exact])
    eps = 2.0 ** -7  # one bf16 ulp of the result
    bound = want.float().abs() * eps + x.float().abs().sum(-1, keepdim=True) * 2 ** -22
    assert ((got.float() - want.float()).abs() <= bound).all()
    assert (got != want).float().mean() < 1e-3


def test_edge_data_equals_transformer_engine():
    """bf16 zeros (a zero result is +0, as the matmul's where it does not flush), -0, NaN and Inf (NaN compared as NaN), single non-zeros,
    sums that cancel, random normal values: bitwise TE's. Subnormal inputs: the exact sum rounded
    once (FP32 keeps every term exactly; the CPU's bf16 matmul flushes them to zero, not part of TE's formula).
    The dtype's largest values break the condition (e_max <= 125): an unscaled partial sum may overflow."""
    x = edge_matrix(torch.bfloat16, torch.Generator().manual_seed(3))
    got, want = rht16_columns_reference(x), te_rht_columns(x)
    for cols in ([0, 1, 2, 3, 4, 8, 9], range(11, 48)):
        assert same_bits(got[:, cols], want[:, cols])
    # column 10 mixes 1.0 with the smallest normals, whose quarters the CPU's bf16 matmul flushes: where 1/4 - 1/4
    # cancels, the sign of its zero is the kernel's (+0 on Intel, -0 on AMD EPYC's oneDNN path): equal as values
    assert torch.equal(got[:, 10], want[:, 10])
    assert not torch.signbit(got[:, 10][got[:, 10] == 0]).any()  # ours: the butterfly's +0, on every CPU
    sub = x[:, 5:6]
    exact64 = (sub.double().t().reshape(-1, 16) @ te_rht_matrix(torch.float64)).float().bfloat16()
    assert same_bits(got[:, 5:6], exact64.reshape(1, -1).t())


def test_fp32_input_is_the_butterfly_not_the_matmul():
    """FP32 input rounds the sums (TE's RHT takes bf16 only): the project's order, within FP32 rounding of TE's."""
    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(5))
    got, want = rht16_blocks(x), te_rht_last_dim(x)
    assert ((got - want).abs() <= x.abs().sum(-1, keepdim=True) * 2 ** -22).all()


@pytest.mark.parametrize("m", [1, 15, 16, 17, 40])
def test_columns_are_zero_padded_blocks_of_the_transpose(m):
    x = torch.randn(m, 48, generator=torch.Generator().manual_seed(m)).bfloat16()
    padded = torch.nn.functional.pad(x, (0, 0, 0, -m % 16))
    got = rht16_columns_reference(x)
    assert got.shape == padded.shape
    assert same_bits(got.t().contiguous(), rht16_blocks(padded.t().contiguous()))
    if m % 16 == 0:
        assert same_bits(got, te_rht_columns(x))


def test_kernel_matches_reference_under_the_interpreter():
    """The Triton transform (shapes, dtypes, row strides, edge data) and the transformed columnwise operand it
    feeds (four-over-six, map-to-6, mae/448, NVFP4) against the reference, bitwise (tests/helpers/interp_rht.py)."""
    assert configs_checked("interp_rht", 300) >= 30


@pytest.mark.parametrize("token_blocks, amax", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("kind, pointer", [(0, "*i32"), (1, "*i16"), (2, "*i16")])
def test_kernel_code_rounds_every_operation_on_its_own(kind, pointer, token_blocks, amax):
    """Compiled ahead of time for Hopper (sm_90) on the CPU (fp32, bf16, fp16 input; x^T or the grouped wgrad's
    token blocks; with and without the amaxes, which are integer maxima of bit patterns): the PTX's FP32 arithmetic is the 16 multiplies by +-0.25 and the butterfly's 64 adds and
    subtracts (a negation folds into them exactly), each .rn, none flushing subnormals (.ftz), no FMA."""
    import re

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from titan_fp4six.kernels.hadamard import _NEG_MASK, BLOCK_K, _rht16_columns_kernel

    constexprs = dict(KIND=kind, NEG=_NEG_MASK, BK=BLOCK_K, TOKEN_BLOCKS=token_blocks, AMAX=amax)
    signature = {"x_ptr": pointer, "blocks_ptr": "*i32", "out_ptr": pointer, "amax_ptr": "*i32", "M": "i32",
                 "K": "i32", "stride": "i32", "NBLK": "i32", "E": "i32", **{k: "constexpr" for k in constexprs}}
    try:
        compiled = triton.compile(ASTSource(fn=_rht16_columns_kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    except Exception as exc:  # no NVIDIA backend / ptxas in this Triton build
        pytest.skip(f"cannot compile for sm_90 here: {exc}")
    ptx = compiled.asm["ptx"]
    ops = re.findall(r"\b(?:add|sub|mul|fma|div)\.[\w.]*f32\b", ptx)
    assert sorted(set(ops)) == ["add.rn.f32", "mul.rn.f32", "sub.rn.f32"]
    # Triton 3.6 emits some sign flips as 0 - x (exact; the kernel writes -0 as +0); newer ones fold them all
    zeros = set(re.findall(r"mov\.b32\s+(%r\d+), 0f00000000;", ptx))
    negations = [r for r in re.findall(r"sub\.rn\.f32\s+%r\d+, (%r\d+),", ptx) if r in zeros]
    assert ops.count("mul.rn.f32") == 16 and len(ops) - len(negations) == 16 + 64 and len(negations) <= 16


# ---- spec, plan, recipe ----

def test_spec_transform_values():
    assert OperandSpec(transform="rht16").untransformed == OperandSpec()
    assert NVFP4.untransformed is NVFP4
    with pytest.raises(ValueError, match="transforms 1x16 blocks"):
        OperandSpec(block="16x16", transform="rht16")
    with pytest.raises(ValueError, match="OperandSpec.transform='hadamard' is not supported"):
        OperandSpec(transform="hadamard")
    x = torch.randn(32, 32)
    with pytest.raises(ValueError, match="run_quantize takes untransformed specs"):
        run_quantize(x, x.abs().amax(), OperandSpec(transform="rht16"), "reference", False)
    with pytest.raises(ValueError, match="run_quantize_token_blocks takes untransformed specs"):
        run_quantize_token_blocks(x, TokenBlocks.of(torch.tensor([32], dtype=torch.int32), 32), x.abs().amax().view(1),
                                  OperandSpec(transform="rht16"), "reference", False)


def test_transformed_operand_has_the_transformed_amax():
    from titan_fp4six.quant.backends import backends_for
    from titan_fp4six.quant.operands import RoleQuantizer

    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    spec = OperandSpec(candidates="nvfp4", scale_bound=448, transform="rht16")
    op, amax = RoleQuantizer(spec, backends_for("reference", "emulated", x.device)).columns(x, x.abs().amax().float())
    assert op.codes.shape == (32, 24) and op.scales.shape == (32, 3) and op.decoded.shape == (32, 48)
    assert torch.equal(amax, rht16_columns_reference(x).abs().amax().float())


@pytest.mark.parametrize("wgrad_rht", [False, True])
def test_plan_roles(wgrad_rht):
    recipe = FourOverSixRecipe(backward="quantized", wgrad_rht=wgrad_rht)
    p = recipe.plan(grouped=False)
    want = "rht16" if wgrad_rht else "none"
    assert (p.x_t.transform, p.dy_t.transform) == (want, want)
    assert (p.x.transform, p.w.transform, p.dy.transform, p.w_t.transform) == ("none",) * 4
    assert p.dy == NVFP4 and p.dy_t.untransformed == NVFP4 and p.x_t.untransformed == p.x
    assert plan_of_key(p.key, False) == p
    assert FourOverSixRecipe(wgrad_rht=wgrad_rht).plan(grouped=False) == p  # auto: quantized for dense


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_plan_roles_grouped_and_row_scaled(grouped, scaling):
    """With the quantized backward wgrad_rht applies to every GEMM kind and activation scaling: x^T and dy^T carry
    the transform, with their scalings (x^T per row when row-scaled, dy^T per token group when grouped)."""
    recipe = FourOverSixRecipe(backward="quantized", activation_scaling=scaling, wgrad_rht=True)
    p = recipe.plan(grouped=grouped)
    plain = replace(recipe, wgrad_rht=False).plan(grouped=grouped)
    assert (p.x_t.transform, p.dy_t.transform) == ("rht16", "rht16")
    assert p.x_t.untransformed == plain.x_t and p.dy_t.untransformed == plain.dy_t
    assert (p.x, p.w, p.dy, p.w_t) == (plain.x, plain.w, plain.dy, plain.w_t)
    assert p.x_t.scaling == ("row" if scaling == "row" else "group" if grouped else "tensor")
    assert plan_of_key(p.key, grouped) == p


@pytest.mark.parametrize("knobs, resolved", [(dict(backward="high_precision"), ""),
                                             (dict(backward="dequantized"), ""),
                                             (dict(activation_scaling="row"), r" \(resolved to 'high_precision'\)")])
def test_wgrad_rht_needs_the_quantized_backward(knobs, resolved):
    with pytest.raises(ValueError, match=rf"FourOverSixRecipe.wgrad_rht=True .*FourOverSixRecipe.backward="
                                         rf"'\w+'{resolved} quantizes no gradient"):
        FourOverSixRecipe(wgrad_rht=True, **knobs)
    with pytest.raises(ValueError, match=r"wgrad_rht=True .*backward='auto' \(resolved to 'high_precision'\) "
                                         r"quantizes no gradient of grouped GEMMs"):
        FourOverSixRecipe(wgrad_rht=True).plan(grouped=True)  # auto: high_precision for routed experts
    with pytest.raises(ValueError, match=r"wgrad_rht=1 is not supported; valid values: False, True"):
        FourOverSixRecipe(wgrad_rht=1)


# ---- the dense op ----

def _grads(x, w, dy, recipe):
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    four_over_six_mm(x, w, recipe=recipe).backward(dy)
    return x.grad, w.grad


def _data(m, k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) * 0.1).bfloat16(),
            torch.randn(m, n, generator=g).bfloat16())


def test_rht_leaves_the_wgrad_product_unchanged_without_quantization():
    """H is orthogonal and applied to both operands along the reduction dim: (H dy)^T (H x) = dy^T x in FP32."""
    x, _, dy = _data(100)
    x, dy = x.float(), dy.float()
    rotated = rht16_columns_reference(dy).t() @ rht16_columns_reference(x)
    plain = dy.t() @ x
    assert torch.allclose(rotated, plain, rtol=1e-5, atol=1e-4 * plain.abs().max().item())


@pytest.mark.parametrize("m", [100, 128])
def test_dense_quantized_backward_with_wgrad_rht(m):
    x, w, dy = _data(m)
    dx0, dw0 = _grads(x, w, dy, FourOverSixRecipe(backward="quantized"))
    dx1, dw1 = _grads(x, w, dy, FourOverSixRecipe(backward="quantized", wgrad_rht=True))
    exact = dy.float().t() @ x.float()
    assert torch.isfinite(dw1.float()).all() and dw1.dtype == w.dtype
    assert torch.nn.functional.cosine_similarity(dw1.float().flatten(), exact.flatten(), dim=0) > 0.98
    assert not torch.equal(dw0, dw1)
    assert torch.equal(dx0, dx1)  # dgrad does not use the transform


def test_wgrad_rht_is_the_plain_backward_of_the_transformed_operands():
    """wgrad with RHT on (x, dy) is, byte for byte, the untransformed quantized wgrad of (H x, H dy): the amaxes are
    then the transformed tensors' own, as the spec says (an independent route through the unchanged code path)."""
    x, w, dy = _data(72)
    _, dw_rht = _grads(x, w, dy, FourOverSixRecipe(backward="quantized", wgrad_rht=True))
    _, dw_plain = _grads(rht16_columns_reference(x), w, rht16_columns_reference(dy),
                         FourOverSixRecipe(backward="quantized"))
    assert torch.equal(dw_rht, dw_plain)


def test_zero_tokens_with_wgrad_rht():
    x, w, dy = _data(0)
    dx, dw = _grads(x, w, dy, FourOverSixRecipe(backward="quantized", wgrad_rht=True))
    assert dx.shape == (0, 64) and torch.equal(dw, torch.zeros_like(dw))


# ---- config ----

def test_toml_knob_loads_and_validates(tmp_path):
    pytest.importorskip("torchtitan")
    from tests.helpers.integration_helpers import CONFIG_MODULE
    from torchtitan.config.manager import ConfigManager

    def load(section_lines: str, converters: str = '"quantize.linear.four_over_six"'):
        toml = tmp_path / "recipe.toml"
        toml.write_text(f'[job]\ncustom_config_module = "{CONFIG_MODULE}"\n[model]\nconverters = [{converters}]\n'
                        f"{section_lines}\n")
        return ConfigManager().parse_args(["--job.config_file", str(toml)])

    from tests.helpers.integration_helpers import job_config

    assert job_config("--quantize.linear.four_over_six.wgrad_rht").quantize.linear.four_over_six.wgrad_rht is True
    job = load("[quantize.linear.four_over_six]\nwgrad_rht = true")
    section = job.quantize.linear.four_over_six
    assert section.wgrad_rht is True and section.recipe() == FourOverSixRecipe(backward="quantized", wgrad_rht=True)
    assert job.quantize.grouped_mm.four_over_six.wgrad_rht is False
    lin = "quantize.linear.four_over_six"
    with pytest.raises(ValueError, match=rf"\[{lin}\] {lin}.wgrad_rht=True .*{lin}.backward='dequantized'"):
        load("[quantize.linear.four_over_six]\nwgrad_rht = true\nbackward = \"dequantized\"")
    with pytest.raises(ValueError, match=rf"{lin}.wgrad_rht=1 is not supported.*type bool; got int"):
        load("[quantize.linear.four_over_six]\nwgrad_rht = 1")
    gmm = "quantize.grouped_mm.four_over_six"
    with pytest.raises(ValueError, match=rf"\[{gmm}\] {gmm}.wgrad_rht=True .*{gmm}.backward='auto' "
                                         r"\(resolved to 'high_precision'\) quantizes no gradient of grouped GEMMs"):
        load("[quantize.grouped_mm.four_over_six]\nwgrad_rht = true", f'"{gmm}"')
    grouped = load('[quantize.grouped_mm.four_over_six]\nwgrad_rht = true\nbackward = "quantized"', f'"{gmm}"')
    assert grouped.quantize.grouped_mm.four_over_six.recipe() == FourOverSixRecipe(backward="quantized",
                                                                                  wgrad_rht=True)


# ---- GPU (skipped without CUDA) ----

@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_kernel_matches_reference(dtype):
    """The transform, and the pass taking both amaxes with it, against the reference on the GPU."""
    from titan_fp4six.kernels.hadamard import rht16_columns, rht16_columns_amax
    from titan_fp4six.numerics.reference import tensor_amax_reference

    g = torch.Generator().manual_seed(11)
    cases = [torch.randn(m, k, generator=g).to(dtype) for m, k in ((1, 16), (17, 48), (4096, 1024), (1000, 7168))]
    cases += [edge_matrix(dtype, g), (torch.randn(300, 512, generator=g) * 1e3).to(dtype)[:, 128:384]]
    for x in cases:
        got = rht16_columns(x.cuda()).cpu()
        assert same_bits(got, rht16_columns_reference(x))
        fused, amax = rht16_columns_amax(x.cuda())
        assert same_bits(fused.cpu(), got)
        assert same_bits(amax.cpu(), torch.stack((tensor_amax_reference(got), tensor_amax_reference(x))))
        assert same_bits(rht16_columns_reference(x.cuda()).cpu(), rht16_columns_reference(x))


@cuda
def test_gpu_token_block_kernel_matches_reference():
    """The transform reading the grouped wgrad's token blocks in place against the transform of the gathered
    layout, and its per-group amaxes (transformed, untransformed) against the token groups': empty, short and
    long groups, NaN past offs[-1], realistic sizes."""
    from titan_fp4six.kernels.hadamard import rht16_token_blocks_amax
    from titan_fp4six.numerics.groups import TokenBlocks
    from titan_fp4six.quant.amax import token_groups_amax_reference

    g = torch.Generator().manual_seed(12)
    for ends, (m, k) in (([0, 12, 12, 30, 47], (50, 48)), ([1000, 1000, 3001, 4000], (4096, 2048))):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(m, k, generator=g).to(dtype)
            x[ends[-1]:] = float("nan")
            blocks = TokenBlocks.of(torch.tensor(ends, dtype=torch.int32), m)
            want = rht16_columns_reference(blocks.gather(x))
            got, amax = rht16_token_blocks_amax(x.cuda(), TokenBlocks.of(torch.tensor(ends, dtype=torch.int32).cuda(),
                                                                         m))
            assert same_bits(got.cpu(), want)
            offs = torch.tensor(ends, dtype=torch.int32)
            assert same_bits(amax.cpu(), torch.stack((token_groups_amax_reference(want, blocks.ends),
                                                      token_groups_amax_reference(x, offs))))


@cuda
@pytest.mark.parametrize("name", REALISTIC)
def test_gpu_kernel_equals_transformer_engine_formula_on_the_gpu(name):
    """TE's formula with cuBLAS's bf16 matmul on the GPU against the kernel: bitwise on exact blocks, and on these
    distributions on all but a rare element (on the CPU: none)."""
    from titan_fp4six.kernels.hadamard import rht16_columns

    x = realistic(name, 1 << 20, torch.Generator().manual_seed(13)).bfloat16().view(-1, 1024).cuda()
    got, want = rht16_columns(x).cpu(), te_rht_columns(x).cpu()
    exact = exact_blocks(x.cpu().t().contiguous().view(-1, 16)).view(1024, -1).t().repeat_interleave(16, 0)
    assert same_bits(got[exact], want[exact])
    assert (got.view(torch.int16) != want.view(torch.int16)).float().mean() < 1e-4


@cuda
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_gpu_grouped_op_triton_equals_reference(scaling):
    """The grouped quantized backward with wgrad_rht on an H200-sized case: the Triton transform, amaxes and
    quantizers against the reference ones on the same device (same GEMMs): dA and dW bitwise."""
    from titan_fp4six import four_over_six_grouped_mm

    g = torch.Generator().manual_seed(14)
    offs = torch.tensor([0, 300, 300, 1111, 2000, 2048, 2048, 3001], dtype=torch.int32).cuda()
    A, dy = torch.randn(3072, 512, generator=g).bfloat16().cuda(), torch.randn(3072, 256, generator=g).bfloat16().cuda()
    W = (torch.randn(8, 256, 512, generator=g) * 0.05).bfloat16().cuda()
    grads = []
    for q in ("triton", "reference"):
        recipe = FourOverSixRecipe(backward="quantized", activation_scaling=scaling, wgrad_rht=True, quantizer=q)
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        four_over_six_grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe).backward(dy)
        grads.append((a.grad, w.grad))
    assert all(torch.equal(t, r) for t, r in zip(*grads))


@cuda
def test_gpu_dense_op_triton_equals_reference():
    x, w, dy = (t.cuda() for t in _data(1000, 256, 128, seed=4))
    grads = [_grads(x, w, dy, FourOverSixRecipe(backward="quantized", wgrad_rht=True, quantizer=q))
             for q in ("triton", "reference")]
    assert torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][0], grads[1][0])


def test_fidelity_metrics_of_a_wgrad_rht_recipe():
    """The per-GEMM metrics run every backward mode (wgrad_rht only with the quantized one) and measure x^T and
    dy^T in the transformed domain, with the transformed tensors' own amaxes."""
    from titan_fp4six.modules import fidelity as fid

    x, w, dy = (t.float() for t in _data(64, 64, 32, seed=8))
    recipe = FourOverSixRecipe(backward="quantized", wgrad_rht=True)
    metrics = fid.gemm_fidelity(fid.GemmCase("c", x, w, dy, recipe))
    assert metrics["quantized_dw_cos/four_over_six"] > 0.98
    plain = fid.operand_errors(fid.GemmCase("c", x, w, dy, FourOverSixRecipe()), FourOverSixRecipe())
    rotated = fid.operand_errors(fid.GemmCase("c", x, w, dy, recipe), recipe)
    assert rotated["mse_x"] == plain["mse_x"] and rotated["mse_xT"] != plain["mse_xT"]
    assert 0 < rotated["mse_xT"] < 0.05 and 0 < rotated["mse_dyT"] < 0.05


def test_compiled_equals_eager_with_wgrad_rht():
    """The transform runs inside the dense backward's custom op: torch.compile(fullgraph=True) gives eager's bytes."""
    from titan_fp4six import four_over_six_linear

    recipe = FourOverSixRecipe(wgrad_rht=True)
    x, w, dy = _data(40, seed=9)

    def step(fn):
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xl, wl).backward(dy)
        return xl.grad, wl.grad

    def f(a, b):
        return four_over_six_linear(a, b, recipe=recipe)

    torch._dynamo.reset()
    eager, compiled = step(f), step(torch.compile(f, fullgraph=True))
    assert all(torch.equal(e, c) for e, c in zip(eager, compiled))


def test_wgrad_rht_false_keeps_the_untransformed_bytes():
    """wgrad_rht=False: dW is the columnwise NVFP4 dy^T (dy's amax) times the columnwise 4/6 x^T (the forward's
    amax), the quantized backward as it was before the knob existed."""
    from titan_fp4six.quant.backends import backends_for
    from titan_fp4six.ops.gemm import gemm_nt
    from titan_fp4six.quant.operands import RoleQuantizer

    x, w, dy = _data(72, seed=10)
    recipe = FourOverSixRecipe(backward="quantized")
    _, dw = _grads(x, w, dy, recipe)
    p, b = recipe.plan(grouped=False), backends_for("auto", "auto", x.device)
    dy_amax, x_amax = dy.abs().amax().float(), x.abs().amax().float()
    dy_t, x_t = RoleQuantizer(NVFP4, b).columns(dy, dy_amax)[0], RoleQuantizer(p.x, b).columns(x, x_amax)[0]
    want = gemm_nt(dy_t, dy_amax, 448, x_t, x_amax, p.x.scale_bound, w.dtype, b)
    assert torch.equal(dw, want)


def test_a_small_mlp_trains_with_wgrad_rht():
    """quantize_ with FourOverSixTrainingConfig(wgrad_rht=True): the loss falls as with wgrad_rht=False."""
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    from titan_fp4six import FourOverSixTrainingConfig, quantizable_linear

    g = torch.Generator().manual_seed(12)
    data, target_w = torch.randn(256, 64, generator=g), torch.randn(64, 32, generator=g) / 8
    targets = data @ target_w
    losses = {}
    for rht in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        quantize_(model, FourOverSixTrainingConfig(backward="quantized", wgrad_rht=rht), filter_fn=quantizable_linear)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(40):
            loss = torch.nn.functional.mse_loss(model(data), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[rht] = loss.item()
    assert losses[True] < 0.3 * targets.pow(2).mean().item()
    assert losses[True] == pytest.approx(losses[False], rel=0.3)


def test_blocks_never_straddle_rows():
    with pytest.raises(ValueError, match=r"rht16_blocks: x of shape \(16, 20\); its last dim must be a multiple of 16"):
        rht16_blocks(torch.randn(16, 20))
