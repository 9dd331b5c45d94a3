"""The quantized backward's operands as the ops quantize them, dequantized: what the fidelity tool measures.

backward='quantized' (docs/numerics.md section 9) quantizes four operands besides the forward's x and W: dy for
the data gradient, dy^T and x^T for the weight gradient, W^T. `quantized_backward_operands` runs the ops' own
building blocks on them (dense.py and grouped.py `_quantized_grads`: the same specs, amaxes, layouts, transforms
and rounding, stochastic seeds taken from GRADIENT_ROUNDING in the op's order) and returns each operand next to
its dequantization (block-scaled decode times the global factor amax/(6B) of its row or block), so that its
quantization error can be read off. The ops do not call it (the fidelity tool and its telemetry do).
"""

from dataclasses import replace

import torch
from torch import Tensor

from ..dispatch.amax import run_expert_amax, run_tensor_amax, run_token_groups
from ..dispatch.backend import backends_for
from ..dispatch.quantize import padded_transpose, run_rht16_columns
from ..numerics.formats import BLOCK_SIZE
from ..numerics.reference import RowGroups, TokenBlocks, amax_per_row, global_decode_factor
from .grouped import _token_block_operand
from .operands import (Operand, quantize_columnwise, quantize_columnwise_operand, quantize_columnwise_row_scaled,
                       quantize_operand)
from .recipe import FourOverSixRecipe
from .rounding import GRADIENT_ROUNDING

ROLES = ("dy", "dyT", "xT", "wT")


def _dequantized(op: Operand, row_factor: Tensor, quantizer: str) -> Tensor:
    """op's decode in FP32 times each row's (R,) or element's (R, C) global decode factor."""
    decoded = op.block_scaled(quantizer).float()
    return decoded * (row_factor[:, None] if row_factor.dim() == 1 else row_factor)


def _rows_factor(amax: Tensor, rows: int, bound: int, groups: RowGroups | None = None) -> Tensor:
    return global_decode_factor(amax_per_row(amax, rows, groups).float().expand(rows), bound)


def _columnwise(t: Tensor, op: Operand, amax: Tensor, spec, quantizer: str) -> tuple[Tensor, Tensor]:
    """(t^T as the columnwise quantizer reads it: transformed by spec.transform, zero-padded to ceil16(M)
    tokens; its dequantized operand), amax () or one per row of t^T."""
    ref = padded_transpose(run_rht16_columns(t, quantizer) if spec.transform != "none" else t)
    return ref, _dequantized(op, _rows_factor(amax, ref.shape[0], spec.scale_bound), quantizer)


def _token_blocks_pair(t: Tensor, tb, op: Operand, amax: Tensor, spec, quantizer: str) -> tuple[Tensor, Tensor]:
    """(t^T in the grouped wgrad's token-block layout (C, P), transformed by spec.transform; its dequantized
    operand), amax per group (E,) or per group and column (E, C)."""
    blocked = tb.gather(t)
    if spec.transform != "none":
        blocked = run_rht16_columns(blocked, quantizer)
    factor = global_decode_factor(tb.block_amax(amax), spec.scale_bound).repeat_interleave(BLOCK_SIZE, dim=0)
    factor = factor[None, :] if factor.dim() == 1 else factor.t()
    return blocked.t(), _dequantized(op, factor.expand(blocked.shape[1], -1), quantizer)


