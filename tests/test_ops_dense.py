"""Dense four-over-six GEMM: forward and each backward mode against float64 oracles, saved tensors, errors."""

import pytest
import torch

from tests.helpers.ops_oracle import assert_matches, four_six64, pad16, rel_for, standard64
from titan_fp4six import FourOverSixRecipe, four_over_six_linear, four_over_six_mm
from titan_fp4six.quant import nvfp4_dequantize, row_amax, tensor_amax, four_over_six_quantize
from titan_fp4six.quant.operands import Operand, transpose_tile_codes


def _operands(seed, lead=(37,), k=64, n=48, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, k, generator=g) * torch.rand(*lead, 1, generator=g) * 4).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.1).to(dtype)
    dy = torch.randn(*lead, n, generator=g).to(dtype)
    return x, w, dy


def _x_amax(x2d, recipe):
    return row_amax(x2d) if recipe.plan(grouped=False).row_scaled else tensor_amax(x2d)


def _forward_operands64(x2d, w, recipe):
    return four_six64(x2d, _x_amax(x2d, recipe), recipe), four_six64(w, tensor_amax(w), recipe, recipe.weight_block)


@pytest.mark.parametrize("recipe", [
    FourOverSixRecipe(),
    FourOverSixRecipe(weight_block="1x16", err_mode="mae", scale_bound=448),
    FourOverSixRecipe(activation_scaling="row"),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_forward_matches_float64_oracle(recipe, dtype):
    x, w, _ = _operands(0, lead=(3, 13), dtype=dtype)  # odd leading dims: 39 tokens
    out = four_over_six_linear(x, w, recipe=recipe)
    assert out.shape == (3, 13, 48) and out.dtype == dtype
    x64, w64 = _forward_operands64(x.reshape(-1, 64), w, recipe)
    assert_matches(out.reshape(-1, 48), x64 @ w64.t(), x64, w64.t(), rel_for(dtype))


def test_forward_is_not_plain_nvfp4():
    """The oracle check above would also pass a wrong quantizer if the operands were close; pin the 4/6 choice:
    the forward differs from a GEMM of standard NVFP4 operands."""
    x, w, _ = _operands(1)
    recipe = FourOverSixRecipe(scale_bound=448)
    out = four_over_six_mm(x, w, recipe=recipe).double()
    plain = standard64(x, tensor_amax(x)) @ standard64(w, tensor_amax(w)).t()
    x64, w64 = _forward_operands64(x, w, recipe)
    assert (out - x64 @ w64.t()).abs().max() < (out - plain).abs().max()


def test_bias_and_output_layout():
    x, w, _ = _operands(2, lead=(2, 5, 16))
    bias = torch.randn(48).to(torch.bfloat16)
    recipe = FourOverSixRecipe()
    y = four_over_six_linear(x, w, bias, recipe=recipe)
    assert torch.equal(y, four_over_six_linear(x, w, recipe=recipe) + bias)


def _grads(x, w, dy, recipe):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    four_over_six_linear(x, w, recipe=recipe).backward(dy)
    return x.grad.reshape(-1, x.shape[-1]), w.grad


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(backward="high_precision"),
                                    FourOverSixRecipe(backward="high_precision", activation_scaling="row")])
def test_high_precision_backward(recipe):
    x, w, dy = _operands(3, lead=(37,))
    dx, dw = _grads(x, w, dy, recipe)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    assert_matches(dx, dy64 @ w64, dy64, w64, rel_for(torch.bfloat16))
    assert_matches(dw, dy64.t() @ x64, dy64.t(), x64, rel_for(torch.bfloat16))


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(backward="dequantized"),
                                    FourOverSixRecipe(backward="dequantized", activation_scaling="row",
                                                      weight_block="1x16")])
