"""GRPO over the ranks of a torchrun world: who takes which prompt groups, and one reduction of a step's metrics.

Every rank draws the step's prompts and one sampling seed per rollout from the same streams (the same on every
rank, checkpointed once), then takes its own contiguous share of whole groups: a group's advantages need all its
samples, so a group never spans ranks, and a rollout's tokens depend on its prompt, its seed and the weights,
not on N.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int

    @classmethod
    def current(cls) -> "Ranks":
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls(0, 1)

    def groups(self, count: int) -> slice:
        """This rank's share of `count` prompt groups (count divisible by world: trainer.check_layout)."""
        share = count // self.world
        return slice(self.rank * share, (self.rank + 1) * share)

    def reduce(self, sums: dict[str, float], maxes: dict[str, float], device) -> dict[str, float]:
        """`sums` summed and `maxes` maximized over the ranks (each one all-reduce; as given on one rank)."""
        out = {}
        for values, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX)):
            if not values:
                continue
            t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
            if self.world > 1:
                dist.all_reduce(t, op=op)
            out.update(zip(values, t.tolist()))
        return out

    def total(self, value: int, device) -> int:
        return int(self.reduce({"v": value}, {}, device)["v"])
