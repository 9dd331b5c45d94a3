"""Each weight quantized once per optimizer step, not once per forward (opt-in: `cache_weights`).

Between two optimizer steps a weight does not change, yet every gradient-accumulation micro-batch (and every
activation-checkpoint recomputation) would quantize it again. A module with a WeightCache quantizes each weight on
its first forward after a change and hands the ops that QuantizedWeight until the weight changes again. An entry
is keyed on what can change a weight, checked on every forward at the cost of a few Python reads:
- the parameter object, its version counter and its storage: in-place edits of the parameter (`p.copy_(new)`,
  `p.lerp_(...)` under no_grad, a `load_state_dict`), `p.data = new` and `m.weight = new`;
- the count of steps of every torch.optim optimizer (a global step post-hook): a fused AdamW bumps no version
  counter, and under FSDP2 the key is the unsharded parameter, whose version FSDP2 preserves across all-gathers;
- the `.data` tensors handed out: `p.data` is a new tensor with a version counter of its own (autograd ignores
  writes through it on purpose), so a plain parameter becomes a `WatchedParameter` on its first cached forward
  (the same nn.Parameter, its class swapped for a subclass whose `.data` notes each tensor it hands out and
  follows its version): `p.data.copy_(new)` and writes through a kept `d = p.data` re-quantize too;
- the dtype the forward casts it to (autocast).
What stays unseen needs `invalidate()` (`invalidate_weight_caches(model)`): under FSDP2 any write but an optimizer
step (the forward reads FSDP2's unsharded copy, not the sharded parameter written to), writes through `.data` of
another DTensor parameter (expert or tensor parallel) or to its local shard, writes under
`torch.autograd._unsafe_preserve_version_counter`, and an optimizer that is no torch.optim.Optimizer. The
torchtitan converters and the RL trainer still invalidate after every step.

The cache holds each weight's codes, scales and bf16 decode between steps (~1.6x the bf16 weight's bytes) and
is bypassed while torch.compile traces (same results either way; torchtitan compiles the dense Linears, so the
linear section refuses the pair; converted routed experts with a cache run their chain eagerly).
"""

import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from ..ops import QuantizedWeight


_STEPS = [0]
"""Steps taken by any torch.optim optimizer since a WeightCache first quantized (the hook below counts them)."""
_STEP_HOOK = []


def _count_step(optimizer, args, kwargs) -> None:
    _STEPS[0] += 1


class _Handed:
    """The `.data` tensors a WatchedParameter handed out: how many, and the live ones by their number."""

    __slots__ = ("count", "live")

    def __init__(self):
        self.count = 0
        self.live: dict[int, weakref.ref] = {}

    def add(self, data: torch.Tensor) -> None:
        self.count += 1
        live, number = self.live, self.count
        live[number] = weakref.ref(data, lambda _: live.pop(number, None))

    def state(self) -> tuple:
        """Changes whenever a tensor is handed out or one that is still alive is written to."""
        tensors = [ref() for ref in list(self.live.values())]
        return self.count, tuple(t._version for t in tensors if t is not None)


_HANDED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_DATA = torch._C.TensorBase.data


class WatchedParameter(nn.Parameter):
    """An nn.Parameter whose `.data` tensors the weight cache follows (see the module docstring); a cached
    module's plain parameters get this class on their first cached forward. Everything else is nn.Parameter's."""

    @property
    def data(self) -> torch.Tensor:
        data = _DATA.__get__(self)
        handed = _HANDED.get(self)
        if handed is None:
            handed = _HANDED[self] = _Handed()
        handed.add(data)
        return data

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        _DATA.__set__(self, new)


def _handed_state(param: torch.Tensor) -> tuple:
    """The `.data` state of `param`, made a WatchedParameter first if it is a plain nn.Parameter."""
    if type(param) is nn.Parameter:
        param.__class__ = WatchedParameter
    handed = _HANDED.get(param)
    return () if handed is None else handed.state()


class WeightCache:
    """A module's QuantizedWeights by parameter name, valid until `invalidate()`."""

    def __init__(self):
        self._entries: dict[str, tuple] = {}
        self.quantizations = 0
        """How many weights this cache quantized (tests and logs count them)."""

    def invalidate(self) -> None:
        """The weights changed in a way the keys miss (module docstring): the next forward quantizes them again."""
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
        # the storage's identity: `param.data = new` swaps it; FSDP2's all-gathers resize it in place and keep it
        local = getattr(param, "_local_tensor", param)  # a DTensor's own storage is its local shard's
        key = (param._version, local.untyped_storage()._cdata, operand.dtype, _STEPS[0], _handed_state(param))
        entry = self._entries.get(name)
        if entry is None or entry[0] is not param or entry[1] != key:
            if not _STEP_HOOK:  # steps before the first entry change nothing cached
                _STEP_HOOK.append(register_optimizer_step_post_hook(_count_step))
            entry = (param, key, quantize())
            self._entries[name] = entry
            self.quantizations += 1
        return entry[2]


def invalidate_weight_caches(model: nn.Module) -> None:
    """Invalidate the weight cache of every converted module of `model` (after a write the keys miss)."""
    for module in model.modules():
        cache = getattr(module, "weight_cache", None)
        if cache is not None:
            cache.invalidate()
