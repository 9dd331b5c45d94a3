"""Grouped (MoE) four-over-six GEMM: oracle, equality with a per-group loop of the dense op, tail rows, empty
groups, backward modes, saved tensors, errors."""

import pytest
import torch

from tests.helpers.ops_oracle import assert_matches, four_six64
from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm
from titan_fp4six.quant import row_amax, tensor_amax

K, N, E = 64, 32, 4
OFFS = [10, 10, 41, 60]  # an empty group, odd sizes, 10 tail rows of a 70-row A


def _inputs(seed, rows=70, offs=OFFS, n=N, dtype=torch.bfloat16, tail=float("nan")):
    g = torch.Generator().manual_seed(seed)
    A = (torch.randn(rows, K, generator=g) * torch.rand(rows, 1, generator=g) * 3).to(dtype)
    A[offs[-1]:] = tail
    W = (torch.randn(E, n, K, generator=g) * torch.rand(E, 1, 1, generator=g)).to(dtype)
    dy = torch.randn(rows, n, generator=g).to(dtype)
    return A, W, torch.tensor(offs, dtype=torch.int32), dy


def _groups(offs):
    starts = [0] + offs.tolist()[:-1]
    return list(zip(starts, offs.tolist()))


def _run(A, W, offs, dy, recipe):
    A = A.clone().requires_grad_()
    W = W.clone().requires_grad_()
    out = four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=recipe)
    out.backward(dy)
    return out.detach(), A.grad, W.grad


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(activation_scaling="row"),
                                    FourOverSixRecipe(weight_block="1x16", err_mode="mae", scale_bound=448)])
def test_forward_matches_float64_oracle(recipe):
    A, W, offs, _ = _inputs(0)
    out = four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=recipe)
    for e, (s, t) in enumerate(_groups(offs)):
        if s == t:
            continue
        amax = row_amax(A[s:t]) if recipe.plan(grouped=True).row_scaled else tensor_amax(A[s:t])
        a64 = four_six64(A[s:t], amax, recipe)
        w64 = four_six64(W[e], tensor_amax(W[e]), recipe, recipe.weight_block)
        # two roundings: the grouped GEMM's bf16 output, then the cast after the global factors
        assert_matches(out[s:t], a64 @ w64.t(), a64, w64.t(), 2.0 ** -7)
    assert not out[60:].any()


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(activation_scaling="row",
                                                                           backward="dequantized")])
