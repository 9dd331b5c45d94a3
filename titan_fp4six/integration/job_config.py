"""`[job] custom_config_module = "titan_fp4six.integration.job_config"`: the plugin's TOML sections.

torchtitan imports this module and merges its top-level `JobConfig` dataclass into its own, adding
`[quantize.linear.four_over_six]` and `[quantize.grouped_mm.four_over_six]`. That import is the plugin's one
hook into `torchtitan.train`, so it also registers the converters, the embedded dataset and the plugin's model
flavors (`register()`).
The sections' fields and checks live in sections.py (shared with the torchtitan 0.3 adapter, tt03/): the recipe
knobs derived from FourOverSixRecipe's fields (their one home), each section validating its recipe when the config
loads, with its TOML key named. No `from __future__ import annotations` here: the merge compares real dataclass types.
"""

from dataclasses import dataclass, field

from .version import require

require("0.2", "titan_fp4six.integration.job_config")
from . import converters, data, flavors  # noqa: E402 (after the version check: these import torchtitan 0.2)
from .sections import make_quantize_sections, make_section

FourOverSixLinearConfig = make_section("FourOverSixLinearConfig", __name__, False, ["output", "router.gate"])
FourOverSixGroupedMMConfig = make_section("FourOverSixGroupedMMConfig", __name__, True, ["experts"])


Quantize, QuantizedLinear, QuantizedGroupedMM = make_quantize_sections(__name__, FourOverSixLinearConfig,
                                                                       FourOverSixGroupedMMConfig)


@dataclass
class Training:
    """Merged into torchtitan's [training] section."""

    allow_nonfinite: bool = False
    """`python -m titan_fp4six.train` and `titan_fp4six.rl` stop with an error naming the step whose loss or grad
    norm is NaN or Inf, before its checkpoint is saved; true lets the run go on (experiments)."""


@dataclass
class JobConfig:
    quantize: Quantize = field(default_factory=Quantize)
    training: Training = field(default_factory=Training)


def register() -> None:
    """Register the converters, the embedded dataset and the plugin's flavors with torchtitan (idempotent)."""
    converters.register()
    data.register()
    flavors.register()


register()
