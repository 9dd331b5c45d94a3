"""`[job] custom_config_module = "titan_fp4six.integration.job_config"`: the plugin's TOML sections.

torchtitan imports this module and merges its top-level `JobConfig` dataclass into its own, adding
`[quantize.linear.four_over_six]` and `[quantize.grouped_mm.four_over_six]`. That import is the plugin's one
hook into `torchtitan.train`, so it also registers the converters, the embedded dataset and the plugin's model
flavors (`register()`).
The recipe knobs of both sections are derived from FourOverSixRecipe's fields (their one home); each section
builds and validates its recipe when the config loads, so a bad knob fails before any model is built, with
its TOML key named. No `from __future__ import annotations` here: the merge compares real dataclass types.
"""

import json
from dataclasses import MISSING, dataclass, field, fields, make_dataclass

from ..modules.experts import GROUP_ALIGN, check_pad_multiple
from ..ops.recipe import KNOBS, FourOverSixRecipe
from . import converters, data, flavors

LINEAR_SECTION = "quantize.linear.four_over_six"
GROUPED_SECTION = "quantize.grouped_mm.four_over_six"


def _recipe_fields():
    return [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in KNOBS]


@dataclass(kw_only=True)
class _SectionBase:
    """Decoder layers kept in bf16 at both ends of the stack, and the recipe of the section's knobs."""

    bf16_first_layers: int = 0
    """Number of decoder layers at the start of the stack (layers.0, ...) left in bf16."""
    bf16_last_layers: int = 0
    """Number of decoder layers at the end of the stack left in bf16."""
    allow_empty: bool = False
    """Converting no module at all is an error (a silent bf16 run) unless this is true."""
    cache_weights: bool = False
    """Quantize each weight once per optimizer step and reuse it across gradient-accumulation micro-batches and
    activation-checkpoint recomputations (same results; holds ~1.6x the bf16 weights' bytes between steps;
    eager modules only: the linear section refuses it with compile.enable, routed experts stay eager)."""
    fidelity_every: int = 0
    """Every N steps, log the per-GEMM NVFP4 vs 4/6 fidelity metrics and map-to-4 fraction of this section's
    modules on that step's batch to torchtitan's loggers (docs/fidelity_metrics.md); 0: off, no hooks."""

    SECTION = ""
    GROUPED = False

    def __post_init__(self):
        self.recipe()  # config-time validation, with the TOML keys named
        for key in ("bf16_first_layers", "bf16_last_layers", "fidelity_every"):
            value = getattr(self, key)
            if type(value) is not int or value < 0:  # bool and 2.0 are not counts
                raise ValueError(f"{self.SECTION}.{key}={value!r}; it must be an integer >= 0")
        for key in ("allow_empty", "cache_weights"):
            if type(getattr(self, key)) is not bool:
                raise ValueError(f"{self.SECTION}.{key}={getattr(self, key)!r}; it must be true or false")
        for key in ("filter_fqns", "fqns"):  # a TOML string would be matched character by character
            value = getattr(self, key, [])
            if type(value) is not list or any(type(v) is not str for v in value):
                example = [value] if type(value) is str else ["experts"]
                raise ValueError(f"{self.SECTION}.{key}={value!r}; it must be a list of strings (module names), "
                                 f"e.g. {key} = {json.dumps(example)}")

    def recipe(self) -> FourOverSixRecipe:
        """The section's recipe, resolved for its GEMM kind; an invalid knob is reported with its TOML key."""
        knobs = {f.name: getattr(self, f.name) for f in KNOBS}
        try:
            return FourOverSixRecipe(**knobs).resolve(grouped=self.GROUPED)
        except (ValueError, TypeError) as e:  # the recipe names its fields; name the TOML keys instead
            raise ValueError(f"[{self.SECTION}] {str(e).replace('FourOverSixRecipe.', self.SECTION + '.')}") from e


def _section(name: str, section: str, grouped: bool, doc: str, extra: list, post_init=None) -> type:
    namespace = {"SECTION": section, "GROUPED": grouped, "__doc__": doc, "__module__": __name__}
    if post_init is not None:
        def __post_init__(self):
            _SectionBase.__post_init__(self)
            post_init(self)

        namespace["__post_init__"] = __post_init__
    return make_dataclass(name, _recipe_fields() + extra, bases=(_SectionBase,), kw_only=True, namespace=namespace)


FourOverSixLinearConfig = _section(
    "FourOverSixLinearConfig", LINEAR_SECTION, False,
    "[quantize.linear.four_over_six]: dense nn.Linear layers. filter_fqns: modules never converted (an entry "
    "matches an fqn when its dotted parts appear as a run in the fqn's); fqns: if set, only Linears under these "
    "are converted, and a listed one that cannot be is an error.",
    [("filter_fqns", list[str], field(default_factory=lambda: ["output", "router.gate"])),
     ("fqns", list[str], field(default_factory=list))])

FourOverSixGroupedMMConfig = _section(
    "FourOverSixGroupedMMConfig", GROUPED_SECTION, True,
    "[quantize.grouped_mm.four_over_six]: routed experts. fqns: the experts modules to convert (dotted-part "
    "match: 'experts' does not match 'shared_experts'); pad_multiple: rows each token group is padded to (a "
    "multiple of 16; with expert parallelism torchtitan's dispatcher pads to it).",
    [("fqns", list[str], field(default_factory=lambda: ["experts"])),
     ("pad_multiple", int, field(default=GROUP_ALIGN))],
    post_init=lambda self: check_pad_multiple(self.pad_multiple, f"{GROUPED_SECTION}.pad_multiple"))


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