def test_equals_per_group_loop_of_the_dense_op(recipe):
    A, W, offs, dy = _inputs(1)
    out, dA, dW = _run(A, W, offs, dy, recipe)
    fwd = torch.ops.titan_fp4six.grouped_fwd(A, [W.transpose(-2, -1)], offs, recipe.resolve(grouped=True).key)
    assert torch.equal(fwd[7], torch.tensor([e for e, (s, t) in enumerate(_groups(offs)) for _ in range(t - s)]
                                            + [len(offs)] * (A.shape[0] - int(offs[-1]))))  # saved for the backward
    assert torch.equal(fwd[8], torch.tensor([s == t for s, t in _groups(offs)]))
    dense_recipe = FourOverSixRecipe(activation_scaling=recipe.activation_scaling, backward=recipe.plan(grouped=True).backward)
    for e, (s, t) in enumerate(_groups(offs)):
        if s == t:
            assert not dW[e].any()
            continue
        # identical quantization: the same codes and scales as the dense op on the group alone
        dense = torch.ops.titan_fp4six.dense_fwd(A[s:t], W[e], dense_recipe.key)
        assert torch.equal(fwd[1][s:t], dense[1]) and torch.equal(fwd[2][s:t].view(torch.uint8), dense[2].view(torch.uint8))
        assert torch.equal(fwd[4][0][e * N:(e + 1) * N], dense[3])
        # GEMM outputs up to the grouped GEMM's one extra bf16 rounding; grads up to accumulation order
        a, w = A[s:t].clone().requires_grad_(), W[e].clone().requires_grad_()
        ref = four_over_six_mm(a, w, recipe=dense_recipe)
        ref.backward(dy[s:t])
        torch.testing.assert_close(out[s:t], ref.detach(), rtol=2 ** -7, atol=1e-6)
        torch.testing.assert_close(dA[s:t], a.grad, rtol=2 ** -7, atol=1e-3)
        torch.testing.assert_close(dW[e], w.grad, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("mode", ["high_precision", "dequantized", "quantized"])
def test_tail_rows_change_nothing(mode):
    recipe = FourOverSixRecipe(backward=mode)
    A, W, offs, dy = _inputs(2, tail=0.0)
    clean = _run(A, W, offs, dy, recipe)
    A[60:] = float("nan")
    A[65:] = float("inf")
    dy[60:] = float("nan")
    dirty = _run(A, W, offs, dy, recipe)
    for c, d in zip(clean, dirty):
        assert torch.equal(c, d)
    out, dA, _ = dirty
    assert not out[60:].any() and not dA[60:].any()


def test_empty_groups_get_zero_weight_grads():
    A, W, offs, dy = _inputs(3, offs=[0, 20, 20, 48])
    out, dA, dW = _run(A, W, offs, dy, FourOverSixRecipe())
    assert not dW[0].any() and not dW[2].any()
    assert dW[1].any() and dW[3].any()
    assert torch.isfinite(out).all() and not out[48:].any()


def test_high_precision_backward_oracle():
    A, W, offs, dy = _inputs(4)
    _, dA, dW = _run(A, W, offs, dy, FourOverSixRecipe())
    for e, (s, t) in enumerate(_groups(offs)):
        dy64, w64, a64 = dy[s:t].double(), W[e].double(), A[s:t].double()
        if s < t:
            assert_matches(dA[s:t], dy64 @ w64, dy64, w64, 2.0 ** -8)
        assert_matches(dW[e], dy64.t() @ a64, dy64.t(), a64, 2.0 ** -8)


def test_dequantized_saves_only_codes_scales_amax_offs_and_groups():
    A, W, offs, _ = _inputs(5)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        four_over_six_grouped_mm(A.requires_grad_(), W.requires_grad_().transpose(-2, -1), offs,
                                 recipe=FourOverSixRecipe(backward="dequantized"))
    assert sorted(((t.dtype, tuple(t.shape)) for t in saved), key=str) == sorted([
        (torch.uint8, (70, 32)), (torch.float8_e4m3fn, (70, 4)), (torch.float32, (E,)), (torch.int32, (E,)),
        (torch.uint8, (E * N, 32)), (torch.float8_e4m3fn, (E * N, 4)), (torch.float32, (E,)), (torch.int64, (70,)),
        (torch.bool, (E,))],
        key=str)


def test_1x16_weights_allow_any_n():
    A, W, offs, _ = _inputs(6, n=24)
    out = four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=FourOverSixRecipe(weight_block="1x16"))
    assert out.shape == (70, 24)
    with pytest.raises(ValueError, match="16x16.*N .*24"):
        four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=FourOverSixRecipe())


@pytest.mark.parametrize("offs, err, match", [
    (torch.tensor(OFFS, dtype=torch.int64), TypeError, "offs must be an int32"),
    ([10, 10, 41, 60], TypeError, "offs must be an int32"),
    (torch.tensor([10, 41, 60], dtype=torch.int32), ValueError, r"offs must have shape \(4,\)"),
    (torch.tensor([10, 41, 30, 60], dtype=torch.int32), ValueError, "non-decreasing"),
    (torch.tensor([10, 41, 60, 71], dtype=torch.int32), ValueError, "offs.-1.=71 exceeds the 70 rows"),
])
def test_bad_offs(offs, err, match):
    A, W, _, _ = _inputs(7)
    with pytest.raises(err, match=match):
        four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=FourOverSixRecipe())


