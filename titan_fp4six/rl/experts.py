"""Routed experts for rollouts: expert weights quantized once per weight refresh, not once per decode step.

`ExpertWeightCache` holds each converted experts module's three weights as the emulated GEMM consumes them
(the exact bf16 block-scaled decode, (E, N, K), and the per-expert global factor amax/(6B)). The trainer
calls `invalidate()` after every optimizer step (a fused AdamW does not bump the parameters' version
counters); entries are also keyed on those counters, so in-place edits elsewhere re-quantize too. The
quantization is the ops' own (the numerics API with the same per-expert amax and weight block), so the
cached operands are byte-identical to what the training forward quantizes. It is not the modules' training
WeightCache (`cache_weights`): rollouts need the bf16 decode on every device (also where training runs real FP4
GEMMs) and must not add their quantizations to the training's map-to-4 statistics.

`cached_experts(model, cache)` points every converted experts module's forward at the cache for the duration
of a rollout (torchtitan's MoE routing is unchanged); the consistent mode's MoE (`consistent_moe`) reads the
same cache. Rollouts run the emulated GEMM on every device (no Blackwell FP4 kernel here).
"""

import contextlib
import functools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

from ..modules.autocast import autocast_operands, no_autocast
from ..dispatch import four_over_six_quantize_decode, global_decode_factor, row_amax
from ..dispatch.amax import run_expert_amax, run_token_groups
from ..dispatch.library import resolved_quantizer
from ..numerics.reference import amax_per_row, expand_per_row
from . import consistent

_NAMES = ("w1", "w2", "w3")
_ALIGN = 16
"""Rows per token group handed to torch._grouped_mm (groups are zero-padded to a multiple)."""


def is_quantized(experts) -> bool:
    return getattr(experts, "recipe", None) is not None and all(hasattr(experts, n) for n in _NAMES)


def quantize_expert_weight(w: Tensor, recipe) -> tuple[Tensor, Tensor]:
    """(E, N, K) -> (decoded (E, N, K) bf16, factor (E,) FP32): the grouped op's weight quantization (each
    expert's own amax, the recipe's weight block) without the GEMM."""
    experts, n, k = w.shape
    rows = w.reshape(experts * n, k).contiguous()
    spec = recipe.plan(grouped=True).w
    amax = run_expert_amax(rows, experts, resolved_quantizer(recipe.quantizer, rows.device))
    decoded, _ = four_over_six_quantize_decode(rows, amax_per_row(amax, experts * n), block=spec.block,
                                               err_mode=spec.err_mode, scale_bound=spec.scale_bound,
                                               quantizer=recipe.quantizer, choose=spec.choose, validate_amax=False)
    return decoded.view(experts, n, k), global_decode_factor(amax, spec.scale_bound)


class ExpertWeightCache:
    """Quantized expert weights per (module, dtype), recomputed only when a weight's version changes."""

    def __init__(self):
        self._entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.refreshes = 0
        """How many times weights were quantized (a test counts them)."""

    def invalidate(self) -> None:
        """Weights changed (a policy update): the next rollout quantizes them again, once."""
        self._entries.clear()

    def get(self, experts, dtype: torch.dtype) -> list[tuple[Tensor, Tensor]]:
        weights = [getattr(experts, n) for n in _NAMES]
        weights = [w.to_local() if hasattr(w, "to_local") else w for w in weights]
        key = (dtype, tuple(w._version for w in weights))
        entry = self._entries.get(experts)
        if entry is None or entry[0] != key:
            with torch.no_grad():
                entry = (key, [quantize_expert_weight(w.to(dtype), experts.recipe) for w in weights])
            self._entries[experts] = entry
            self.refreshes += 1
        return entry[1]


def quantize_rows(x: Tensor, offs: Tensor, recipe) -> tuple[Tensor, Tensor]:
    """Expert-sorted activation rows -> (decoded bf16, per-row global factor): row amax or group amax."""
    spec = recipe.plan(grouped=True).x
    if spec.scaling == "row":
        amax = row_amax(x)
    else:
        quantizer = resolved_quantizer(recipe.quantizer, x.device)
        amax = expand_per_row(*run_token_groups(x, offs, False, quantizer)[:2])
    decoded, _ = four_over_six_quantize_decode(x.contiguous(), amax, block=spec.block, err_mode=spec.err_mode,
                                               scale_bound=spec.scale_bound, quantizer=recipe.quantizer,
                                               choose=spec.choose, validate_amax=False)
    return decoded, global_decode_factor(amax, spec.scale_bound)


