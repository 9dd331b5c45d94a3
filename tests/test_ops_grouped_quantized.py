"""The quantized backward of grouped (MoE) GEMMs and of row-scaled activations: dA / dW (dx / dW) bitwise equal
to the reference composition of tests/helpers/backward_oracle.py on CPU (token layouts with empty groups and
padded tails, both weight blocks, per-tensor and row-scaled activations, scope all / none, wgrad_rht off and on),
on CUDA bitwise equal to CPU, and compiled equal to eager."""

from dataclasses import replace

import pytest
import torch

from tests.helpers.backward_oracle import dense_backward, grouped_backward, narrow_data
from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from titan_fp4six.numerics.hadamard import rht16_columns_reference

K = 64
LAYOUTS = {  # (rows of A, inclusive group ends)
    "empty_group_and_tail": (70, [10, 10, 41, 60]),
    "leading_empty_groups": (48, [0, 0, 20, 48]),
    "aligned": (64, [16, 32, 48, 64]),
    "one_group_with_tail": (40, [0, 33, 33, 33]),
}
RECIPES = [FourOverSixRecipe(backward="quantized", weight_block=wb, activation_scaling=s, scope=scope)
           for wb in ("16x16", "1x16") for s in ("tensor", "row") for scope in ("all", "none")]
RHT_RECIPES = [replace(r, wgrad_rht=True) for r in RECIPES]


def _grouped_inputs(rows, offs, n, seed, tail=float("nan"), k=K):
    """Token groups of different magnitudes (per-group constants, rows within 10% of each other), experts of
    different magnitudes; rows past offs[-1] hold `tail` in A and dy (they must never be read)."""
    experts = len(offs)
    g = torch.Generator().manual_seed(seed)
    group = torch.searchsorted(torch.tensor(offs), torch.arange(rows), right=True).clamp(max=experts - 1)
    group_scale = torch.exp2(torch.randint(-3, 4, (experts,), generator=g).float())[group]
    row_scale = (group_scale * (0.9 + 0.1 * torch.rand(rows, generator=g)))[:, None]
    A = narrow_data((rows, k), seed, row_scale)
    dy = narrow_data((rows, n), seed + 1, group_scale[:, None] * 1e-3)
    W = narrow_data((experts, n, k), seed + 2, torch.exp2(torch.randint(-4, 0, (experts, 1, 1), generator=g).float()))
    A[offs[-1]:] = tail
    dy[offs[-1]:] = tail
    return A, W, torch.tensor(offs, dtype=torch.int32), dy


def _grouped_grads(A, W, offs, dy, recipe):
    A = A.clone().requires_grad_()
    W = W.clone().requires_grad_()
    four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=recipe).backward(dy)
    return A.grad, W.grad


def _assert_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), f"{(got.float() - want.float()).abs().max().item():.3g} max difference"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("recipe", RECIPES + RHT_RECIPES, ids=str)
def test_grouped_equals_reference_composition(layout, recipe):
    rows, offs = LAYOUTS[layout]
    A, W, offs_t, dy = _grouped_inputs(rows, offs, 32, seed=len(layout))
    dA, dW = _grouped_grads(A, W, offs_t, dy, recipe)
    want_dA, want_dW = grouped_backward(A, W, offs_t, dy, recipe)
    _assert_equal(dA, want_dA)
    _assert_equal(dW, want_dW)
    assert not dA[offs[-1]:].any()  # rows past offs[-1]: zero gradient, whatever they hold (NaN here)
    for e, (s, t) in enumerate(zip([0] + offs[:-1], offs)):
        assert dW[e].any() == (s < t)  # empty groups: zero weight gradient


def test_grouped_1x16_weights_with_n_not_a_multiple_of_16():
    """1x16 expert weights take any N: dy and W^T are zero-padded along N for the dgrad's blocks."""
    recipe = FourOverSixRecipe(backward="quantized", weight_block="1x16")
    A, W, offs, dy = _grouped_inputs(70, [10, 10, 41, 60], 24, seed=5)
    dA, dW = _grouped_grads(A, W, offs, dy, recipe)
    want_dA, want_dW = grouped_backward(A, W, offs, dy, recipe)
    _assert_equal(dA, want_dA)
    _assert_equal(dW, want_dW)


def test_grouped_row_scaled_wgrad_uses_the_column_amax():
    """Row-scaled A: x^T's amax is the group's column amax (TransformerEngine's row-scaled NVFP4), not the
    group's: on data with one dominant column the two differ, and the op follows the former."""
    tensor, row = (FourOverSixRecipe(backward="quantized", activation_scaling=s) for s in ("tensor", "row"))
    A, W, offs, dy = _grouped_inputs(64, [16, 32, 48, 64], 32, seed=6)
    A[:, 3] *= 64
    dA_t, dW_t = _grouped_grads(A, W, offs, dy, tensor)
    dA_r, dW_r = _grouped_grads(A, W, offs, dy, row)
    assert torch.equal(dA_t, dA_r)  # the dgrad does not read A
    assert not torch.equal(dW_t, dW_r)
    _assert_equal(dW_r, grouped_backward(A, W, offs, dy, row)[1])


