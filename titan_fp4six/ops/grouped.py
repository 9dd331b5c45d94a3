"""Four-over-six grouped GEMM for MoE routed experts, in the calling convention of torch._grouped_mm.

All token groups and all experts are quantized in one call each: activations with their group's amax (or
their own, row-scaled), read by each row's group inside the quantizer; expert weights flattened to (E*N, K),
each expert's amax covering its N rows (16x16 tiles stay inside an expert when N % 16 == 0). Rows at and past
offs[-1] are not tokens: no amax reads them, their output rows are zeros and their gradient rows are zeros.
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..numerics.groups import RowGroups
from ..numerics.reference import amax_per_row, global_decode_factor
from ..quant.amax import check_offs_values, run_token_groups
from ..quant.epilogue import ZERO_ROWS
from ..quant.grad_operands import grouped_grad_operands, grouped_token_operand
from ..quant.library import compile_opaque_op
from ..quant.operands import GemmQuantizers, Operand, gemm_quantizers
from ..quant.primitives import pick
from ..quant.process_state import MAP4_STATS
from ..quant.quantize import run_decode_block_scaled, run_dequantize
from ..quant.recipe import FourOverSixRecipe, GemmPlan, plan_of_key
from .checks import check_expert_weights, check_grouped, check_loaded_weight
from .gemm import grouped_gemm_nt, grouped_wgrad_nt
from .weights import QuantizedWeight, quantize_rows, quantize_weight_rows, source_of

_F8 = torch.float8_e4m3fn


def _expert_rows(B_t: Tensor) -> Tensor:
    """(E, K, N) transposed view -> (E*N, K) rows blocked along K (each expert's N rows one run)."""
    experts, k, n = B_t.shape
    return B_t.transpose(-2, -1).reshape(experts * n, k)


def _token_rows(group_of_row: Tensor, offs: Tensor, row_scaled: bool) -> RowGroups:
    """A's rows by token group: the amax per group, or per row when row-scaled."""
    return RowGroups(group_of_row, offs.numel(), amax_by_group=not row_scaled)


def _quantize_tokens(A: Tensor, offs: Tensor, q: GemmQuantizers) -> tuple[Operand, Tensor, Tensor, Tensor]:
    """(A's operand, A's amax, group of each row, empty groups): A's rows quantized by the plan's x role."""
    check_offs_values(offs, A.shape[0])
    # the saved amax: per row (row-scaled) or per token group; rows past offs[-1] get 0 and never reach a
    # token's amax
    a_amax, group_of_row, empty_groups = run_token_groups(A, offs, q.row_scaled, q.backends.quantizer)
    aq = q.x.rows(A, a_amax, _token_rows(group_of_row, offs, q.row_scaled))
    return aq, a_amax, group_of_row, empty_groups


def _forward(A: Tensor, offs: Tensor, weights: list[tuple[Operand, Tensor]], q: GemmQuantizers):
    """(outputs, A's operand, A's amax, group of each row, empty groups): A quantized once, times each experts'
    operand (with its amax)."""
    aq, a_amax, group_of_row, empty_groups = _quantize_tokens(A, offs, q)
    outs = [grouped_gemm_nt(aq, a_amax, not q.row_scaled, wq, w_amax, offs, group_of_row, q.w.bound, A.dtype,
                            q.backends) for wq, w_amax in weights]
    return outs, aq, a_amax, group_of_row, empty_groups


@compile_opaque_op("grouped_fwd")
def grouped_fwd(A: Tensor, B_ts: list[Tensor], offs: Tensor, recipe: str) -> tuple[
        list[Tensor], Tensor, Tensor, Tensor, list[Tensor], list[Tensor], list[Tensor], Tensor, Tensor]:
    """A times each of B_ts: the outputs (M, N_i) in A's dtype, then A codes, scales, amax ((E,) or (M,)), each
    weight's codes, scales, amax (E,), the group of each row (M,) (group_index) and which groups are empty (E,)
    (the backward reuses both)."""
    q = gemm_quantizers(recipe, True, A.device)
    weights = [quantize_weight_rows(_expert_rows(B_t), B_t.shape[0], q) for B_t in B_ts]
    outs, aq, a_amax, group_of_row, empty_groups = _forward(A, offs, weights, q)
    return (outs, aq.codes, aq.scales, a_amax, [wq.codes for wq, _ in weights], [wq.scales for wq, _ in weights],
            [amax for _, amax in weights], group_of_row, empty_groups)


@grouped_fwd.register_fake
def _(A, B_ts, offs, recipe):
    m, k = A.shape
    a_codes, a_scales, a_amax, group_of_row, empty_groups = _fake_a_side(A, offs, recipe)
    shapes = [(e * n, n, e) for e, _, n in (B_t.shape for B_t in B_ts)]
    return ([A.new_empty(m, n) for _, n, _ in shapes], a_codes, a_scales, a_amax,
            [A.new_empty(rows, k // 2, dtype=torch.uint8) for rows, _, _ in shapes],
            [A.new_empty(rows, k // 16, dtype=_F8) for rows, _, _ in shapes],
            [A.new_empty(e, dtype=torch.float32) for _, _, e in shapes], group_of_row, empty_groups)


@compile_opaque_op("grouped_fwd_quantized_weight")
def grouped_fwd_quantized_weight(A: Tensor, offs: Tensor, w_codes: list[Tensor], w_scales: list[Tensor],
                                 w_decoded: list[Tensor | None], w_amax: list[Tensor],
                                 recipe: str) -> tuple[list[Tensor], Tensor, Tensor, Tensor, Tensor, Tensor]:
    """grouped_fwd with the experts' weights already quantized (ops.weights.QuantizedWeight, one per GEMM):
    the outputs, then A codes, scales, amax, the group of each row and which groups are empty."""
    q = gemm_quantizers(recipe, True, A.device)
    weights = [(Operand(*w), amax) for *w, amax in zip(w_codes, w_scales, w_decoded, w_amax)]
    outs, aq, a_amax, group_of_row, empty_groups = _forward(A, offs, weights, q)
    return outs, aq.codes, aq.scales, a_amax, group_of_row, empty_groups


@grouped_fwd_quantized_weight.register_fake
def _(A, offs, w_codes, w_scales, w_decoded, w_amax, recipe):
    return ([A.new_empty(A.shape[0], c.shape[0] // offs.shape[0]) for c in w_codes],
            *_fake_a_side(A, offs, recipe))


def _fake_a_side(A: Tensor, offs: Tensor, recipe: str) -> tuple[Tensor, ...]:
    """Fake A codes, scales, amax, group of each row and empty groups."""
    m, k = A.shape
    e = offs.shape[0]
    row_scaled = plan_of_key(recipe, True).row_scaled
    return (A.new_empty(m, k // 2, dtype=torch.uint8), A.new_empty(m, k // 16, dtype=_F8),
            A.new_empty(m if row_scaled else e, dtype=torch.float32), A.new_empty(m, dtype=torch.int64),
            A.new_empty(e, dtype=torch.bool))


def _quantized_grads(dy, A, B_t, offs, group_of_row, empty_groups, a_amax, w_codes, w_scales, w_decoded, w_amax,
                     q: GemmQuantizers, a_dtype, w_dtype, need_da, need_dw, token_operand):
    """Backward 'quantized' of one grouped GEMM, per expert: dgrad dA = Q(dy) x Q_col(W_e), wgrad dW_e =
    Q_col(dy_e)^T x Q_col(A_e) over the group's 16-token blocks (the padded group ends), the operands of
    quant.grad_operands.grouped_grad_operands (token_operand: A^T's, shared by the GEMMs of one A). Rows past
    offs[-1] are read by no amax and no GEMM: zero dA rows; empty groups: zero dW."""
    g = grouped_grad_operands(dy, A, B_t, offs, group_of_row, a_amax, Operand(w_codes, w_scales, w_decoded), w_amax,
                              q, need_da, need_dw, token_operand)
    dA = dW = dy.new_empty(0)
    if need_da:
        dA = grouped_gemm_nt(g.dy, g.dy_amax, True, g.w_t, w_amax, offs, group_of_row, q.dy.bound, a_dtype,
                             q.backends, w_bound=q.w_t.bound)
    if need_dw:
        dW = grouped_wgrad_nt(g.dy_t, g.dy_t_amax, q.dy_t.bound, g.x_t, g.x_t_amax, q.x_t.bound, g.tokens.ends,
                              empty_groups, w_dtype, q.backends)
    return dA, dW


def _high_precision_grads(dy, A, w, offs, group_of_row, empty_groups, q: GemmQuantizers, a_dtype, w_dtype, need_da,
                          need_dw):
    """Backward 'high_precision' / 'dequantized' of one grouped GEMM: bf16 grouped GEMMs (the activations' dtype)
    on A and w (E, N, K), the original or the dequantized forward operands."""
    experts = offs.numel()
    dy = dy.to(a_dtype)
    dA = dW = dy.new_empty(0)
    # zeroed in place (no second buffer of the gradient's size): rows past offs[-1] come back uninitialized from
    # _grouped_mm, and empty groups' weight gradients hold whatever the kernel leaves there
    if need_da:
        dA = torch._grouped_mm(dy, w, offs=offs)
        dA = pick(ZERO_ROWS, q.backends.quantizer, dA)(dA, group_of_row, experts)
    if need_dw:
        dW = torch._grouped_mm(dy.t(), A, offs=offs)
        dW = pick(ZERO_ROWS, q.backends.quantizer, dW)(dW, empty_groups, 1).to(w_dtype)
    return dA, dW


@compile_opaque_op("grouped_bwd")
def grouped_bwd(dys: list[Tensor], A: Tensor | None, B_ts: list[Tensor | None], offs: Tensor, group_of_row: Tensor,
                empty_groups: Tensor, a_codes: Tensor | None, a_scales: Tensor | None, a_amax: Tensor | None,
                w_codes: list[Tensor | None], w_scales: list[Tensor | None], w_decoded: list[Tensor | None],
                w_amax: list[Tensor | None], recipe: str, a_dtype: torch.dtype, w_dtype: torch.dtype, need_da: bool,
                need_dw: list[bool]) -> tuple[Tensor, list[Tensor]]:
    """(dA (M, K) in A's dtype, each GEMM's dW (E, N_i, K) in the weights' dtype: the gradient of its B_t,
    untransposed) of the grouped GEMMs of one A, given each one's output gradient dys[i]: the quantized backward
    (_quantized_grads), or bf16 grouped GEMMs on the original or the dequantized forward operands. The GEMMs run
    last first, the order in which autograd would run separate GEMMs of A (so a stochastic dy takes the seeds
    it would take there), and dA sums theirs in that order. group_of_row and empty_groups are the forward's;
    w_decoded: the forward weights' decodes where they outlive the forward (QuantizedWeights), else None."""
    q = gemm_quantizers(recipe, True, dys[0].device)
    backward = q.plan.backward
    weights = list(zip(B_ts, w_codes, w_scales, w_decoded, w_amax))
    grads = {}
    if backward == "quantized":
        token_operand = grouped_token_operand(A, offs, group_of_row, a_amax, q) if any(need_dw) else None
        for i in reversed(range(len(dys))):
            B_t, codes, scales, decoded, amax = weights[i]
            grads[i] = _quantized_grads(dys[i], A, B_t, offs, group_of_row, empty_groups, a_amax, codes, scales,
                                        decoded, amax, q, a_dtype, w_dtype, need_da, need_dw[i], token_operand)
    else:
        experts, quantizer = offs.numel(), q.backends.quantizer
        if backward == "dequantized":
            A = run_dequantize(a_codes, a_scales, a_amax, q.x.bound, a_dtype, quantizer,
                               _token_rows(group_of_row, offs, q.row_scaled))
        for i in reversed(range(len(dys))):
            B_t, codes, scales, _, amax = weights[i]
            if backward == "dequantized":
                w = run_dequantize(codes, scales, amax, q.w.bound, a_dtype, quantizer)
                w = w.view(experts, w.shape[0] // experts, -1)
            else:
                w = B_t.transpose(-2, -1).to(a_dtype)
            grads[i] = _high_precision_grads(dys[i], A, w, offs, group_of_row, empty_groups, q, a_dtype, w_dtype,
                                             need_da, need_dw[i])
    dA = dys[0].new_empty(0)
    if need_da:  # summed in place, in the GEMMs' order: a + b is b + a, so these are autograd's bytes
        dA, *rest = (grads[i][0] for i in grads)
        for d in rest:
            dA.add_(d)
    return dA, [grads[i][1] for i in range(len(dys))]


@grouped_bwd.register_fake
def _(dys, A, B_ts, offs, group_of_row, empty_groups, a_codes, a_scales, a_amax, w_codes, w_scales, w_decoded,
      w_amax, recipe, a_dtype, w_dtype, need_da, need_dw):
    m = dys[0].shape[0]
    k = A.shape[1] if A is not None else a_codes.shape[1] * 2
    dA = dys[0].new_empty(m, k, dtype=a_dtype) if need_da else dys[0].new_empty(0)
    dWs = [dy.new_empty(offs.shape[0], dy.shape[1], k, dtype=w_dtype) if need else dy.new_empty(0)
           for dy, need in zip(dys, need_dw)]
    return dA, dWs


class _GroupedSaved(NamedTuple):
    """What the grouped backward keeps, in grouped_bwd's argument order: A's side once, the weights' side one
    entry per GEMM; None where its backward mode needs nothing."""

    A: Tensor | None
    B_ts: list
    offs: Tensor
    group_of_row: Tensor
    empty_groups: Tensor
    a_codes: Tensor | None
    a_scales: Tensor | None
    a_amax: Tensor | None
    w_codes: list
    w_scales: list
    w_decoded: list
    w_amax: list

    @staticmethod
    def of(p: GemmPlan, A, B_ts, offs, group_of_row, empty_groups, ac, as_, aa, wc, ws, w_dec, wa) -> "_GroupedSaved":
        groups = (offs, group_of_row, empty_groups)
        none = [None] * len(B_ts)
        if p.backward == "dequantized":  # only codes, E4M3 scales, FP32 amax, offs and the groups stay alive
            return _GroupedSaved(None, none, *groups, ac, as_, aa, wc, ws, none, wa)
        if p.backward == "high_precision":
            return _GroupedSaved(A, list(B_ts), *groups, None, None, None, none, none, none, none)
        if p.w_t.block == "16x16":  # quantized: A for its columnwise quantization, W's tiles transpose
            return _GroupedSaved(A, none, *groups, None, None, aa, wc, ws, w_dec, wa)
        return _GroupedSaved(A, list(B_ts), *groups, None, None, aa, none, none, none, wa)

    def flat(self) -> list:
        """The fields as one list of tensors (or None) for save_for_backward; unflat(that, GEMMs) inverts it."""
        return [t for field in self for t in (field if isinstance(field, list) else [field])]

    @classmethod
    def unflat(cls, tensors, gemms: int) -> "_GroupedSaved":
        it = iter(tensors)
        return cls(*(([next(it) for _ in range(gemms)] if name in _LIST_FIELDS else next(it))
                     for name in cls._fields))


_LIST_FIELDS = tuple(name for name, kind in _GroupedSaved.__annotations__.items() if kind is list)  # one per GEMM


class _GroupedFunction(torch.autograd.Function):
    """The grouped GEMMs A x B_t of one A (its quantization shared), each B_t's output a result."""

    @staticmethod
    def forward(ctx, A, offs, p: GemmPlan, qws: tuple[QuantizedWeight, ...] | None, *B_ts):
        key = p.key
        if qws is None:
            outs, ac, as_, aa, wc, ws, wa, group_of_row, empty_groups = grouped_fwd(A, list(B_ts), offs, key)
            w_dec = [None] * len(B_ts)
        else:
            wc, ws, w_dec, wa = ([getattr(qw, f) for qw in qws] for f in ("codes", "scales", "decoded", "amax"))
            outs, ac, as_, aa, group_of_row, empty_groups = grouped_fwd_quantized_weight(A, offs, wc, ws, w_dec, wa,
                                                                                         key)
        saved = _GroupedSaved.of(p, A, B_ts, offs, group_of_row, empty_groups, ac, as_, aa, wc, ws, w_dec, wa)
        ctx.save_for_backward(*saved.flat())
        ctx.config = (key, A.dtype, B_ts[0].dtype, len(B_ts))
        ctx.set_materialize_grads(False)  # an unused output's GEMM gets no backward, as a separate call's would not
        return tuple(outs)

    @staticmethod
    def backward(ctx, *dys):
        key, a_dtype, w_dtype, gemms = ctx.config
        used = [i for i, dy in enumerate(dys) if dy is not None]
        need_da, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[4:]
        dWs = [None] * gemms
        if not used or not (need_da or any(need_dw[i] for i in used)):
            return None, None, None, None, *dWs
        saved = _GroupedSaved.unflat(ctx.saved_tensors, gemms)
        saved = saved._replace(**{f: [getattr(saved, f)[i] for i in used] for f in _LIST_FIELDS})
        dA, grads = grouped_bwd([dys[i].contiguous() for i in used], *saved, key, a_dtype, w_dtype, need_da,
                                [need_dw[i] for i in used])
        for i, dW in zip(used, grads):
            dWs[i] = dW.transpose(-2, -1) if need_dw[i] else None
        return (dA if need_da else None), None, None, None, *dWs


def quantize_grouped_weight(B_t: Tensor, *, recipe: FourOverSixRecipe) -> QuantizedWeight:
    """Expert weights B_t (E, K, N) (the transposed view of (E, N, K)) quantized as four_over_six_grouped_mm's
    forward quantizes them, to pass as its quantized_weight while they are unchanged."""
    check_expert_weights(B_t, recipe)
    return quantize_rows(_expert_rows(B_t), B_t.shape[0], recipe.plan(grouped=True), B_t)


def quantize_grouped_weight_shard(w: Tensor, amax: Tensor, *, recipe: FourOverSixRecipe) -> tuple[Tensor, Tensor]:
    """(codes (E'*N', K/2), scales (E'*N', K/16)) of a shard w (E', N', K) of expert weights (E, N, K): whole
    experts or whole rows of them, with those experts' amaxes (E',) taken over their whole weights. Blocks run
    along K and the amax is given, so these are quantize_grouped_weight's bytes for these rows: the shards of a
    sharded weight assemble into the whole weight's quantization (rl/weight_sync.py)."""
    check_expert_weights(w.transpose(-2, -1), recipe)
    experts, rows, k = w.shape
    if amax.shape != (experts,) or amax.dtype != torch.float32:
        raise ValueError(f"amax must be float32 of shape ({experts},) (one per expert of the shard), got "
                         f"{amax.dtype} {tuple(amax.shape)}")
    q = gemm_quantizers(recipe.plan(grouped=True).key, True, w.device)
    with torch.no_grad(), MAP4_STATS.paused():
        operand = q.w.rows(w.reshape(experts * rows, k).contiguous(), amax.contiguous())
    return operand.codes, operand.scales


def assembled_grouped_weight(codes: Tensor, scales: Tensor, amax: Tensor, dtype: torch.dtype, *,
                             recipe: FourOverSixRecipe) -> QuantizedWeight:
    """The QuantizedWeight of whole expert weights (E, N, K) in `dtype` from their codes (E*N, K/2), scales
    (E*N, K/16) and amaxes (E,) (assembled from quantize_grouped_weight_shard's pieces): what
    quantize_grouped_weight(w.transpose(-2, -1)) returns, its decode included, for the forward to check and use."""
    experts = amax.shape[0]
    rows, half = codes.shape
    plan = recipe.plan(grouped=True)
    q = gemm_quantizers(plan.key, True, codes.device)
    decoded = None if q.backends.fp4 else run_decode_block_scaled(codes, scales, q.backends.quantizer, torch.bfloat16)
    return QuantizedWeight(codes, scales, decoded, amax,
                           source_of((experts, half * 2, rows // experts), dtype, codes.device, plan))


def decode_grouped_activations(A: Tensor, offs: Tensor, *, recipe: FourOverSixRecipe) -> tuple[Tensor, Tensor]:
    """(bf16 block-scaled decode (M, K), each row's global decode factor amax/(6B) (M,)) of A's rows as
    four_over_six_grouped_mm's forward quantizes them, for a caller that runs its own GEMM on the decode (the RL
    consistent mode's batch-invariant one). Not counted in MAP4_STATS: it is no training forward."""
    q = gemm_quantizers(recipe.plan(grouped=True).key, True, A.device)
    with MAP4_STATS.paused():
        aq, a_amax, group_of_row, _ = _quantize_tokens(A, offs, q)
    amax = amax_per_row(a_amax, A.shape[0], _token_rows(group_of_row, offs, q.row_scaled))
    return aq.block_scaled(q.backends.quantizer), global_decode_factor(amax, q.x.bound)


def four_over_six_grouped_mm(A: Tensor, B_t: Tensor, offs: Tensor, *, recipe: FourOverSixRecipe,
                             quantized_weight: QuantizedWeight | None = None) -> Tensor:
    """torch._grouped_mm(A, B_t, offs=offs) with four-over-six NVFP4 operands -> (M, N) in A's dtype.

    A (M, K) rows sorted by expert; B_t (E, K, N) the transposed view of (E, N, K) expert weights; offs int32
    inclusive group ends (length E, offs[-1] <= M). Backward: recipe.plan(grouped=True).backward.
    quantized_weight: quantize_grouped_weight(B_t, recipe=recipe) made earlier from these same, unchanged
    weights: the forward skips their amax and quantization (same result); the gradient still flows to B_t.
    """
    qws = None if quantized_weight is None else (quantized_weight,)
    return four_over_six_grouped_mms(A, (B_t,), offs, recipe=recipe, quantized_weights=qws)[0]


def four_over_six_grouped_mms(A: Tensor, B_ts: Sequence[Tensor], offs: Tensor, *, recipe: FourOverSixRecipe,
                              quantized_weights: Sequence[QuantizedWeight] | None = None) -> tuple[Tensor, ...]:
    """four_over_six_grouped_mm(A, B_t, offs) for each B_t of B_ts, A's rows quantized once for all of them (and,
    in the quantized backward, A^T once for all their wgrads): the experts' gate and up projections (w1, w3)
    read the same tokens. The same bytes as separate calls, gradients included: the backward runs the GEMMs of
    the used outputs last first, as autograd runs separate GEMMs of one A (so a stochastic dy takes the same
    seeds), and sums dA in that order, which is autograd's where nothing else adds to A's gradient between
    them. quantized_weights: one QuantizedWeight per B_t (quantize_grouped_weight), or None."""
    if not B_ts:
        raise ValueError("four_over_six_grouped_mms needs at least one B_t")
    for B_t in B_ts:
        check_grouped(A, B_t, offs, recipe)
        if B_t.dtype != B_ts[0].dtype:
            raise TypeError(f"B_ts must share one dtype (their gradients' dtype), got {B_ts[0].dtype} and {B_t.dtype}")
    plan = recipe.plan(grouped=True)
    if quantized_weights is not None:
        if len(quantized_weights) != len(B_ts):
            raise ValueError(f"quantized_weights holds {len(quantized_weights)} weights for {len(B_ts)} B_ts; "
                             "give one per B_t, or None")
        for i, (qw, B_t) in enumerate(zip(quantized_weights, B_ts)):
            qw.check(B_t, plan, f"B_ts[{i}]" if len(B_ts) > 1 else "B_t")
        quantized_weights = tuple(quantized_weights)
    return _GroupedFunction.apply(A, offs, plan, quantized_weights, *B_ts)


def loaded_weight_grouped_mm(A: Tensor, offs: Tensor, weight: QuantizedWeight, *, recipe: FourOverSixRecipe) -> Tensor:
    """four_over_six_grouped_mm's forward for expert weights known only by their quantization (QuantizedWeight.loaded:
    codes (E*N, K/2), amax (E,), an inference engine's checkpoint): A (M, K) by token groups offs, the same op and
    bytes as training's forward; no autograd."""
    return loaded_weight_grouped_mms(A, offs, (weight,), recipe=recipe)[0]


def loaded_weight_grouped_mms(A: Tensor, offs: Tensor, weights: Sequence[QuantizedWeight], *,
                              recipe: FourOverSixRecipe) -> tuple[Tensor, ...]:
    """loaded_weight_grouped_mm for each of `weights`, A quantized once (as four_over_six_grouped_mms)."""
    for weight in weights:
        check_loaded_weight(A, weight, offs.numel(), recipe)
    key = recipe.plan(grouped=True).key
    return tuple(grouped_fwd_quantized_weight(A, offs, [w.codes for w in weights], [w.scales for w in weights],
                                              [w.decoded for w in weights], [w.amax for w in weights], key)[0])