def _grouped(x_dec: Tensor, x_factor: Tensor, weight: tuple[Tensor, Tensor], counts: Tensor, offs: Tensor,
             out_dtype) -> Tensor:
    """Emulated grouped GEMM on cached weights: groups zero-padded to _ALIGN rows for torch._grouped_mm."""
    w_dec, w_factor = weight
    counts = counts.to(torch.int64)
    sizes = (counts + _ALIGN - 1) // _ALIGN * _ALIGN
    starts = torch.cumsum(sizes, 0) - sizes
    expert_of_row = torch.repeat_interleave(torch.arange(counts.numel(), device=x_dec.device), counts,
                                            output_size=x_dec.shape[0])
    dest = starts[expert_of_row] + torch.arange(x_dec.shape[0], device=x_dec.device) - (offs.long() - counts)[
        expert_of_row]
    padded = x_dec.new_zeros(int(sizes.sum()), x_dec.shape[1]).index_copy(0, dest, x_dec)
    prod = torch._grouped_mm(padded, w_dec.transpose(-2, -1), offs=torch.cumsum(sizes, 0, dtype=torch.int32))
    return (prod.index_select(0, dest).float() * (x_factor * w_factor[expert_of_row])[:, None]).to(out_dtype)


def _cached_forward(experts, cache: ExpertWeightCache, x: Tensor, num_tokens_per_expert: Tensor) -> Tensor:
    """The converted experts' forward (same quantization, emulated GEMMs) on cached weights."""
    (x_in,) = autocast_operands(x)
    recipe = experts.recipe
    with no_autocast(x.device):
        w1, w2, w3 = cache.get(experts, x_in.dtype)
        counts = num_tokens_per_expert.to(torch.int64)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        dec, factor = quantize_rows(x_in, offs, recipe)
        h = F.silu(_grouped(dec, factor, w1, counts, offs, x_in.dtype))
        h = h * _grouped(dec, factor, w3, counts, offs, x_in.dtype)
        dec, factor = quantize_rows(h, offs, recipe)
        return _grouped(dec, factor, w2, counts, offs, x_in.dtype).to(x.dtype)


@contextlib.contextmanager
def cached_experts(model: torch.nn.Module, cache: ExpertWeightCache):
    """Within the block, converted experts modules of `model` run on `cache` (torchtitan's MoE unchanged)."""
    patched = [m for m in model.modules() if is_quantized(m)]
    for m in patched:
        m.forward = functools.partial(_cached_forward, m, cache)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def consistent_moe(moe, x: Tensor, cache: ExpertWeightCache | None) -> Tensor:
    """torchtitan's MoE (token-choice top-k, no shared experts) with batch-invariant kernels: x (T, dim) FP32.

    Routing: invariant gate GEMM and softmax, top-k; each expert's rows through invariant GEMMs (4/6
    quantized when converted: per-row activations, cached or fresh weights); outputs combined in the
    top-k order, one term after the other."""
    router = moe.router
    if getattr(moe, "shared_experts", None) is not None or router.score_func != "softmax":
        raise ValueError("rl.consistent supports MoE with softmax routing and no shared experts")
    scores = consistent.softmax(consistent.mm(x, router.gate.weight))
    if getattr(moe, "expert_bias", None) is not None:
        choice = scores + moe.expert_bias
        top_idx = torch.topk(choice, router.top_k, dim=-1, sorted=True).indices
        top = scores.gather(1, top_idx)
    else:
        top, top_idx = torch.topk(scores, router.top_k, dim=-1, sorted=True)
    if router.route_norm:
        top = top / (consistent.tree_sum(top) + 1e-20)[:, None]
    top = top * router.route_scale
    experts = moe.experts
    order = torch.argsort(top_idx.view(-1), stable=True)
    counts = torch.bincount(top_idx.view(-1), minlength=experts.num_experts).tolist()
    rows = x[order // router.top_k]
    w1, w2, w3 = (getattr(experts, n) for n in _NAMES)
    if is_quantized(experts):
        weights = cache.get(experts, torch.float32) if cache is not None else [
            quantize_expert_weight(getattr(experts, n).detach().float(), experts.recipe) for n in _NAMES]
        gemm = [functools.partial(_quantized_grouped_product, *weights[i], experts.recipe) for i in range(3)]
    else:
        gemm = [None] * 3
    h = consistent.silu(consistent.grouped_mm(rows, w1, counts, gemm[0])) * consistent.grouped_mm(
        rows, w3, counts, gemm[2])
    out = consistent.grouped_mm(h, w2, counts, gemm[1])
    unsorted = torch.empty_like(out).index_copy(0, order, out).view(-1, router.top_k, x.shape[-1])
    result = top[:, 0, None] * unsorted[:, 0]
    for j in range(1, router.top_k):
        result = result + top[:, j, None] * unsorted[:, j]
    return result


def _quantized_grouped_product(w_dec: Tensor, w_factor: Tensor, recipe, x: Tensor, w: Tensor,
                               counts: list[int]) -> Tensor:
    """The experts' 4/6 product for the invariant grouped GEMM: x quantized per row (row-scaled) or per
    expert group (then batch-dependent), the weights' cached or fresh decode."""
    sizes = torch.tensor(counts, device=x.device)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    dec, factor = quantize_rows(x, offs, recipe)
    owner = torch.repeat_interleave(torch.arange(len(counts), device=x.device), sizes, output_size=x.shape[0])
    return consistent.grouped_product(dec, w_dec, counts) * (factor * w_factor[owner])[:, None]