def _dense_inputs(seed, m=37, n=48):
    g = torch.Generator().manual_seed(seed)
    x = narrow_data((m, K), seed, 4.0)
    x[:, 5] *= 16  # a dominant column: the row-scaled x^T's column amaxes differ from the tensor's
    w = narrow_data((n, K), seed + 1, 0.1)
    dy = narrow_data((m, n), seed + 2, torch.exp2(torch.randint(-2, 1, (1,), generator=g).float()))
    return x, w, dy


@pytest.mark.parametrize("recipe", RECIPES + RHT_RECIPES, ids=str)
def test_dense_equals_reference_composition(recipe):
    x, w, dy = _dense_inputs(7)  # 37 tokens: the columnwise blocks need zero padding
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    four_over_six_linear(xg, wg, recipe=recipe).backward(dy)
    want_dx, want_dw = dense_backward(x, w, dy, recipe)
    _assert_equal(xg.grad, want_dx)
    _assert_equal(wg.grad, want_dw)


@pytest.mark.parametrize("recipe", RECIPES[::3] + RHT_RECIPES[::3], ids=str)
def test_grouped_zero_tokens(recipe):
    """No tokens at all (every group empty): dA (0, K), dW zeros."""
    A = torch.zeros(0, K, dtype=torch.bfloat16, requires_grad=True)
    W = narrow_data((4, 32, K), 0).requires_grad_()
    four_over_six_grouped_mm(A, W.transpose(-2, -1), torch.zeros(4, dtype=torch.int32), recipe=recipe).sum().backward()
    assert A.grad.shape == (0, K) and W.grad.shape == W.shape and not W.grad.any()


@pytest.mark.parametrize("wgrad_rht", [False, True])
def test_grouped_compiled_equals_eager(wgrad_rht):
    """torch.compile(fullgraph=True) of the grouped op with the quantized backward: the eager bytes."""
    torch._dynamo.reset()
    recipe = FourOverSixRecipe(backward="quantized", activation_scaling="row", weight_block="1x16",
                               wgrad_rht=wgrad_rht)
    A, W, offs, dy = _grouped_inputs(70, [10, 10, 41, 60], 32, seed=8, tail=0.0)

    def fn(a, w):
        return four_over_six_grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe)

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        out = f(a, w)
        out.backward(dy)
        results.append((out.detach(), a.grad, w.grad))
    for e, c in zip(*results):
        assert e.dtype == c.dtype and torch.equal(e, c)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("recipe", [r for r in RECIPES + RHT_RECIPES if r.scope == "all"], ids=str)
def test_grouped_cuda_equals_cpu_bitwise(recipe):
    """CUDA (Triton quantizers, epilogue, torch._grouped_mm) against the CPU reference path, bit for bit: the
    quantized bytes are the reference's and the data keep every FP32 accumulation exact (the oracle checks)."""
    # the transformed wgrad operands' block scales span more binades: half-size groups keep the oracle's FP32 wgrad
    # order-independent (it asserts so)
    offs = [0, 30, 30, 90, 150, 150, 165, 176] if recipe.wgrad_rht else [0, 50, 50, 170, 300, 300, 333, 352]
    A, W, offs_t, dy = _grouped_inputs(offs[-1] + 48, offs, 128, seed=9, tail=0.0, k=256)
    cpu = _grouped_grads(A, W, offs_t, dy, recipe)
    a, w, g = A.cuda(), W.cuda(), dy.cuda()
    a[offs[-1]:] = float("nan")  # garbage in the non-token rows, and recycled memory for the kernels' outputs
    g[offs[-1]:] = float("nan")
    torch.empty(1 << 26, device="cuda").fill_(float("nan"))
    cuda = _grouped_grads(a, w, offs_t.cuda(), g, recipe)
    for c, d in zip(cpu, cuda):
        _assert_equal(d.cpu(), c)
    for c, o in zip(cpu, grouped_backward(A, W, offs_t, dy, recipe)):
        _assert_equal(c, o)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("recipe", [r for r in RECIPES + RHT_RECIPES if r.scope == "all"], ids=str)
def test_dense_cuda_equals_cpu_bitwise(recipe):
    # 150 tokens: wide enough, still exact FP32 accumulation; the transformed operands' block scales span more
    # binades: 72 tokens (150 would be too wide for an order-independent FP32 wgrad, the oracle asserts)
    x, w, dy = _dense_inputs(11, m=72 if recipe.wgrad_rht else 150, n=128)
    grads = []
    for device in ("cpu", "cuda"):
        xg, wg = (t.to(device).detach().requires_grad_() for t in (x, w))  # x.to("cpu") is x itself
        four_over_six_linear(xg, wg, recipe=recipe).backward(dy.to(device))
        grads.append((xg.grad.cpu(), wg.grad.cpu()))
    for c, d, o in zip(*grads, dense_backward(x, w, dy, recipe)):
        _assert_equal(d, c)
        _assert_equal(c, o)