@torch.no_grad()
def quantized_backward_operands(dy: Tensor, x: Tensor, w: Tensor, recipe: FourOverSixRecipe,
                                offs: Tensor | None = None) -> dict[str, tuple[Tensor, Tensor]]:
    """{role: (operand, its dequantization)} for roles dy, dyT, xT, wT of the GEMM x (M, K) times w^T with
    output gradient dy (M, N), under `recipe` with backward='quantized': dense (w (N, K), offs None) or grouped
    (w (E, N, K) experts, offs the int32 inclusive token-group ends). Each operand in the layout its quantizer
    reads: dy (M, N) (grouped: one amax per token group, columns zero-padded to a multiple of 16); dyT and xT
    transposed, blocked along the tokens (dense: zero-padded to ceil16(M); grouped: each group padded to 16-token
    blocks), Hadamard-transformed with wgrad_rht, xT of row-scaled activations with its column amaxes; wT the
    forward's tiles transposed (16x16) or W^T quantized columnwise (1x16). Stochastic rounding takes its seeds
    from GRADIENT_ROUNDING as the op does: dy first, then dyT."""
    grouped = offs is not None
    p = replace(recipe, backward="quantized").plan(grouped=grouped)  # wgrad_rht, gradient_rounding kept
    b = backends_for(p.quantizer, p.gemm, dy.device)
    q = b.quantizer
    out = {}
    if not grouped:
        dy_amax = run_tensor_amax(dy, q)
        dyq = quantize_operand(dy, dy_amax, p.dy, b, seed=GRADIENT_ROUNDING.seed_for(p.dy))
        out["dy"] = dy, _dequantized(dyq, _rows_factor(dy_amax, dy.shape[0], p.dy.scale_bound), q)
        dy_col, dy_col_amax = quantize_columnwise_operand(dy, dy_amax, p.dy_t, b,
                                                          seed=GRADIENT_ROUNDING.seed_for(p.dy_t))
        out["dyT"] = _columnwise(dy, dy_col, dy_col_amax, p.dy_t, q)
        if p.x_t.scaling == "row":
            x_col, x_col_amax = quantize_columnwise_row_scaled(x, p.x_t, b)
        else:
            x_col, x_col_amax = quantize_columnwise_operand(x, run_tensor_amax(x, q), p.x_t, b)
        out["xT"] = _columnwise(x, x_col, x_col_amax, p.x_t, q)
        w_amax = run_tensor_amax(w, q)
        if p.w_t.block == "16x16":
            wq = quantize_operand(w, w_amax, p.w, b)  # the forward's tiles (not counted in MAP4_STATS)
            out["wT"] = w.t(), _dequantized(wq, _rows_factor(w_amax, w.shape[0], p.w.scale_bound), q).t()
        else:
            out["wT"] = _columnwise(w, quantize_columnwise(w, w_amax, p.w_t, b), w_amax, p.w_t, q)
        return out
    experts, n, k = w.shape
    rows = x.shape[0]
    a_amax, group_of_row, _ = run_token_groups(x, offs, p.row_scaled, q)
    dy_amax = run_token_groups(dy, offs, False, q)[0]
    pad_n = -n % BLOCK_SIZE
    dy_rows = torch.nn.functional.pad(dy, (0, pad_n))
    groups = RowGroups(group_of_row, experts, amax_by_group=True)
    dyq = quantize_operand(dy_rows, dy_amax, p.dy, b, groups, seed=GRADIENT_ROUNDING.seed_for(p.dy))
    ref = torch.where((group_of_row < experts)[:, None], dy_rows, 0)
    out["dy"] = ref, _dequantized(dyq, _rows_factor(dy_amax, rows, p.dy.scale_bound, groups), q)
    tb = TokenBlocks.of(offs, rows)
    dy_col, dy_t_amax = _token_block_operand(dy, tb, dy_amax, p.dy_t, b, group_of_row,
                                             GRADIENT_ROUNDING.seed_for(p.dy_t))
    out["dyT"] = _token_blocks_pair(dy, tb, dy_col, dy_t_amax, p.dy_t, q)
    x_col, x_t_amax = _token_block_operand(x, tb, a_amax, p.x_t, b, group_of_row)
    out["xT"] = _token_blocks_pair(x, tb, x_col, x_t_amax, p.x_t, q)
    w_rows = w.reshape(experts * n, k)
    if p.w_t.block == "16x16":
        w_amax = run_expert_amax(w_rows, experts, q)
        wq = quantize_operand(w_rows, w_amax, p.w, b)
        deq = _dequantized(wq, _rows_factor(w_amax, experts * n, p.w.scale_bound), q)
        out["wT"] = (w.transpose(1, 2).reshape(experts * k, n),
                     deq.view(experts, n, k).transpose(1, 2).reshape(experts * k, n))
    else:
        w_amax = run_expert_amax(w_rows, experts, q)
        wt_rows = torch.nn.functional.pad(w.transpose(1, 2).reshape(experts * k, n), (0, pad_n))
        w_col = quantize_operand(wt_rows, w_amax, p.w_t, b)
        out["wT"] = wt_rows, _dequantized(w_col, _rows_factor(w_amax, experts * k, p.w_t.scale_bound), q)
    return out
