"""The whole-config checks the launchers (and the dry run) make before torchtitan builds anything, and the
launchers' check of every step's loss and grad norm.

Why here: torchtitan reports these late, barely or never (a KeyError for a flavor or converter name, a silent
bf16 run for a section without its converter, a NaN run that saves its checkpoints and exits 0), and the
config checks need more than one section, which no section can check when the config loads.
"""

import math

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


def check_finite(step: int, loss: float, grad_norm: float, allow: bool) -> None:
    """Stop at the first step whose loss or grad norm is NaN or Inf, before the step's checkpoint: torchtitan
    would train on, save the diverged weights and exit 0."""
    bad = {name: value for name, value in (("loss", loss), ("grad norm", grad_norm)) if not math.isfinite(value)}
    if bad and not allow:
        raise FloatingPointError(
            f"step {step}: non-finite {' and '.join(f'{k} ({v})' for k, v in bad.items())}; stopped before this "
            "step's checkpoint. Resume from an earlier checkpoint (with a lower learning rate, or checked data and "
            "optimizer state), or set training.allow_nonfinite = true to train on")
