"""Seeds of the stochastic gradient rounding (gradient_rounding = "stochastic") from torchtitan's run.

Each step's seeds derive from (debug.seed, 0 when unset; the step; the process's global rank) through
ops.set_rounding_seed, so a run repeats its rounding exactly given the same seed, world and call order (as
--debug.deterministic asks), and data-parallel ranks round their different gradients with different bits. Set at
the end of every step for the next one (metrics' should_log wrapper, torchtitan 0.2 and 0.3), at the 0.2
converters' construction for step 1, and at the start of every step by the launchers' trainers
(RoundingSeedPerStep: titan_fp4six.train's and the 0.3 FourOverSixTrainer), which know the step a resumed run
starts from.
"""

import torch

from ..quant.process_state import set_rounding_seed
from .version import trainer_config


def run_seed(job_config) -> int:
    """torchtitan's debug.seed, 0 when unset (or for a config without a debug section); a negative seed as its
    64-bit two's complement (torch.manual_seed's reading of it)."""
    seed = getattr(getattr(job_config, "debug", None), "seed", None)
    return 0 if seed is None else int(seed) % 2 ** 64


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def start_step(job_config, step: int) -> None:
    """The stochastic rounding seeds of step `step` (1-based, torchtitan's count)."""
    set_rounding_seed(run_seed(job_config), step, _rank())


class RoundingSeedPerStep:
    """Mixin over torchtitan's Trainer (0.2.x and 0.3.x): the step's rounding seeds set as it starts."""

    def train_step(self, data_iterator):
        start_step(trainer_config(self), self.step)
        return super().train_step(data_iterator)