# ---- wgrad_rht on grouped GEMMs and row-scaled activations ----

def _group_transformed(A, dy, offs):
    """Each group's tokens zero-padded to 16 on their own and transformed (reference rht16), concatenated, with the
    padded group ends: the wgrad operands of wgrad_rht as plain inputs."""
    starts = [0] + offs[:-1]
    a = [rht16_columns_reference(A[s:t]) for s, t in zip(starts, offs)]
    g = [rht16_columns_reference(dy[s:t]) for s, t in zip(starts, offs)]
    ends = torch.tensor([x.shape[0] for x in a]).cumsum(0).to(torch.int32)
    return torch.cat(a), torch.cat(g), ends


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("layout", ["empty_group_and_tail", "one_group_with_tail"])
def test_grouped_wgrad_rht_is_the_plain_wgrad_of_each_groups_transform(layout, scaling):
    """dW with wgrad_rht is, byte for byte, the untransformed quantized dW of the groups' transformed tokens (each
    group padded and transformed on its own, then fed as a group of its own padded length): the amaxes are the
    transformed groups' own (per group, or per group and column when row-scaled), as the spec says. An
    independent route through the op's unchanged path, not the oracle."""
    rows, offs = LAYOUTS[layout]
    A, W, offs_t, dy = _grouped_inputs(rows, offs, 32, seed=21, tail=0.0)
    rht = FourOverSixRecipe(backward="quantized", activation_scaling=scaling, wgrad_rht=True)
    _, dW = _grouped_grads(A, W, offs_t, dy, rht)
    a, g, ends = _group_transformed(A, dy, offs)
    _, want = _grouped_grads(a, W, ends, g, replace(rht, wgrad_rht=False))
    _assert_equal(dW, want)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_grouped_wgrad_rht_keeps_groups_apart(scaling):
    """Each group's transform, amax and quantization see its own tokens only (its zero padding included): scaling
    one group's tokens changes that expert's dW alone, and dA not at all."""
    recipe = FourOverSixRecipe(backward="quantized", activation_scaling=scaling, wgrad_rht=True)
    A, W, offs, dy = _grouped_inputs(70, [10, 10, 41, 60], 32, seed=22)
    dA, dW = _grouped_grads(A, W, offs, dy, recipe)
    A2, dy2 = A.clone(), dy.clone()
    A2[10:41] *= 3
    dy2[10:41] *= 5
    dA2, dW2 = _grouped_grads(A2, W, offs, dy2, recipe)
    assert not torch.equal(dW[2], dW2[2])
    for e in (0, 1, 3):
        assert torch.equal(dW[e], dW2[e])
    for s, t in ((0, 10), (41, 70)):
        assert torch.equal(dA[s:t], dA2[s:t])


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_grouped_wgrad_rht_changes_dw_only(scaling):
    """wgrad_rht leaves dA's bytes alone and moves dW within quantization noise of the untransformed dW (the
    transform is orthogonal along the groups' tokens: both approximate the same exact dW)."""
    plain = FourOverSixRecipe(backward="quantized", activation_scaling=scaling)
    A, W, offs, dy = _grouped_inputs(300, [0, 50, 50, 170, 300], 64, seed=23, tail=0.0)
    A, dy = torch.randn(A.shape, generator=torch.Generator().manual_seed(0)).bfloat16(), dy.float().sign().bfloat16()
    dy = (dy * torch.rand(dy.shape, generator=torch.Generator().manual_seed(1))).bfloat16()
    dA0, dW0 = _grouped_grads(A, W, offs, dy, plain)
    dA1, dW1 = _grouped_grads(A, W, offs, dy, replace(plain, wgrad_rht=True))
    assert torch.equal(dA0, dA1) and not torch.equal(dW0, dW1)
    exact = torch._grouped_mm(dy.t().float(), A.float(), offs=offs)[1:]  # group 0 is empty
    for dW in (dW0, dW1):
        cos = torch.nn.functional.cosine_similarity(dW[1:].float().flatten(), exact.flatten(), dim=0)
        assert cos > 0.98
    assert torch.nn.functional.cosine_similarity(dW0.float().flatten(), dW1.float().flatten(), dim=0) > 0.97
    assert not dW1[0].any() and not dW1[2].any()


def test_dense_row_scaled_wgrad_rht_is_the_plain_wgrad_of_the_transform():
    """Dense row-scaled x with wgrad_rht: dW is the untransformed row-scaled quantized dW of (H x, H dy), the column
    amaxes the transformed x's."""
    x, w, dy = _dense_inputs(24, m=40)
    recipe = FourOverSixRecipe(backward="quantized", activation_scaling="row", wgrad_rht=True)
    grads = []
    for args, r in (((x, dy), recipe), ((rht16_columns_reference(x), rht16_columns_reference(dy)),
                                         replace(recipe, wgrad_rht=False))):
        xg, wg = args[0].clone().requires_grad_(), w.clone().requires_grad_()
        four_over_six_linear(xg, wg, recipe=r).backward(args[1])
        grads.append(wg.grad)
    _assert_equal(*grads)
