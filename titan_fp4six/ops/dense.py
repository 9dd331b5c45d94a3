"""Four-over-six dense GEMM (linear / mm) with its three backward modes.

The quantize+GEMM forward and each backward are torch.library custom ops while torch.compile traces: opaque
to it (Inductor cannot re-associate the quantizer arithmetic, so compiled results equal eager ones bit for
bit), with fake implementations for tracing; eager calls run the same bodies directly (quant.library). Both
are wrapped in an autograd.Function. The ops take the recipe's dense GemmPlan as its key string, and their
bodies its role quantizers (quant.operands.gemm_quantizers); the public functions below check their arguments
once.
"""

from typing import NamedTuple

import torch
from torch import Tensor

from ..quant.amax import run_dense_amaxes, run_row_amax, run_tensor_amax
from ..quant.grad_operands import dense_grad_operands
from ..quant.library import compile_opaque_op
from ..quant.operands import GemmQuantizers, Operand, gemm_quantizers
from ..quant.quantize import run_dequantize
from ..quant.recipe import FourOverSixRecipe, GemmPlan, plan_of_key
from .checks import check_dense, check_linear_weight, check_loaded_weight
from .gemm import gemm_nt
from .weights import QuantizedWeight, quantize_rows

_F8 = torch.float8_e4m3fn


def split_amaxes(amaxes: Tensor, row_scaled: bool) -> tuple[Tensor, Tensor]:
    """(x's amax: () or (M,) when row_scaled, the weight's amax ()) as views of dense_fwd's amaxes vector."""
    return (amaxes[:-1], amaxes[-1]) if row_scaled else (amaxes[0], amaxes[1])


def _forward(x: Tensor, x_amax: Tensor, wq: Operand, w_amax: Tensor, q: GemmQuantizers):
    """(output, x's operand): x quantized, times the weight's operand."""
    xq = q.x.rows(x, x_amax)
    return gemm_nt(xq, x_amax, q.x.bound, wq, w_amax, q.w.bound, x.dtype, q.backends), xq


