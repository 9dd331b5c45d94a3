"""Four-over-six grouped GEMM for MoE routed experts, in the calling convention of torch._grouped_mm.

All token groups and all experts are quantized in one call each: activations with their group's amax (or
their own, row-scaled), read by each row's group inside the quantizer; expert weights flattened to (E*N, K),
each expert's amax covering its N rows (16x16 tiles stay inside an expert when N % 16 == 0). Rows at and past
offs[-1] are not tokens: no amax reads them, their output rows are zeros and their gradient rows are zeros.
"""

import torch
from torch import Tensor

from ..dispatch.amax import run_expert_amax, run_token_groups
from ..dispatch.quantize import run_dequantize
from ..numerics.reference import RowGroups
from .checks import check_grouped, check_offs_values
from .custom import compile_opaque_op
from .gemm import decode_on, grouped_gemm_nt
from .operands import quantize_46
from .recipe import FourOverSixRecipe, recipe_from_key

_F8 = torch.float8_e4m3fn


def _expert_weights(B_t: Tensor, quantizer: str) -> tuple[Tensor, Tensor]:
    """(E, K, N) transposed view -> (E*N, K) rows blocked along K, and the per-expert amax (E,)."""
    experts, k, n = B_t.shape
    w = B_t.transpose(-2, -1).reshape(experts * n, k)
    return w, run_expert_amax(w, experts, quantizer)


def _token_rows(group_of_row: Tensor, offs: Tensor, r: FourOverSixRecipe) -> RowGroups:
    """A's rows by token group: the amax per group, or per row when row-scaled."""
    return RowGroups(group_of_row, offs.numel(), amax_by_group=not r.row_scaled)


