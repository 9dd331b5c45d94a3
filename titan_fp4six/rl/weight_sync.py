"""The trainer's weights into a rollout engine's model, in memory, after every optimizer step.

The trainer's parameters may be sharded (FSDP2 over the data-parallel ranks, expert parallelism over experts:
DTensors); every rank's engine holds the whole model. Two ways, `[rl] weight_sync`:
- "packed" (default): each converted experts module's (w1, w2, w3) go as what the rollout forward quantizes
  from them: every rank takes its shard's per-expert max |w| (one all-reduce of E floats makes them the whole
  weights' amaxes), quantizes its own rows with them (blocks run along K, inside a row), and the ranks gather
  the codes (K/2 bytes a row) and E4M3 scales (K/16): 0.28x the bf16 bytes, and the engine's QuantizedWeights
  are bitwise the whole weight's quantization (tests/test_rl_distributed.py). Everything else as in "bf16".
- "bf16": every tensor gathered whole in the engine's dtype (the engine quantizes its experts itself on its
  first forward).
In packed mode the engine's own expert parameters become one-element placeholders of their shape (the ops read
only their shape next to a QuantizedWeight): the engine holds its experts packed only.
"""

import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..ops import assembled_grouped_weight, quantize_grouped_weight_shard
from .experts import WEIGHT_NAMES, ExpertWeightCache, is_quantized, rollout_recipe

_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


@dataclass
class SyncStats:
    """What one sync assembled on each rank (gathered, or its own where unsharded): `packed` the packed experts'
    bytes and `packed_bf16` what those weights weigh in bf16, `whole` every other tensor's bytes; wall time."""

    packed: int
    packed_bf16: int
    whole: int
    seconds: float


def _name(fqn: str) -> str:
    """A trainer FQN without the wrappers torchtitan may add (activation checkpointing, compile)."""
    for w in _WRAPPERS:
        fqn = fqn.replace(w, "")
    return fqn


def _is_dtensor(t: Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _whole(t: Tensor) -> Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


def _local(t: Tensor) -> Tensor:
    return t.to_local() if _is_dtensor(t) else t


def _gathered(local: Tensor, like: Tensor, shape: tuple) -> Tensor:
    """The whole tensor of `shape` whose shard on this rank is `local`, laid out over the ranks as `like` (a
    DTensor sharded on its leading dims; a plain tensor: `local` is already whole)."""
    if not _is_dtensor(like):
        return local
    from torch.distributed.tensor import DTensor

    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=torch.Size(shape),
                              stride=stride).full_tensor()


def _expert_amax(w: Tensor, local: Tensor) -> Tensor:
    """Per-expert max |w| (E,) FP32 of the whole weights w (E, N, K) from this rank's shard `local` (its
    operand dtype): exact (a max), whichever rank holds which rows."""
    a = (local.abs().amax(dim=(1, 2)) if local[0].numel() else local.new_zeros(local.shape[0])).float()
    if not _is_dtensor(w):
        return a
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    placements = [p if p == Shard(0) else Partial("max") if isinstance(p, Shard) else Replicate()
                  for p in w.placements]
    return DTensor.from_local(a, w.device_mesh, placements, run_check=False, shape=torch.Size([w.shape[0]]),
                              stride=(1,)).full_tensor()


def _local_experts(w: Tensor) -> slice:
    """Which experts of w (E, N, K) this rank's shard holds rows of."""
    if not _is_dtensor(w):
        return slice(0, w.shape[0])
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(w.shape, w.device_mesh, w.placements)
    return slice(offset[0], offset[0] + shape[0])


def packed_expert_weight(w: Tensor, dtype: torch.dtype, recipe) -> tuple:
    """(QuantizedWeight of the whole expert weights w (E, N, K) cast to `dtype`, bytes gathered) from this rank's
    shard: bitwise quantize_grouped_weight(whole.to(dtype).transpose(-2, -1), recipe=recipe)."""
    local = _local(w).detach().to(dtype)
    amax = _expert_amax(w, local)
    codes, scales = quantize_grouped_weight_shard(local, amax[_local_experts(w)], recipe=recipe)
    e, n, k = w.shape
    rows = local.shape[:2]
    codes = _gathered(codes.view(*rows, k // 2), w, (e, n, k // 2)).reshape(e * n, k // 2)
    scales = _gathered(scales.view(torch.uint8).view(*rows, k // 16), w, (e, n, k // 16))
    scales = scales.reshape(e * n, k // 16).view(torch.float8_e4m3fn)
    sent = codes.numel() + scales.numel() + amax.numel() * 4
    return assembled_grouped_weight(codes, scales, amax, dtype, recipe=recipe), sent


class WeightSync:
    """Copies a trainer model into `engine` (an unsharded model of the same recipe: the native engine's, or the
    one inside vLLM) whose experts are served from `cache`; `expert_dtype` is the dtype the engine's rollout
    forward hands its expert weights to the ops in (the packed QuantizedWeights are made for it)."""

    def __init__(self, engine: nn.Module, cache: ExpertWeightCache, mode: str, expert_dtype: torch.dtype):
        self.engine, self.cache, self.mode, self.expert_dtype = engine, cache, mode, expert_dtype
        self.experts = {name: m for name, m in engine.named_modules() if is_quantized(m)} if mode == "packed" else {}
        self.packed = {f"{name}.{w}" for name in self.experts for w in WEIGHT_NAMES}
        for m in self.experts.values():
            for w in WEIGHT_NAMES:
                p = getattr(m, w)
                setattr(m, w, nn.Parameter(p.new_zeros((1,) * p.dim()).expand(p.shape), requires_grad=False))
        self.targets = dict(engine.named_parameters())
        self.targets.update(engine.named_buffers())

    @torch.no_grad()
    def __call__(self, trainer: nn.Module) -> SyncStats:
        start = time.perf_counter()
        packed = packed_bf16 = whole_bytes = 0
        tensors = {_name(n): t for n, t in trainer.named_parameters()}
        tensors.update({_name(n): t for n, t in trainer.named_buffers() if _name(n) in self.targets})
        missing = sorted(set(self.targets) - set(tensors) - {"rope_cache"} - self.packed)
        if missing:
            raise KeyError(f"the trainer's model has no {missing[:5]}: the engine is not built from the same recipe")
        for name, t in tensors.items():
            if name in self.packed or name not in self.targets:
                continue
            target = self.targets[name]
            whole = _whole(t.detach())
            target.copy_(whole)
            whole_bytes += whole.numel() * target.element_size()
        for name, experts in self.experts.items():
            recipe = rollout_recipe(experts.recipe)
            weights = []
            for w in WEIGHT_NAMES:
                qw, n = packed_expert_weight(tensors[f"{name}.{w}"], self.expert_dtype, recipe)
                weights.append(qw)
                packed += n
                packed_bf16 += tensors[f"{name}.{w}"].numel() * 2
            self.cache.install(experts, tuple(weights))
        if self.mode == "bf16":
            self.cache.invalidate()
        return SyncStats(packed, packed_bf16, whole_bytes, time.perf_counter() - start)
