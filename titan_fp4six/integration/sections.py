"""The converter sections' fields and checks, shared by the torchtitan 0.2 TOML sections (job_config) and the 0.3
converter configs (tt03.converters); no torchtitan import, so both versions load it.

The recipe knobs are derived from FourOverSixRecipe's fields (their one home); each section builds and validates
its recipe when it is constructed, so a bad knob fails before any model is built, with its key named.
"""

import json
from dataclasses import dataclass, field, make_dataclass

from ..modules.experts import GROUP_ALIGN, check_pad_multiple
from ..quant.recipe import KNOBS, FourOverSixRecipe

FAMILY = "four_over_six"
LINEAR_SECTION = f"quantize.linear.{FAMILY}"
GROUPED_SECTION = f"quantize.grouped_mm.{FAMILY}"
LINEAR_DOC = (
    "[quantize.linear.four_over_six]: dense Linear layers. filter_fqns: modules never converted (an entry matches an "
    "fqn when its dotted parts appear as a run in the fqn's); fqns: if set, only Linears under these are converted, "
    "and a listed one that cannot be is an error.")
GROUPED_DOC = (
    "[quantize.grouped_mm.four_over_six]: routed experts. fqns: the experts modules to convert (dotted-part match); "
    "pad_multiple: rows each token group is padded to (a multiple of 16; torchtitan's padding dispatcher pads to "
    "it).")


def _recipe_fields():
    return [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in KNOBS]


@dataclass(kw_only=True)
class SectionBase:
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
    eager modules only: the linear section refuses it with compile.enable, routed experts with it run eagerly)."""
    fidelity_every: int = 0
    """Every N steps, log the per-GEMM NVFP4 vs 4/6 fidelity metrics and map-to-4 fraction of this section's
    modules on that step's batch to torchtitan's loggers (docs/fidelity_metrics.md); 0: off, no hooks."""

    SECTION = ""
    GROUPED = False

    def __post_init__(self):
        self.recipe()  # config-time validation, with the keys named
        for key in ("bf16_first_layers", "bf16_last_layers", "fidelity_every"):
            value = getattr(self, key)
            if type(value) is not int or value < 0:  # bool and 2.0 are not counts
                raise ValueError(f"{self.SECTION}.{key}={value!r}; it must be an integer >= 0")
        for key in ("allow_empty", "cache_weights"):
            if type(getattr(self, key)) is not bool:
                raise ValueError(f"{self.SECTION}.{key}={getattr(self, key)!r}; it must be true or false")
        for key in ("filter_fqns", "fqns"):  # a string would be matched character by character
            value = getattr(self, key, [])
            if type(value) is not list or any(type(v) is not str for v in value):
                example = [value] if type(value) is str else ["experts"]
                raise ValueError(f"{self.SECTION}.{key}={value!r}; it must be a list of strings (module names), "
                                 f"e.g. {key} = {json.dumps(example)}")
        if self.GROUPED:
            check_pad_multiple(self.pad_multiple, f"{self.SECTION}.pad_multiple")

    def recipe(self) -> FourOverSixRecipe:
        """The section's recipe, resolved for its GEMM kind; an invalid knob is reported with its key."""
        knobs = {f.name: getattr(self, f.name) for f in KNOBS}
        try:
            return FourOverSixRecipe(**knobs).resolve(grouped=self.GROUPED)
        except (ValueError, TypeError) as e:  # the recipe names its fields; name the section's keys instead
            raise ValueError(f"[{self.SECTION}] {str(e).replace('FourOverSixRecipe.', self.SECTION + '.')}") from e


def make_section(name: str, module: str, grouped: bool, default_fqns: list[str], bases: tuple = (),
                 **options) -> type:
    """The section dataclass of one converter kind: the recipe's knobs, SectionBase's fields, and the module
    selection (`default_fqns`: filter_fqns for Linears, fqns for routed experts, named as the torchtitan version
    names its modules); `bases` and `options` (e.g. slots) fit it to a torchtitan config class."""
    section, doc = (GROUPED_SECTION, GROUPED_DOC) if grouped else (LINEAR_SECTION, LINEAR_DOC)
    listed = lambda: list(default_fqns)  # noqa: E731 (a fresh list per instance)
    extra = ([("fqns", list[str], field(default_factory=listed)), ("pad_multiple", int, field(default=GROUP_ALIGN))]
             if grouped else [("filter_fqns", list[str], field(default_factory=listed)),
                              ("fqns", list[str], field(default_factory=list))])
    namespace = {"SECTION": section, "GROUPED": grouped, "__doc__": doc, "__module__": module}
    return make_dataclass(name, _recipe_fields() + extra, bases=(SectionBase, *bases), kw_only=True,
                          namespace=namespace, **options)


def make_quantize_sections(module: str, linear: type, grouped_mm: type,
                           **options) -> tuple[type, type, type]:
    """The [quantize] tree both torchtitan versions add, (Quantize, QuantizedLinear, QuantizedGroupedMM):
    quantize.linear.four_over_six of type `linear` and quantize.grouped_mm.four_over_six of type `grouped_mm`, each
    defaulting to its section's defaults; `options` for make_dataclass (torchtitan 0.3's kw_only and slots)."""
    def node(name: str, fields_: list[tuple[str, type]]) -> type:
        return make_dataclass(name, [(n, t, field(default_factory=t)) for n, t in fields_],
                              namespace={"__module__": module}, **options)

    linear_node = node("QuantizedLinear", [(FAMILY, linear)])
    grouped_node = node("QuantizedGroupedMM", [(FAMILY, grouped_mm)])
    return node("Quantize", [("linear", linear_node), ("grouped_mm", grouped_node)]), linear_node, grouped_node
