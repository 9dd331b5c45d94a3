"""`[job] custom_config_module = "titan_fp4six.integration.job_config"`: the plugin's TOML sections.

torchtitan imports this module and merges its top-level `JobConfig` dataclass into its own, adding
`[quantize.linear.four_over_six]` and `[quantize.grouped_mm.four_over_six]`. Importing it also registers the
converters, the embedded dataset and the benchmark flavor. No `from __future__ import annotations` here: the
merge compares real dataclass types. Knob values are checked by the converters' `__init__` (whole job config).
"""

from dataclasses import dataclass, field

from ..ops.recipe import FourOverSixRecipe
from . import converters as _converters  # noqa: F401  (registers quantize.*.four_over_six)
from . import data as _data  # noqa: F401  (registers the embedded dataset)
from . import flavors as _flavors  # noqa: F401  (registers the Qwen3 benchmark flavor)

_DEFAULT = FourOverSixRecipe()


@dataclass
class FourOverSixKnobs:
    """Recipe knobs (see FourOverSixRecipe) plus decoder layers kept in bf16 at both ends of the stack."""

    err_mode: str = _DEFAULT.err_mode
    """Candidate choice per block between map-to-6 and map-to-4: "mse" or "mae" error."""
    scale_bound: int = _DEFAULT.scale_bound
    """Largest block scale: 256 (four-over-six) or 448 (FP8 E4M3 max)."""
    weight_block: str = _DEFAULT.weight_block
    """Weight quantization tile: "16x16" (one quantization serves W and W^T) or "1x16"."""
    activation_scaling: str = _DEFAULT.activation_scaling
    """Activation amax granularity: "tensor" or "row"."""
    backward: str = _DEFAULT.backward
    """Backward GEMMs: "auto", "quantized", "high_precision" or "dequantized" ("auto": quantized for per-tensor
    dense Linears, high_precision for row-scaled activations and routed experts)."""
    bf16_first_layers: int = 0
    """Number of decoder layers at the start of the stack (layers.0, ...) left in bf16."""
    bf16_last_layers: int = 0
    """Number of decoder layers at the end of the stack left in bf16."""
    allow_empty: bool = False
    """Converting no module at all is an error (a silent bf16 run) unless this is true."""


@dataclass
class FourOverSixLinearConfig(FourOverSixKnobs):
    filter_fqns: list[str] = field(default_factory=lambda: ["output", "router.gate"])
    """Modules never converted: an entry matches an fqn when its dotted parts appear as a run in the fqn's."""
    fqns: list[str] = field(default_factory=list)
    """If set, only Linears under these fqns are converted; a listed one that cannot be is an error."""


@dataclass
class FourOverSixGroupedMMConfig(FourOverSixKnobs):
    fqns: list[str] = field(default_factory=lambda: ["experts"])
    """Routed-experts modules to convert (dotted-part match: "experts" does not match "shared_experts")."""


@dataclass
class QuantizedLinear:
    four_over_six: FourOverSixLinearConfig = field(default_factory=FourOverSixLinearConfig)


@dataclass
class QuantizedGroupedMM:
    four_over_six: FourOverSixGroupedMMConfig = field(default_factory=FourOverSixGroupedMMConfig)


@dataclass
class Quantize:
    linear: QuantizedLinear = field(default_factory=QuantizedLinear)
    grouped_mm: QuantizedGroupedMM = field(default_factory=QuantizedGroupedMM)


@dataclass
class JobConfig:
    quantize: Quantize = field(default_factory=Quantize)
