"""The trainer's weights into a rollout engine's model, in memory, after every optimizer step.

The trainer's parameters may be sharded (FSDP2 over the data-parallel ranks, expert parallelism over experts:
DTensors); every rank's engine holds the whole model. Two ways, `[rl] weight_sync`:
- "packed" (default): each converted experts module's (w1, w2, w3) go as what the rollout forward quantizes
  from them: every rank takes its shard's per-expert max |w| (a max over the ranks holding rows of the same
  experts and a gather of E floats make them the whole weights' amaxes), quantizes its own rows with them
  (blocks run along K, inside a row), and the ranks gather the codes (K/2 bytes a row) and E4M3 scales (K/16):
  0.28x the bf16 bytes, and the engine's QuantizedWeights are bitwise the whole weight's quantization
  (tests/test_rl_weight_sync.py). Everything else as in "bf16".
- "bf16": every tensor gathered whole in the engine's dtype (the engine quantizes its experts itself on its
  first forward).
In packed mode the engine's own expert parameters become one-element placeholders of their shape (the ops read
only their shape next to a QuantizedWeight): the engine holds its experts packed only.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..modules.dtensor import is_dtensor
from ..ops import assembled_grouped_weight, quantize_grouped_weight_shard
from .experts import WEIGHT_NAMES, ExpertWeightCache, is_quantized, rollout_recipe

_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


@dataclass
class SyncStats:
    """What one sync assembled on each rank (gathered, or its own where unsharded): `packed` the packed experts'
    bytes and `packed_bf16` what those weights weigh in bf16, `whole` every other tensor's bytes."""

    packed: int
    packed_bf16: int
    whole: int


def _name(fqn: str) -> str:
    """A trainer FQN without the wrappers torchtitan may add (activation checkpointing, compile)."""
    for w in _WRAPPERS:
        fqn = fqn.replace(w, "")
    return fqn


def _whole(t: Tensor) -> Tensor:
    return t.full_tensor() if is_dtensor(t) else t


def _local(t: Tensor) -> Tensor:
    return t.to_local() if is_dtensor(t) else t


def _gathered(local: Tensor, like: Tensor, shape: tuple) -> Tensor:
    """The whole tensor of `shape` whose shard on this rank is `local`, laid out over the ranks as `like` (a
    DTensor sharded on its leading dims; a plain tensor: `local` is already whole)."""
    if not is_dtensor(like):
        return local
    from torch.distributed.tensor import DTensor

    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=torch.Size(shape),
                              stride=stride).full_tensor()


def _expert_dim(p) -> int | None:
    """The tensor dim a placement shards (Shard and FSDP2's strided shard under expert parallelism), else None."""
    return getattr(p, "dim", None)


def _expert_amaxes(w: Tensor, local: Tensor) -> tuple[Tensor, Tensor]:
    """(per-expert max |w| of the whole weights (E,), the same for this rank's experts (E',)), FP32, from this
    rank's shard `local` (in its operand dtype) of w (E, N, K): exact (a max). Over the mesh dims that shard the
    rows (dim 1) the shards' amaxes are reduced (partial max); over those that shard the experts (dim 0, plain or
    strided) they stay sharded, so this rank's experts come back in its own order."""
    a = (local.abs().amax(dim=(1, 2)) if local.numel() else local.new_zeros(local.shape[0])).float()[:, None, None]
    if not is_dtensor(w):
        return a.view(-1), a.view(-1)
    from torch.distributed.tensor import DTensor, Partial, Replicate

    placements = [Partial("max") if _expert_dim(p) == 1 else p if _expert_dim(p) == 0 else Replicate()
                  for p in w.placements]
    bad = [p for p in w.placements if _expert_dim(p) not in (None, 0, 1)]
    if bad:
        raise NotImplementedError(f"rl.weight_sync='packed': expert weights sharded on dims {bad}; experts (dim 0) "
                                  "or their rows (dim 1) only; use rl.weight_sync='bf16'")
    shape = torch.Size([w.shape[0], 1, 1])
    partial = DTensor.from_local(a, w.device_mesh, placements, run_check=False, shape=shape, stride=(1, 1, 1))
    mine = partial.redistribute(w.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in placements])
    return mine.full_tensor().view(-1), mine.to_local().view(-1)


def packed_expert_weight(w: Tensor, dtype: torch.dtype, recipe) -> tuple:
    """(QuantizedWeight of the whole expert weights w (E, N, K) cast to `dtype`, bytes gathered) from this rank's
    shard: bitwise quantize_grouped_weight(whole.to(dtype).transpose(-2, -1), recipe=recipe)."""
    local = _local(w).detach().to(dtype)
    amax, mine = _expert_amaxes(w, local)
    e, n, k = w.shape
    rows = local.shape[:2]
    if local.numel():
        if recipe.weight_block == "16x16" and rows[1] % 16:
            raise ValueError(f"rl.weight_sync='packed': this rank holds {rows[1]} rows of each expert, and "
                             "weight_block='16x16' quantizes 16-row tiles: shard whole experts (a degree dividing "
                             "the experts) or use rl.weight_sync='bf16'")
        codes, scales = quantize_grouped_weight_shard(local, mine, recipe=recipe)
    else:  # an uneven FSDP2 split left this rank no rows
        codes = local.new_empty((0, k // 2), dtype=torch.uint8)
        scales = local.new_empty((0, k // 16), dtype=torch.float8_e4m3fn)
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
        self.cache, self.mode, self.expert_dtype = cache, mode, expert_dtype
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
            whole = _whole(t.detach().to(target.dtype))  # cast before the gather: the engine's bytes travel
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
        return SyncStats(packed, packed_bf16, whole_bytes)