@compile_opaque_op("dense_fwd")
def dense_fwd(x: Tensor, weight: Tensor, recipe: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """x (M, K) x weight (N, K)^T, both four-over-six quantized. Returns the output (M, N) in x's dtype, then
    what the backward modes save: the forward's x codes, scales, weight codes, scales, and both amaxes in one
    FP32 vector (x's one or M, then the weight's: split_amaxes), computed together."""
    q = gemm_quantizers(recipe, False, x.device)
    amaxes = run_dense_amaxes(x, weight, q.row_scaled, q.backends.quantizer)
    x_amax, w_amax = split_amaxes(amaxes, q.row_scaled)
    wq = q.w.rows(weight, w_amax)
    out, xq = _forward(x, x_amax, wq, w_amax, q)
    return out, xq.codes, xq.scales, wq.codes, wq.scales, amaxes


@dense_fwd.register_fake
def _(x, weight, recipe):
    (m, k), n = x.shape, weight.shape[0]
    row_scaled = plan_of_key(recipe, False).row_scaled
    return (x.new_empty(m, n), *_fake_codes(x, m, k), *_fake_codes(x, n, k),
            x.new_empty((m if row_scaled else 1) + 1, dtype=torch.float32))


@compile_opaque_op("dense_fwd_quantized_weight")
def dense_fwd_quantized_weight(x: Tensor, w_codes: Tensor, w_scales: Tensor, w_decoded: Tensor | None,
                               w_amax: Tensor, recipe: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """dense_fwd with the weight already quantized (ops.weights.QuantizedWeight): (output, x codes, x scales,
    x's amax: () or (M,) when row-scaled)."""
    q = gemm_quantizers(recipe, False, x.device)
    quantizer = q.backends.quantizer
    x_amax = run_row_amax(x, quantizer) if q.row_scaled else run_tensor_amax(x, quantizer)
    out, xq = _forward(x, x_amax, Operand(w_codes, w_scales, w_decoded), w_amax, q)
    return out, xq.codes, xq.scales, x_amax


@dense_fwd_quantized_weight.register_fake
def _(x, w_codes, w_scales, w_decoded, w_amax, recipe):
    m, k = x.shape
    row_scaled = plan_of_key(recipe, False).row_scaled
    return (x.new_empty(m, w_codes.shape[0]), *_fake_codes(x, m, k),
            x.new_empty(m if row_scaled else (), dtype=torch.float32))


def _fake_codes(t: Tensor, rows: int, k: int) -> tuple[Tensor, Tensor]:
    return t.new_empty(rows, k // 2, dtype=torch.uint8), t.new_empty(rows, k // 16, dtype=_F8)


def _quantized_grads(dy, x, weight, w_codes, w_scales, w_decoded, x_amax, w_amax, q: GemmQuantizers, x_dtype,
                     w_dtype, need_dx, need_dw):
    """Backward 'quantized': dgrad = Q(dy) x Q_col(W); wgrad = Q_col(dy)^T x Q_col(x), the operands of
    quant.grad_operands.dense_grad_operands; a row-scaled x^T's product computed as (Q_col(x) x Q_col(dy)^T)^T so
    that its per-row factor sits on the GEMM's row-scaled side."""
    g = dense_grad_operands(dy, x, weight, Operand(w_codes, w_scales, w_decoded), x_amax, w_amax, q, need_dx,
                            need_dw)
    b = q.backends
    dx = dw = dy.new_empty(0)
    if need_dx:
        dx = gemm_nt(g.dy, g.dy_amax, q.dy.bound, g.w_t, w_amax, q.w_t.bound, x_dtype, b)
    if need_dw:
        if q.row_scaled:
            dw = gemm_nt(g.x_t, g.x_t_amax, q.x_t.bound, g.dy_t, g.dy_t_amax, q.dy_t.bound, w_dtype, b)
            dw = dw.t().contiguous()
        else:
            dw = gemm_nt(g.dy_t, g.dy_t_amax, q.dy_t.bound, g.x_t, g.x_t_amax, q.x_t.bound, w_dtype, b)
    return dx, dw


@compile_opaque_op("dense_bwd")
def dense_bwd(dy: Tensor, x: Tensor | None, weight: Tensor | None, x_codes: Tensor | None,
              x_scales: Tensor | None, w_codes: Tensor | None, w_scales: Tensor | None, w_decoded: Tensor | None,
              x_amax: Tensor, w_amax: Tensor, recipe: str, x_dtype: torch.dtype, w_dtype: torch.dtype, need_dx: bool,
              need_dw: bool) -> tuple[Tensor, Tensor]:
    """(dx (M, K) in x's dtype, dweight (N, K) in the weight's dtype); an empty tensor for a grad not needed.
    w_decoded: the forward weight's decode where it outlives the forward (a QuantizedWeight), else None."""
    q = gemm_quantizers(recipe, False, dy.device)
    backward = q.plan.backward
    if backward == "quantized":
        return _quantized_grads(dy, x, weight, w_codes, w_scales, w_decoded, x_amax, w_amax, q, x_dtype, w_dtype,
                                need_dx, need_dw)
    # high_precision / dequantized: GEMMs in the activations' dtype (bf16 in training) on the original or the
    # dequantized forward operands
    if backward == "dequantized":
        quantizer = q.backends.quantizer
        x = run_dequantize(x_codes, x_scales, x_amax, q.x.bound, x_dtype, quantizer)
        weight = run_dequantize(w_codes, w_scales, w_amax, q.w.bound, x_dtype, quantizer)
    dy = dy.to(x_dtype)
    dx = torch.mm(dy, weight.to(x_dtype)) if need_dx else dy.new_empty(0)
    dw = torch.mm(dy.t(), x).to(w_dtype) if need_dw else dy.new_empty(0)
    return dx, dw


@dense_bwd.register_fake
def _(dy, x, weight, x_codes, x_scales, w_codes, w_scales, w_decoded, x_amax, w_amax, recipe, x_dtype, w_dtype,
      need_dx, need_dw):
    m, n = dy.shape
    k = x.shape[1] if x is not None else x_codes.shape[1] * 2
    dx = dy.new_empty(m, k, dtype=x_dtype) if need_dx else dy.new_empty(0)
    dw = dy.new_empty(n, k, dtype=w_dtype) if need_dw else dy.new_empty(0)
    return dx, dw


class _DenseSaved(NamedTuple):
    """What the dense backward keeps, in dense_bwd's argument order; None where its backward mode needs nothing."""

    x: Tensor | None
    weight: Tensor | None
    x_codes: Tensor | None
    x_scales: Tensor | None
    w_codes: Tensor | None
    w_scales: Tensor | None
    w_decoded: Tensor | None
    x_amax: Tensor
    w_amax: Tensor

    @staticmethod
    def of(p: GemmPlan, x, weight, xc, xs, wc, ws, w_dec, x_amax, w_amax) -> "_DenseSaved":
        if p.backward == "high_precision":
            return _DenseSaved(x, weight, None, None, None, None, None, x_amax, w_amax)
        if p.backward == "dequantized":  # only 4-bit codes, E4M3 scales and FP32 amax stay alive
            return _DenseSaved(None, None, xc, xs, wc, ws, None, x_amax, w_amax)
        if p.w_t.block == "16x16":  # quantized: x for its columnwise quantization, W's tiles transpose
            return _DenseSaved(x, None, None, None, wc, ws, w_dec, x_amax, w_amax)
        return _DenseSaved(x, weight, None, None, None, None, None, x_amax, w_amax)


class _DenseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, p: GemmPlan, qw: QuantizedWeight | None):
        key = p.key
        if qw is None:
            out, xc, xs, wc, ws, amaxes = dense_fwd(x, weight, key)
            (x_amax, w_amax), w_dec = split_amaxes(amaxes, p.row_scaled), None
        else:
            out, xc, xs, x_amax = dense_fwd_quantized_weight(x, qw.codes, qw.scales, qw.decoded, qw.amax, key)
            wc, ws, w_dec, w_amax = qw.codes, qw.scales, qw.decoded, qw.amax
        ctx.save_for_backward(*_DenseSaved.of(p, x, weight, xc, xs, wc, ws, w_dec, x_amax, w_amax))
        ctx.config = (key, x.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, dy):
        key, x_dtype, w_dtype = ctx.config
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx, dw = dense_bwd(dy.contiguous(), *ctx.saved_tensors, key, x_dtype, w_dtype, need_dx, need_dw)
        return (dx if need_dx else None), (dw if need_dw else None), None, None


def _apply(x2d: Tensor, weight: Tensor, recipe: FourOverSixRecipe, quantized_weight: QuantizedWeight | None):
    plan = recipe.plan(grouped=False)
    if quantized_weight is not None:
        quantized_weight.check(weight, plan, "weight")
    return _DenseFunction.apply(x2d, weight, plan, quantized_weight)


def quantize_linear_weight(weight: Tensor, *, recipe: FourOverSixRecipe) -> QuantizedWeight:
    """weight (N, K) quantized as four_over_six_linear's forward quantizes it, to pass as its quantized_weight
    while the weight is unchanged (e.g. across gradient-accumulation micro-batches)."""
    check_linear_weight(weight, recipe)
    return quantize_rows(weight, 0, recipe.plan(grouped=False), weight)


def four_over_six_mm(x2d: Tensor, weight: Tensor, *, recipe: FourOverSixRecipe,
                     quantized_weight: QuantizedWeight | None = None) -> Tensor:
    """x2d (M, K) @ weight (N, K)^T with four-over-six NVFP4 operands -> (M, N) in x2d's dtype;
    quantized_weight as in four_over_six_linear."""
    check_dense(x2d, weight, None, recipe)
    if x2d.dim() != 2:
        raise ValueError(f"x2d must be 2-D (M, K), got shape {tuple(x2d.shape)}; use four_over_six_linear")
    return _apply(x2d, weight, recipe, quantized_weight)


def four_over_six_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, recipe: FourOverSixRecipe,
                         quantized_weight: QuantizedWeight | None = None) -> Tensor:
    """F.linear with four-over-six NVFP4 operands: x (..., K), weight (N, K), bias (N,) -> (..., N) in x's dtype.

    quantized_weight: quantize_linear_weight(weight, recipe=recipe) made earlier from this same, unchanged weight:
    the forward then skips the weight's amax and quantization (same result); the gradient still flows to weight."""
    check_dense(x, weight, bias, recipe)
    out = _apply(x.reshape(-1, x.shape[-1]), weight, recipe, quantized_weight)
    out = out.view(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias.to(out.dtype)


def loaded_weight_mm(x2d: Tensor, weight: QuantizedWeight, *, recipe: FourOverSixRecipe) -> Tensor:
    """four_over_six_mm's forward for a weight known only by its quantization (QuantizedWeight.loaded: an inference
    engine's checkpoint weight, codes (N, K/2)): x2d (M, K) quantized by the recipe, the same op and bytes as
    training's forward; no autograd."""
    check_loaded_weight(x2d, weight, 0, recipe)
    key = recipe.plan(grouped=False).key
    return dense_fwd_quantized_weight(x2d, weight.codes, weight.scales, weight.decoded, weight.amax, key)[0]
