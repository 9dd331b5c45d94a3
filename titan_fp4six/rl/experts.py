"""Routed experts for rollouts: the training ops and weight cache, weights quantized once per weight refresh.

Rollouts quantize with the experts' recipe at gemm='emulated' (`rollout_recipe`): every QuantizedWeight then
carries the exact bf16 decode that the consistent mode's invariant GEMMs read, and fast rollouts run the same
emulated GEMM on every device (also where training runs real FP4 GEMMs). `ExpertWeightCache` holds one training
WeightCache (modules/weight_cache.py) per converted experts module; the trainer calls `invalidate()` after every
optimizer step (a fused AdamW does not bump the parameters' version counters); entries are also keyed on those
counters, so in-place edits elsewhere re-quantize too.

`cached_experts(model, cache)` runs every converted experts module's own forward (`run`) with the rollout
recipe and the cache for the duration of a rollout (torchtitan's MoE routing is unchanged); the consistent
mode's MoE (`consistent_moe`) reads the same cache and the ops' activation decode.
"""

import contextlib
import dataclasses
import functools
import weakref

import torch
from torch import Tensor

from ..modules.dtensor import local_weight
from ..modules.experts import cached_weights
from ..modules.weight_cache import WeightCache
from ..numerics.reference import global_decode_factor
from ..ops import FourOverSixRecipe, QuantizedWeight, decode_grouped_activations
from ..quant.process_state import MAP4_STATS
from . import consistent

WEIGHT_NAMES = ("w1", "w2", "w3")


def is_quantized(experts) -> bool:
    return getattr(experts, "recipe", None) is not None and all(hasattr(experts, n) for n in WEIGHT_NAMES)


@functools.cache
def rollout_recipe(recipe: FourOverSixRecipe) -> FourOverSixRecipe:
    """The experts' recipe with the emulated GEMM: same quantization, and the bf16 decode always written."""
    return dataclasses.replace(recipe, gemm="emulated")


class ExpertWeightCache:
    """A training WeightCache per converted experts module, filled with the rollout recipe's QuantizedWeights."""

    def __init__(self):
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._installed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.refreshes = 0
        """How many times a module's weights were quantized (a test counts them)."""

    def invalidate(self) -> None:
        """Weights changed (a policy update): the next rollout quantizes them again, once."""
        self._caches.clear()
        self._installed.clear()

    def install(self, experts, weights: tuple[QuantizedWeight, QuantizedWeight, QuantizedWeight]) -> None:
        """The (w1, w2, w3) QuantizedWeights a trainer sent (rl/weight_sync.py): served for `experts` until the next
        install or invalidate, whatever its own parameters hold (an engine's expert parameters are not copied)."""
        self._installed[experts] = weights

    def quantized(self, experts, weights: list[Tensor]) -> tuple[QuantizedWeight, ...]:
        """The QuantizedWeights of experts' (w1, w2, w3) operands `weights`, quantized on a miss; not counted in
        MAP4_STATS (the generator pauses it, the trainer's consistent forward is not the ops' training forward)."""
        if experts in self._installed:
            return self._installed[experts]
        cache = self._caches.setdefault(experts, WeightCache())
        before = cache.quantizations
        with MAP4_STATS.paused():
            out = cached_weights(experts, cache, weights, rollout_recipe(experts.recipe))
        self.refreshes += cache.quantizations != before
        return out


def _rollout_forward(experts, cache: ExpertWeightCache, x: Tensor, num_tokens_per_expert: Tensor) -> Tensor:
    """The converted experts' forward with the rollout recipe on cached weights."""
    return experts.run(x, num_tokens_per_expert, rollout_recipe(experts.recipe),
                       functools.partial(cache.quantized, experts))


@contextlib.contextmanager
def cached_experts(model: torch.nn.Module, cache: ExpertWeightCache):
    """Within the block, converted experts modules of `model` run on `cache` (torchtitan's MoE unchanged)."""
    patched = [m for m in model.modules() if is_quantized(m)]
    for m in patched:
        m.forward = functools.partial(_rollout_forward, m, cache)
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
    w1, w2, w3 = (getattr(experts, n) for n in WEIGHT_NAMES)
    if is_quantized(experts):  # without a rollout's cache (the trainer's forward): quantized now, not kept
        operands = [local_weight(getattr(experts, n), n, experts=True).float() for n in WEIGHT_NAMES]
        weights = (cache or ExpertWeightCache()).quantized(experts, operands)
        recipe = rollout_recipe(experts.recipe)
        # w1 and w3 read the same rows: their quantization once, for both (as the training forward does)
        rows_decoded = _decoded_rows(rows, counts, recipe)
        gemm = [functools.partial(_quantized_grouped_product, w, recipe, decoded=d)
                for w, d in zip(weights, (rows_decoded, None, rows_decoded))]
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


def _decoded_rows(x: Tensor, counts: list[int], recipe: FourOverSixRecipe) -> tuple[Tensor, Tensor]:
    """decode_grouped_activations of x's rows grouped by counts: x quantized as the grouped op does (per row when
    row-scaled; per expert group, then batch-dependent)."""
    offs = torch.cumsum(torch.tensor(counts, device=x.device), 0, dtype=torch.int32)
    with torch.no_grad():  # as inside the invariant GEMM's forward: the quantization records no graph
        return decode_grouped_activations(x, offs, recipe=recipe)


def _quantized_grouped_product(weight: QuantizedWeight, recipe: FourOverSixRecipe, x: Tensor, w: Tensor,
                               counts: list[int], decoded: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The experts' 4/6 product for the invariant grouped GEMM: x's decode (_decoded_rows; `decoded` where the
    caller made it for several weights) times the weights' decode, then both global factors."""
    sizes = torch.tensor(counts, device=x.device)
    dec, factor = decoded or _decoded_rows(x, counts, recipe)
    w_dec = weight.decoded.view(len(counts), -1, x.shape[1])
    w_factor = global_decode_factor(weight.amax, recipe.scale_bound)
    owner = torch.repeat_interleave(torch.arange(len(counts), device=x.device), sizes, output_size=x.shape[0])
    return consistent.grouped_product(dec, w_dec, counts) * (factor * w_factor[owner])[:, None]