def test_dequantized_backward(recipe):
    """bf16 GEMMs on the dequantized forward operands: the exact gradient of the quantized forward."""
    x, w, dy = _operands(4, lead=(37,))
    dx, dw = _grads(x, w, dy, recipe)
    xq = four_over_six_quantize(x, _x_amax(x, recipe), block="1x16", scale_bound=recipe.scale_bound)
    wq = four_over_six_quantize(w, tensor_amax(w), block=recipe.weight_block, scale_bound=recipe.scale_bound)
    x_deq = nvfp4_dequantize(*xq, _x_amax(x, recipe), scale_bound=recipe.scale_bound, dtype=x.dtype).double()
    w_deq = nvfp4_dequantize(*wq, tensor_amax(w), scale_bound=recipe.scale_bound, dtype=w.dtype).double()
    dy64 = dy.double()
    assert_matches(dx, dy64 @ w_deq, dy64, w_deq, rel_for(torch.bfloat16))
    assert_matches(dw, dy64.t() @ x_deq, dy64.t(), x_deq, rel_for(torch.bfloat16))


@pytest.mark.parametrize("weight_block", ["16x16", "1x16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantized_backward(weight_block, dtype):
    """dgrad = Q(dy) Q_col(W), wgrad = Q_col(dy)^T Q_col(x): standard NVFP4 dy with its own amax, x and W
    columnwise with the forward's amax; 16x16 W reuses the forward's tiles (transposed)."""
    recipe = FourOverSixRecipe(weight_block=weight_block, backward="quantized")
    x, w, dy = _operands(5, lead=(37,), dtype=dtype)  # 37 tokens: columnwise blocks need zero padding
    dx, dw = _grads(x, w, dy, recipe)
    a_x, a_w, a_dy = tensor_amax(x), tensor_amax(w), tensor_amax(dy)
    dy64 = standard64(dy, a_dy)
    if weight_block == "16x16":
        w_col = four_six64(w, a_w, recipe, "16x16").t()  # the forward's own W, transposed
    else:
        w_col = four_six64(w.t(), a_w, recipe)
    assert_matches(dx, dy64 @ w_col.t(), dy64, w_col.t(), rel_for(dtype))
    dy_col = standard64(pad16(dy).t(), a_dy)
    x_col = four_six64(pad16(x).t(), a_x, recipe)
    assert_matches(dw, dy_col @ x_col.t(), dy_col, x_col.t(), rel_for(dtype))


def test_transposed_tiles_decode_to_the_transpose():
    w = torch.randn(48, 64)
    q = four_over_six_quantize(w, tensor_amax(w), block="16x16")
    t = transpose_tile_codes(Operand(q.codes, q.scales))
    assert t.codes.shape == (64, 24) and t.scales.shape == (64, 3)
    assert torch.equal(t.block_scaled("auto"), Operand(q.codes, q.scales).block_scaled("auto").t())


def test_backward_decodes_the_weight_tiles_with_the_recipes_quantizer(monkeypatch):
    """The quantized backward decodes the forward's 16x16 weight tiles for W^T with the recipe's `quantizer`
    (quantizer='reference' must mean the reference everywhere, not only in the quantizers)."""
    from titan_fp4six.quant import operands
    seen = []
    pick = operands.pick
    monkeypatch.setattr(operands, "pick", lambda primitive, quantizer, *inputs: (
        seen.append(quantizer) if primitive is operands.DECODE else None) or pick(primitive, quantizer, *inputs))
    x, w = torch.randn(32, 64, requires_grad=True), torch.randn(48, 64, requires_grad=True)
    four_over_six_linear(x, w, recipe=FourOverSixRecipe(quantizer="reference")).sum().backward()
    assert seen == ["reference"]


def test_quantized_backward_differs_from_high_precision():
    x, w, dy = _operands(6, lead=(32,))
    q = _grads(x, w, dy, FourOverSixRecipe(backward="quantized"))
    h = _grads(x, w, dy, FourOverSixRecipe(backward="high_precision"))
    assert not torch.equal(q[0], h[0]) and not torch.equal(q[1], h[1])


def _saved(recipe, x, w):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        four_over_six_linear(x.requires_grad_(), w.requires_grad_(), recipe=recipe)
    return saved


def test_dequantized_saves_only_codes_scales_and_amax():
    x, w, _ = _operands(7, lead=(32,))
    saved = _saved(FourOverSixRecipe(backward="dequantized"), x, w)
    assert sorted(((t.dtype, tuple(t.shape)) for t in saved), key=str) == sorted([
        (torch.uint8, (32, 32)), (torch.float8_e4m3fn, (32, 4)), (torch.uint8, (48, 32)),
        (torch.float8_e4m3fn, (48, 4)), (torch.float32, ()), (torch.float32, ())], key=str)  # x's amax, W's
    high = _saved(FourOverSixRecipe(backward="high_precision"), x, w)
    assert any(t.dtype == torch.bfloat16 and t.shape == x.shape for t in high)


def test_only_needed_grads():
    x, w, dy = _operands(8, lead=(32,))
    w = w.clone().requires_grad_()
    four_over_six_linear(x, w, recipe=FourOverSixRecipe()).backward(dy)
    assert w.grad.shape == w.shape and x.grad is None


@pytest.mark.parametrize("recipe", [
    FourOverSixRecipe(backward=b, weight_block=wb) for b in ("quantized", "high_precision", "dequantized")
    for wb in ("16x16", "1x16")] + [FourOverSixRecipe(activation_scaling="row"),
                                    FourOverSixRecipe(activation_scaling="row", backward="quantized")])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_zero_tokens_forward_and_backward(recipe, device):
    """0 rows (an empty micro-batch or routing bucket): output (0, N), dx (0, K), dW zeros, with per-tensor
    scaling too (the amax of no values is 0; every step is a shape-determined empty op, CPU or CUDA)."""
    _, w, _ = _operands(10, lead=(1,))
    x = torch.zeros(0, 2, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = w.to(device).requires_grad_()
    bias = torch.ones(48, dtype=torch.bfloat16, device=device, requires_grad=True)
    out = four_over_six_linear(x, w, bias, recipe=recipe)
    assert out.shape == (0, 2, 48) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and bias.grad.shape == bias.shape
    assert not w.grad.any() and not bias.grad.any()


def test_nan_reaches_the_output():
    x, w, _ = _operands(9, lead=(32,))
    x[3, 5] = float("nan")
    per_tensor = four_over_six_mm(x, w, recipe=FourOverSixRecipe())
    assert per_tensor.isnan().all()  # through the NaN amax
    per_row = four_over_six_mm(x, w, recipe=FourOverSixRecipe(activation_scaling="row"))
    assert per_row[3].isnan().all() and not per_row[torch.arange(32) != 3].isnan().any()


@pytest.mark.parametrize("args, err, match", [
    (((4, 64), (48, 32)), ValueError, "K=64"),
    (((4, 40), (48, 40)), ValueError, "K .*40.*multiple of 16"),
    (((4, 64), (40, 64)), ValueError, "N .*40.*multiple of 16"),
    (((4, 64), (2, 48, 64)), ValueError, "weight must be 2-D"),
    (((4, 0), (48, 0)), ValueError, r"K \(weight.shape\[1\]\) is 0; NVFP4 GEMMs need a positive multiple of 16"),
    (((4, 64), (0, 64)), ValueError, r"N \(weight.shape\[0\]\) is 0; NVFP4 GEMMs need a positive multiple"),
])
def test_bad_shapes(args, err, match):
    with pytest.raises(err, match=match):
        four_over_six_linear(torch.randn(*args[0]), torch.randn(*args[1]), recipe=FourOverSixRecipe())


def test_bad_dtypes_recipe_bias_and_rank():
    x, w = torch.randn(4, 64), torch.randn(48, 64)
    with pytest.raises(TypeError, match="x.dtype=torch.int32"):
        four_over_six_linear(x.int(), w, recipe=FourOverSixRecipe())
    with pytest.raises(TypeError, match="FourOverSixRecipe"):
        four_over_six_linear(x, w, recipe={"err_mode": "mse"})
    with pytest.raises(ValueError, match=r"bias must have shape \(48,\)"):
        four_over_six_linear(x, w, torch.randn(47), recipe=FourOverSixRecipe())
    with pytest.raises(ValueError, match="x2d must be 2-D"):
        four_over_six_mm(x[None], w, recipe=FourOverSixRecipe())
