"""The whole-config checks the launchers (and the dry run) make before torchtitan builds anything, and the
launchers' watch over every step's loss and grad norm.

Why here: torchtitan reports these late, barely or never (a KeyError for a flavor or converter name, a silent
bf16 run for a section without its converter, a NaN run that saves its checkpoints and exits 0), and the
config checks need more than one section, which no section can check when the config loads.
"""

import math

import torch

from .converters import check_converter_names, check_sections_have_converters
from .flavors import check_flavor


def check_job_config(job_config) -> None:
    check_converter_names(job_config)
    check_sections_have_converters(job_config)
    check_flavor(job_config)


def nonfinite_allowed(job_config) -> bool:
    """training.allow_nonfinite (false without the plugin's config module, which adds it)."""
    allow = getattr(job_config.training, "allow_nonfinite", False)
    if type(allow) is not bool:
        raise ValueError(f"training.allow_nonfinite={allow!r}; it must be true or false")
    return allow


def check_finite(step: int, loss: float, grad_norm: float, allow: bool, seen_at: int | None = None) -> None:
    """Stop at the first step whose loss or grad norm is NaN or Inf (read at step `seen_at`, default `step`),
    before the checkpoint of the step that reads it: torchtitan would train on, save the diverged weights and
    exit 0."""
    bad = {name: value for name, value in (("loss", loss), ("grad norm", grad_norm)) if not math.isfinite(value)}
    if bad and not allow:
        where = ("stopped before this step's checkpoint" if seen_at in (None, step) else
                 f"stopped at step {seen_at} (the first step that read it), before its checkpoint")
        raise FloatingPointError(
            f"step {step}: non-finite {' and '.join(f'{k} ({v})' for k, v in bad.items())}; {where}. Resume from an "
            "earlier checkpoint (with a lower learning rate, or checked data and optimizer state), or set "
            "training.allow_nonfinite = true to train on")


class NonFiniteWatch:
    """The first step whose loss or grad norm is not finite, kept on the loss's device and read by `check` only:
    the launcher checks on the steps where torchtitan reads the loss anyway (logging) and before a checkpoint is
    written, so no step waits for the GPU just to be checked."""

    def __init__(self):
        self.first: torch.Tensor | None = None  # (step, loss, grad norm) in float64; step -1 while all finite

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        values = torch.cat([torch.full((1,), float(step), dtype=torch.float64, device=loss.device),
                            loss.detach().reshape(1).double(), grad_norm.detach().reshape(1).double()])
        if self.first is None:
            self.first = torch.full_like(values, -1.0)
        bad = ~torch.isfinite(values[1:]).all() & (self.first[0] < 0)
        self.first = torch.where(bad, values, self.first)

    def check(self, step: int) -> None:
        """Raise (check_finite) if a step up to `step` was not finite; one host sync."""
        if self.first is None:
            return
        first_step, loss, grad_norm = self.first.tolist()
        if first_step >= 0:
            check_finite(int(first_step), loss, grad_norm, allow=False, seen_at=step)