@compile_opaque_op("grouped_fwd")
def grouped_fwd(A: Tensor, B_t: Tensor, offs: Tensor,
                recipe: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Output (M, N) in A's dtype, then A codes, scales, amax ((E,) or (M,)), W codes, scales, amax (E,), the
    group of each row (M,) (group_index) and which groups are empty (E,) (the backward reuses both)."""
    r = recipe_from_key(recipe)
    check_offs_values(offs, A.shape[0])
    # the saved amax: per row (row-scaled) or per token group; rows past offs[-1] get 0 and never reach a
    # token's amax
    a_amax, group_of_row, empty_groups = run_token_groups(A, offs, r.row_scaled, r.quantizer)
    decode = decode_on(A.device, r.gemm)
    aq = quantize_46(A, a_amax, "1x16", r, decode, weight=False, groups=_token_rows(group_of_row, offs, r))
    w, w_amax = _expert_weights(B_t, r.quantizer)
    wq = quantize_46(w, w_amax, r.weight_block, r, decode, weight=True)
    out = grouped_gemm_nt(aq, a_amax, not r.row_scaled, wq, w_amax, offs, group_of_row, A.dtype, r)
    return out, aq.codes, aq.scales, a_amax, wq.codes, wq.scales, w_amax, group_of_row, empty_groups


@grouped_fwd.register_fake
def _(A, B_t, offs, recipe):
    (m, k), (e, _, n) = A.shape, B_t.shape
    u8, f32 = torch.uint8, torch.float32
    row_scaled = recipe_from_key(recipe).row_scaled
    return (A.new_empty(m, n), A.new_empty(m, k // 2, dtype=u8), A.new_empty(m, k // 16, dtype=_F8),
            A.new_empty(m if row_scaled else e, dtype=f32), A.new_empty(e * n, k // 2, dtype=u8),
            A.new_empty(e * n, k // 16, dtype=_F8), A.new_empty(e, dtype=f32), A.new_empty(m, dtype=torch.int64),
            A.new_empty(e, dtype=torch.bool))


@compile_opaque_op("grouped_bwd")
def grouped_bwd(dy: Tensor, A: Tensor | None, B_t: Tensor | None, offs: Tensor, group_of_row: Tensor,
                empty_groups: Tensor, a_codes: Tensor | None, a_scales: Tensor | None, a_amax: Tensor | None,
                w_codes: Tensor | None, w_scales: Tensor | None, w_amax: Tensor | None, recipe: str,
                a_dtype: torch.dtype, w_dtype: torch.dtype, need_da: bool, need_dw: bool) -> tuple[Tensor, Tensor]:
    """(dA (M, K) in A's dtype, dW (E, N, K) in the weights' dtype: the gradient of B_t, untransposed); bf16
    grouped GEMMs (the activations' dtype) on the original or the dequantized forward operands. group_of_row
    and empty_groups are the forward's."""
    r = recipe_from_key(recipe)
    experts = offs.numel()
    if r.backward == "dequantized":
        A = run_dequantize(a_codes, a_scales, a_amax, r.scale_bound, a_dtype, r.quantizer,
                           _token_rows(group_of_row, offs, r))
        w = run_dequantize(w_codes, w_scales, w_amax, r.scale_bound, a_dtype, r.quantizer)
        w = w.view(experts, w.shape[0] // experts, -1)
    else:
        w = B_t.transpose(-2, -1).to(a_dtype)
    dy = dy.to(a_dtype)
    dA = dW = dy.new_empty(0)
    # zeroed in place (no second buffer of the gradient's size): rows past offs[-1] come back uninitialized from
    # _grouped_mm, and empty groups' weight gradients hold whatever the kernel leaves there
    if need_da:
        dA = torch._grouped_mm(dy, w, offs=offs).masked_fill_((group_of_row >= experts)[:, None], 0)
    if need_dw:
        dW = torch._grouped_mm(dy.t(), A, offs=offs).masked_fill_(empty_groups[:, None, None], 0).to(w_dtype)
    return dA, dW


@grouped_bwd.register_fake
def _(dy, A, B_t, offs, group_of_row, empty_groups, a_codes, a_scales, a_amax, w_codes, w_scales, w_amax, recipe,
      a_dtype, w_dtype, need_da, need_dw):
    m, n = dy.shape
    k = A.shape[1] if A is not None else a_codes.shape[1] * 2
    dA = dy.new_empty(m, k, dtype=a_dtype) if need_da else dy.new_empty(0)
    dW = dy.new_empty(offs.shape[0], n, k, dtype=w_dtype) if need_dw else dy.new_empty(0)
    return dA, dW


class _GroupedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B_t, offs, recipe: FourOverSixRecipe):
        key = recipe.key
        out, ac, as_, aa, wc, ws, wa, group_of_row, empty_groups = grouped_fwd(A, B_t, offs, key)
        if recipe.backward == "dequantized":  # only codes, E4M3 scales, FP32 amax, offs and the groups stay alive
            ctx.save_for_backward(None, None, offs, group_of_row, empty_groups, ac, as_, aa, wc, ws, wa)
        else:
            ctx.save_for_backward(A, B_t, offs, group_of_row, empty_groups, None, None, None, None, None, None)
        ctx.config = (key, A.dtype, B_t.dtype)
        return out

    @staticmethod
    def backward(ctx, dy):
        key, a_dtype, w_dtype = ctx.config
        need_da, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dA, dW = grouped_bwd(dy.contiguous(), *ctx.saved_tensors, key, a_dtype, w_dtype, need_da, need_dw)
        return (dA if need_da else None), (dW.transpose(-2, -1) if need_dw else None), None, None


def four_over_six_grouped_mm(A: Tensor, B_t: Tensor, offs: Tensor, *, recipe: FourOverSixRecipe) -> Tensor:
    """torch._grouped_mm(A, B_t, offs=offs) with four-over-six NVFP4 operands -> (M, N) in A's dtype.

    A (M, K) rows sorted by expert; B_t (E, K, N) the transposed view of (E, N, K) expert weights; offs int32
    inclusive group ends (length E, offs[-1] <= M). Backward: recipe.resolved_backward(grouped=True).
    """
    check_grouped(A, B_t, offs, recipe)
    return _GroupedFunction.apply(A, B_t, offs, recipe.resolve(grouped=True))