def test_bad_shapes_and_dtypes():
    A, W, offs, _ = _inputs(8)
    r = FourOverSixRecipe()
    with pytest.raises(ValueError, match="B_t must be 3-D"):
        four_over_six_grouped_mm(A, W[0].t(), offs, recipe=r)
    with pytest.raises(ValueError, match="K=48"):
        four_over_six_grouped_mm(A[:, :48], W.transpose(-2, -1), offs, recipe=r)
    with pytest.raises(ValueError, match=r"K \(B_t.shape\[1\]\) is 0"):
        four_over_six_grouped_mm(A[:, :0], W[:, :, :0].transpose(-2, -1), offs, recipe=r)
    with pytest.raises(ValueError, match=r"B_t \(E, K, N\) has shape \(4, 64, 0\); E \(experts\) and N must"):
        four_over_six_grouped_mm(A, W[:, :0].transpose(-2, -1), offs, recipe=r)
    with pytest.raises(ValueError, match=r"B_t \(E, K, N\) has shape \(0, 64, \d+\)"):
        four_over_six_grouped_mm(A, W[:0].transpose(-2, -1), offs[:0], recipe=r)
    with pytest.raises(TypeError, match="A.dtype=torch.int64"):
        four_over_six_grouped_mm(A.long(), W.transpose(-2, -1), offs, recipe=r)


def test_the_saved_structures_name_the_backward_ops_arguments():
    """The named tuples the autograd functions save are the backward ops' tensor arguments, in their order (the
    backward passes them positionally)."""
    import inspect

    from titan_fp4six.ops import dense, grouped

    for saved, op in ((dense._DenseSaved, dense.dense_bwd), (grouped._GroupedSaved, grouped.grouped_bwd)):
        params = list(inspect.signature(op.body).parameters)
        assert saved._fields == tuple(params[1:1 + len(saved._fields)]), (saved._fields, params)


def test_several_gemms_of_one_input_refuse_what_does_not_pair():
    """four_over_six_grouped_mms: at least one B_t, one dtype for all (their gradients'), one QuantizedWeight per
    B_t; each B_t is checked as four_over_six_grouped_mm checks it."""
    from titan_fp4six.ops import four_over_six_grouped_mms, quantize_grouped_weight

    A, W, offs, _ = _inputs(2)
    recipe = FourOverSixRecipe()
    B_t = W.transpose(-2, -1)
    with pytest.raises(ValueError, match="at least one B_t"):
        four_over_six_grouped_mms(A, [], offs, recipe=recipe)
    with pytest.raises(TypeError, match="B_ts must share one dtype"):
        four_over_six_grouped_mms(A, [B_t, B_t.float()], offs, recipe=recipe)
    with pytest.raises(ValueError, match="quantized_weights holds 1 weights for 2 B_ts"):
        four_over_six_grouped_mms(A, [B_t, B_t], offs, recipe=recipe,
                                  quantized_weights=[quantize_grouped_weight(B_t, recipe=recipe)])
    with pytest.raises(ValueError, match=r"A has K=\d+ but B_t"):
        four_over_six_grouped_mms(A, [B_t, B_t[:, :16]], offs, recipe=recipe)


def test_an_unused_output_of_several_gemms_gets_no_backward():
    """Like a separate GEMM whose output is unused: its weight's gradient stays None and its GEMM takes no
    stochastic seed, so the used output's gradients are the single call's bytes."""
    from titan_fp4six.ops import four_over_six_grouped_mms
    from titan_fp4six.quant.process_state import GRADIENT_ROUNDING, set_rounding_seed

    A, W, offs, dy = _inputs(3, tail=0.0)
    recipe = FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic")
    runs = []
    for several in (False, True):
        a, w1, w3 = (t.clone().requires_grad_() for t in (A, W, W.flip(0)))
        set_rounding_seed(5, 1)
        if several:
            out, _ = four_over_six_grouped_mms(a, [w1.transpose(-2, -1), w3.transpose(-2, -1)], offs, recipe=recipe)
        else:
            out = four_over_six_grouped_mm(a, w1.transpose(-2, -1), offs, recipe=recipe)
        out.backward(dy)
        runs.append((a.grad, w1.grad, w3.grad, GRADIENT_ROUNDING.calls))
    (a0, w0, none0, calls0), (a1, w1_, none1, calls1) = runs
    assert torch.equal(a0, a1) and torch.equal(w0, w1_) and none0 is None and none1 is None
    assert calls0 == calls1 == 2  # dgrad's dy, then wgrad's dy^T
