"""Each weight quantized once per optimizer step, not once per forward (opt-in: `cache_weights`).

Between two optimizer steps a weight does not change, yet every gradient-accumulation micro-batch (and every
activation-checkpoint recomputation) would quantize it again. A module with a WeightCache quantizes each weight on
its first forward after an optimizer step and hands the ops that QuantizedWeight until `invalidate()`: the
torchtitan converters call it (through `invalidate_weight_caches`) after every optimizer step, since a fused
AdamW does not bump the parameters' version counters; whoever steps an optimizer outside torchtitan calls it too.
An entry is also keyed on the parameter object, its version counter, its storage and the dtype the forward casts it
to, so in-place edits (a checkpoint load), `p.data = new` and autocast changes re-quantize; `p.data.copy_(new)`
changes neither version nor storage: call `invalidate()` after it. Under FSDP2 the key is the unsharded
parameter, whose version FSDP2 preserves across all-gathers: only `invalidate` marks its new values.

The cache holds each weight's codes, scales and bf16 decode between steps (~1.6x the bf16 weight's bytes) and
is bypassed while torch.compile traces (same results either way; torchtitan compiles the dense Linears, so the
linear section refuses the pair; converted routed experts with a cache run their chain eagerly).
"""

from collections.abc import Callable

import torch
from torch import nn

from ..ops import QuantizedWeight


class WeightCache:
    """A module's QuantizedWeights by parameter name, valid until `invalidate()`."""

    def __init__(self):
        self._entries: dict[str, tuple] = {}
        self.quantizations = 0
        """How many weights this cache quantized (tests and logs count them)."""

    def invalidate(self) -> None:
        """The weights changed (an optimizer step): the next forward quantizes them again."""
        self._entries.clear()

    def __deepcopy__(self, memo) -> "WeightCache":
        """A copied module starts with an empty cache: its parameters are new tensors whose version counters can
        reach a copied entry's again (e.g. by a load_state_dict), which would serve the old weights."""
        return WeightCache()

    def __getstate__(self) -> dict:
        return {"_entries": {}, "quantizations": 0}  # pickled likewise empty

    def get(self, name: str, param: torch.Tensor, operand: torch.Tensor,
            quantize: Callable[[], QuantizedWeight]) -> QuantizedWeight | None:
        """The QuantizedWeight of `operand` (the module's parameter `param` as the forward hands it to the op),
        from `quantize()` on a miss; None while torch.compile traces."""
        if torch.compiler.is_compiling():
            return None
        # the storage's identity: `param.data = new` (EMA, weight sync) swaps it; FSDP2's all-gathers resize it in
        # place and keep it. `param.data.copy_(new)` bumps no version counter: like a fused optimizer, invalidate().
        local = getattr(param, "_local_tensor", param)  # a DTensor's own storage is its local shard's
        key = (param._version, local.untyped_storage()._cdata, operand.dtype)
        entry = self._entries.get(name)
        if entry is None or entry[0] is not param or entry[1] != key:
            entry = (param, key, quantize())
            self._entries[name] = entry
            self.quantizations += 1
        return entry[2]


def invalidate_weight_caches(model: nn.Module) -> None:
    """Invalidate the weight cache of every converted module of `model` (after an optimizer step)."""
    for module in model.modules():
        cache = getattr(module, "weight_cache", None)
        if cache is not None:
            cache.invalidate()
