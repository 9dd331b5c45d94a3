"""The Blackwell (SM100) NVFP4 GEMM path: scale swizzling, argument building and the strict gate on CPU; the
row-scaled GEMMs through a CPU emulation of F.scaled_mm / F.scaled_grouped_mm semantics, bitwise against a
rounding-emulated loop oracle; the real kernels against the emulation only on a compute-capability-10 GPU."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm
from titan_fp4six.numerics.reference import global_decode_factor
from titan_fp4six.ops import blackwell
from titan_fp4six.quant import backends
from titan_fp4six.quant.backends import EMULATE_ENV, resolve_backends
from titan_fp4six.quant.operands import Operand, gemm_quantizers


def _scales(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 127, shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)


def _swizzled_position(r, c, cols):
    """cuBLAS block-scaling layout: 128x4 tiles row-tile-major; (r, c) inside a tile at (r%32)*16 + (r//32%4)*4 + c%4."""
    col_tiles = -(-cols // 4)
    return ((r // 128) * col_tiles + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


@pytest.mark.parametrize("rows, cols", [(200, 6), (128, 4), (16, 1)])
def test_swizzle_matches_the_documented_layout(rows, cols):
    s = _scales(2, rows, cols)
    out = blackwell.swizzle_scales(s).view(torch.uint8)
    rows_p, cols_p = -(-rows // 128) * 128, -(-cols // 4) * 4
    assert out.shape == (2, rows_p * cols_p) and out.is_contiguous()
    expected = torch.zeros(2, rows_p * cols_p, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            expected[:, _swizzled_position(r, c, cols)] = s.view(torch.uint8)[:, r, c]
    assert torch.equal(out, expected)


def test_group_rows_start_on_128_row_boundaries():
    offs = torch.tensor([3, 3, 200, 250], dtype=torch.int32)
    dest, total = blackwell.group_padded_rows(offs, 260)
    assert total == 384 + 4 * 128  # round_up(rows, 128) + one tile per group: a bound, no sync
    expected = list(range(3)) + list(range(128, 128 + 197)) + list(range(384, 434)) + [total] * 10
    assert dest.tolist() == expected


def _operand(rows, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Operand(torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8), _scales(rows, k // 16))


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        return v.to("meta")
    return [_to_meta(t) for t in v] if isinstance(v, list) else v


def test_dense_arguments_pass_torch_checks():
    a, b = _operand(200), _operand(48, seed=1)
    args = blackwell.dense_args(a, torch.tensor(0.5), b, torch.tensor(0.25), torch.bfloat16)
    assert args["mat_a"].dtype == torch.float4_e2m1fn_x2 and args["mat_b"].shape == (32, 48)
    assert args["mat_b"].stride() == (1, 32)  # column-major (K, N) as cuBLAS takes it
    assert args["scale_a"][0].numel() == 256 * 4 and args["scale_b"][0].numel() == 128 * 4
    assert args["scale_recipe_a"] == [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
    out = F.scaled_mm(**{k: _to_meta(v) for k, v in args.items()})  # torch's own shape/recipe checks
    assert out.shape == (200, 48) and out.dtype == torch.bfloat16


def test_grouped_arguments():
    offs = torch.tensor([3, 3, 150, 190], dtype=torch.int32)
    a, w = _operand(200), _operand(4 * 48, seed=1)
    a_factor, w_factor = torch.rand(4), torch.rand(4)
    args = blackwell.grouped_args(a, a_factor, w, w_factor, offs, 4, torch.bfloat16)
    assert args["mat_b"].shape == (4, 32, 48) and args["mat_b"].dtype == torch.float4_e2m1fn_x2
    assert args["scale_b"][0].shape == (4, 128 * 4)  # (G, round_up(N,128) * round_up(K/16,4)) per expert
    scale_a = args["scale_a"][0]
    assert scale_a.shape == (256 + 4 * 128, 4) and scale_a.shape[0] >= 200
    # group 2's first row (row 3) lands on padded row 128, i.e. the start of the second 128-row tile
    flat = scale_a.view(torch.uint8).reshape(-1)
    assert torch.equal(flat[_swizzled_position(128, 0, 4) + torch.arange(4)], a.scales.view(torch.uint8)[3])
    assert args["scale_a"][1] is a_factor and args["scale_b"][1] is w_factor and args["offs"] is offs


@pytest.mark.parametrize("major, expected", [(9, False), (10, True), (12, False)])
def test_gate_is_strictly_major_10(monkeypatch, major, expected):
    """gemm='auto' takes the real kernels only on major 10; 'emulated' and TITAN_FP4SIX_EMULATE=1 never do;
    'fp4' where they cannot run is an error naming the knob."""
    monkeypatch.setattr(backends, "_capability_major", lambda device: major)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    cuda = torch.device("cuda", 0)

    def fp4_gemms(device, gemm):
        return resolve_backends("reference", gemm, device).fp4

    assert backends.fp4_available(cuda) is expected and fp4_gemms(cuda, "auto") is expected
    assert not backends.fp4_available(torch.device("cpu")) and not fp4_gemms(torch.device("cpu"), "auto")
    assert not fp4_gemms(cuda, "emulated")
    if expected:
        assert fp4_gemms(cuda, "fp4")
    else:
        with pytest.raises(ValueError, match="gemm='fp4' needs a Blackwell GPU"):
            fp4_gemms(cuda, "fp4")
    monkeypatch.setenv(EMULATE_ENV, "1")
    assert not fp4_gemms(cuda, "auto") and not fp4_gemms(cuda, "fp4")
    monkeypatch.setenv(EMULATE_ENV, "0")
    assert fp4_gemms(cuda, "auto") is expected


@pytest.mark.parametrize("value", ["true", "yes", "2"])
def test_an_emulate_override_other_than_1_or_0_is_an_error(monkeypatch, value):
    """It used to be ignored unless exactly "1": TITAN_FP4SIX_EMULATE=true ran the real kernels."""
    monkeypatch.setenv(EMULATE_ENV, value)
    with pytest.raises(ValueError, match=rf"TITAN_FP4SIX_EMULATE='{value}' is not supported; valid values: '1'"):
        resolve_backends("reference", "auto", torch.device("cpu"))


def _sm100():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


@pytest.mark.sm100
@pytest.mark.skipif(not _sm100(), reason="needs a Blackwell (compute capability 10.x) GPU")
@pytest.mark.parametrize("recipe, rtol", [
    (FourOverSixRecipe(), 2 ** -7),
    # row-scaled: the kernels' bf16 output times the row amaxes, one more bf16 rounding than the emulation
    (FourOverSixRecipe(activation_scaling="row", weight_block="1x16", backward="high_precision"), 2 ** -6),
])
def test_blackwell_kernels_match_emulation(recipe, rtol):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 512, device="cuda", generator=g).bfloat16()
    w = torch.randn(4, 256, 512, device="cuda", generator=g).bfloat16()
    offs = torch.tensor([64, 64, 200, 250], dtype=torch.int32, device="cuda")
    real, emulated = ((four_over_six_mm(x, w[0], recipe=r), four_over_six_grouped_mm(x, w.transpose(-2, -1), offs,
                                                                                    recipe=r))
                      for r in (dataclasses.replace(recipe, gemm="fp4"), dataclasses.replace(recipe, gemm="emulated")))
    for r, e in zip(real, emulated):
        torch.testing.assert_close(r, e, rtol=rtol, atol=1e-3)


# --- Row-scaled GEMMs, on CPU: F.scaled_mm / F.scaled_grouped_mm replaced by an emulation of their semantics ---

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _unswizzle(flat, rows, cols):
    """Plain (rows, cols) E4M3 scales read out of one matrix in cuBLAS's 128x4 block-scaling layout."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return flat.view(torch.uint8).reshape(-1)[_swizzled_position(r, c, cols)].view(torch.float8_e4m3fn)


def _decode(fp4, scales):
    """(R, K/2) float4_e2m1fn_x2 (even element in the low nibble) x (R, K/16) E4M3 -> (R, K) float64, exact."""
    u = fp4.view(torch.uint8).long()
    nib = torch.stack([u & 15, u >> 4], dim=-1).reshape(u.shape[0], -1)
    vals = _E2M1[nib & 7].double() * (1 - 2 * (nib >> 3)).double()
    return vals * scales.double().repeat_interleave(16, dim=1)


def _emulated_scaled_mm(mat_a, mat_b, scale_a, scale_b, output_dtype, **recipes):
    """F.scaled_mm for NVFP4 operands: block scales unswizzled, FP32 accumulation, both global scales after."""
    (m, half_k), n = mat_a.shape, mat_b.shape[1]
    a = _decode(mat_a, _unswizzle(scale_a[0], m, half_k // 8)).float()
    b = _decode(mat_b.t(), _unswizzle(scale_b[0], n, half_k // 8)).float()
    return (torch.mm(a, b.t()) * (scale_a[1] * scale_b[1])).to(output_dtype)


def _emulated_scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs, output_dtype, **recipes):
    """F.scaled_grouped_mm (2-D A, 3-D B): group g's scale rows start at the sum of the earlier groups' row counts
    rounded up to 128; per-group global scales; rows past offs[-1] are left undefined (NaN here)."""
    (m, half_k), (experts, _, n) = mat_a.shape, mat_b.shape
    k16 = half_k // 8
    a_scales = _unswizzle(scale_a[0], scale_a[0].shape[0], k16)
    out = torch.full((m, n), float("nan"), dtype=output_dtype)
    start = padded = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            a = _decode(mat_a[start:end], a_scales[padded:padded + end - start]).float()
            w = _decode(mat_b[g].t(), _unswizzle(scale_b[0][g], n, k16)).float()
            out[start:end] = (torch.mm(a, w.t()) * (scale_a[1][g] * scale_b[1][g])).to(output_dtype)
        padded += -(-(end - start) // 128) * 128
        start = end
    return out


def _exact_operand(rows, k, seed):
    """Random codes with power-of-two block scales in [1/4, 4]: every product and every K<=64 partial sum is exact
    in FP32, so any accumulation order gives the same FP32 value (a loop oracle can be compared bitwise)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    scales = ((torch.randint(-2, 3, (rows, k // 16), generator=g) + 7) * 8).to(torch.uint8).view(torch.float8_e4m3fn)
    return Operand(codes, scales)


def _bf16(v):
    return torch.as_tensor(v, dtype=torch.float32).to(torch.bfloat16).float()


def _row_oracle(a, b_rows_of, const, b_factor_of, row_amax, rows):
    """Loop oracle of the row-scaled kernels: per row, the exact dot products, times fl(const * b_factor) in FP32
    rounded to bf16 (the kernel's output), times the row's amax in FP32 rounded to bf16 again."""
    out = torch.zeros(rows, b_rows_of(0).shape[0])
    a_dec = _decode(a.codes, a.scales)
    for r in range(rows):
        acc = (b_rows_of(r) @ a_dec[r]).float()  # exact
        alpha = const * b_factor_of(r)  # FP32 product, as the kernel forms it
        out[r] = _bf16(_bf16(acc * alpha) * row_amax[r])
    return out.to(torch.bfloat16)


@pytest.fixture
def on_blackwell(monkeypatch):
    """The Blackwell dispatch with F.scaled_mm / F.scaled_grouped_mm emulated on CPU (the stored backends are
    resolved again under the patch and after it)."""
    monkeypatch.setattr(backends, "fp4_available", lambda device: True)
    monkeypatch.setattr(F, "scaled_mm", _emulated_scaled_mm)
    monkeypatch.setattr(F, "scaled_grouped_mm", _emulated_scaled_grouped_mm)
    _forget_resolved()
    yield
    _forget_resolved()


def _forget_resolved():
    backends.backends_for.cache_clear()
    gemm_quantizers.cache_clear()


def test_emulated_scaled_mm_is_the_exact_nvfp4_gemm():
    """The emulation itself against the plain decode (so the oracle comparisons below test the ops, not it)."""
    a, b = _exact_operand(40, 64, 0), _exact_operand(24, 64, 1)
    fa, fb = torch.tensor(0.75), torch.tensor(0.3)
    out = _emulated_scaled_mm(**blackwell.dense_args(a, fa, b, fb, torch.bfloat16))
    ref = (_decode(a.codes, a.scales) @ _decode(b.codes, b.scales).t()).float() * (fa * fb)
    assert torch.equal(out, ref.to(torch.bfloat16))


def test_dense_row_scaled_equals_rounding_oracle(on_blackwell):
    from titan_fp4six.ops.gemm import gemm_nt, row_split
    a, b = _exact_operand(40, 64, 2), _exact_operand(24, 64, 3)
    amax = torch.rand(40, generator=torch.Generator().manual_seed(4)) * 10
    const, _ = row_split(amax, 256)
    b_amax = torch.tensor(18.9)
    b_factor = global_decode_factor(b_amax, 256)
    out = gemm_nt(a, amax, 256, b, b_amax, 256, torch.bfloat16, backends.backends_for("auto", "auto", a.codes.device))
    b_dec = _decode(b.codes, b.scales)
    expected = _row_oracle(a, lambda r: b_dec, const, lambda r: b_factor, amax, 40)
    assert torch.equal(out, expected)
    assert out.dtype == torch.bfloat16 and not torch.equal(out, _row_oracle(a, lambda r: b_dec, const * 1.01,
                                                                            lambda r: b_factor, amax, 40))


def test_grouped_row_scaled_equals_rounding_oracle(on_blackwell):
    from titan_fp4six.quant.amax import group_index
    from titan_fp4six.ops.gemm import grouped_gemm_nt, row_split
    experts, n, rows = 4, 32, 300
    offs = torch.tensor([3, 3, 200, 290], dtype=torch.int32)
    a, w = _exact_operand(rows, 64, 5), _exact_operand(experts * n, 64, 6)
    group_of_row = group_index(offs, rows)
    amax = torch.where(group_of_row < experts, torch.rand(rows, generator=torch.Generator().manual_seed(7)) * 5, 0.0)
    w_amax = torch.rand(experts, generator=torch.Generator().manual_seed(8)) * 20
    w_factor = global_decode_factor(w_amax, 448)
    split = row_split(amax, 448)
    out = grouped_gemm_nt(a, amax, False, w, w_amax, offs, group_of_row, 448, torch.bfloat16,
                          backends.backends_for("auto", "auto", a.codes.device))
    w_dec = _decode(w.codes, w.scales).view(experts, n, 64)
    g = group_of_row.clamp(max=experts - 1)
    expected = _row_oracle(a, lambda r: w_dec[g[r]], split[0], lambda r: w_factor[g[r]], amax, rows)
    expected[290:] = 0  # rows past offs[-1]: zeros (the kernel leaves them undefined: NaN in the emulation)
    assert torch.equal(out, expected)


def test_row_scaled_ops_on_blackwell_stay_within_the_rounding_bound_of_the_emulation(on_blackwell):
    """Whole row-scaled ops (real quantizers): the Blackwell form differs from the emulated path only by the extra
    bf16 rounding (dense: one; grouped: the emulation rounds the product to bf16 too)."""
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(300, 64, generator=g).bfloat16(), torch.randn(4, 32, 64, generator=g).bfloat16()
    offs = torch.tensor([64, 64, 200, 290], dtype=torch.int32)
    recipe = FourOverSixRecipe(activation_scaling="row", weight_block="1x16", backward="high_precision")

    def run(r):
        return four_over_six_mm(x, w[0], recipe=r), four_over_six_grouped_mm(x, w.transpose(-2, -1), offs, recipe=r)
    emulated = run(dataclasses.replace(recipe, gemm="emulated"))
    real = run(recipe)
    for r, e, rtol in zip(real, emulated, (2 ** -7, 2 ** -6)):
        assert r.dtype == e.dtype == torch.bfloat16 and torch.isfinite(r).all()
        d = (r.float() - e.float()).abs()
        assert (d <= rtol * e.float().abs() + 1e-6).all(), d.max()
        assert not torch.equal(r, e)  # the extra rounding is really there


@pytest.mark.parametrize("recipe", [
    FourOverSixRecipe(backward="quantized"),
    FourOverSixRecipe(backward="quantized", weight_block="1x16", activation_scaling="row"),
], ids=str)
def test_quantized_backward_on_blackwell(on_blackwell, recipe):
    """The quantized backward through the Blackwell dispatch (F.scaled_mm / scaled_grouped_mm emulated): the
    grouped dgrad runs scaled_grouped_mm on dy (one factor per group, B=448) and W^T (per expert: the forward's
    16x16 tiles transposed, or 1x16 re-quantized), within the rounding bound of the emulated path; the grouped
    wgrad (contraction over each group's tokens) is the emulation's on every device: bitwise equal. The dense
    wgrad of row-scaled x puts x^T's per-row factor on the row-scaled kernels' side (their extra rounding)."""
    g = torch.Generator().manual_seed(10)
    x, w = torch.randn(300, 64, generator=g).bfloat16(), (torch.randn(4, 32, 64, generator=g) * 0.1).bfloat16()
    dy = torch.randn(300, 32, generator=g).bfloat16()
    offs = torch.tensor([64, 64, 200, 290], dtype=torch.int32)
    calls = []
    grouped_mm = F.scaled_grouped_mm

    def run(r):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        four_over_six_grouped_mm(xs, ws.transpose(-2, -1), offs, recipe=r).backward(dy)
        xd, wd = x.clone().requires_grad_(), w[0].clone().requires_grad_()
        four_over_six_mm(xd, wd, recipe=r).backward(dy)
        return xs.grad, ws.grad, xd.grad, wd.grad

    emulated = run(dataclasses.replace(recipe, gemm="emulated"))
    F.scaled_grouped_mm = lambda **kw: calls.append(kw["mat_b"].shape) or grouped_mm(**kw)
    try:
        real = run(recipe)
    finally:
        F.scaled_grouped_mm = grouped_mm
    assert calls == [(4, 32, 32), (4, 16, 64)]  # (E, contraction/2, outputs): the forward's, the dgrad's
    assert torch.equal(real[1], emulated[1])  # grouped wgrad: always emulated
    assert not real[0][290:].any()
    for r, e in zip(real, emulated):
        assert torch.isfinite(r).all()
        d = (r.float() - e.float()).abs()
        assert (d <= 2 ** -6 * e.float().abs() + 1e-6).all(), d.max()
