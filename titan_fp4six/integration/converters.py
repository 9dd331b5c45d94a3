"""torchtitan model converters `quantize.linear.four_over_six` and `quantize.grouped_mm.four_over_six`.

torchtitan builds each converter from the whole job config (so `__init__` is where cross-section checks
live, with errors naming the TOML keys) and calls `convert(model)` on the meta-device model before any
parallelism, compile or FSDP. Converting swaps modules for stateless subclasses: the state_dict is unchanged.
"""

import tomllib

from torch import nn
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.moe.moe import GroupedExperts
from torchtitan.models.moe.utils import set_token_group_alignment_size_m
from torchtitan.protocols.model_converter import _registry_model_converter_cls, register_model_converter

from ..modules.experts import convert_experts
from ..modules.linear import FourOverSixLinear
from ..modules.weight_cache import invalidate_weight_caches
from . import conversion, fidelity, rounding
from .rules import check_known_converters, check_section_listed
from .sections import FAMILY

KINDS = ("linear", "grouped_mm")
CONFIG_MODULE = "titan_fp4six.integration.job_config"


def layer_indices(model: nn.Module) -> list[int] | None:
    """The decoder layer indices of a built model's `layers` stack (None without one)."""
    layers = getattr(model, "layers", None)
    return None if layers is None else sorted(int(name) for name, _ in layers.named_children())


def configured_section(job_config, kind: str):
    """The [quantize.<kind>.four_over_six] section, or None without the plugin's config module."""
    return getattr(getattr(getattr(job_config, "quantize", None), kind, None), FAMILY, None)


def section_config(job_config, kind: str):
    """The section of converter `kind`, which the config module adds (and registers the converters with)."""
    cfg = configured_section(job_config, kind)
    if cfg is None:
        raise ValueError(f"model.converters lists quantize.{kind}.{FAMILY} but its config section is missing: set "
                         f'[job] custom_config_module = "{CONFIG_MODULE}"')
    return cfg


def validate_job_config(job_config, kind: str):
    """The checks of converter `kind` ("linear" or "grouped_mm") against the whole job config (conversion's);
    returns (section cfg, recipe)."""
    cfg = section_config(job_config, kind)
    return cfg, conversion.check_section(kind, cfg, job_config.model.converters, job_config.compile,
                                         job_config.parallelism)


def check_converter_names(job_config) -> None:
    """torchtitan looks model.converters up in its registry and fails a typo with a bare KeyError before any
    converter runs; the plugin's launcher calls this first to name the valid converters. This plugin's names are
    registered by its config module, so without it they are unknown too: that is said first."""
    for kind in KINDS:
        if f"quantize.{kind}.{FAMILY}" in job_config.model.converters:
            section_config(job_config, kind)
    check_known_converters(job_config.model.converters, _registry_model_converter_cls)


def check_sections_have_converters(job_config) -> None:
    """A [quantize.*.four_over_six] section whose converter model.converters does not list would train plain bf16
    without a word. A section counts as configured when the recipe file has it or it differs from the defaults
    (a command-line knob)."""
    written = {}
    if job_config.job.config_file:
        with open(job_config.job.config_file, "rb") as f:
            written = tomllib.load(f).get("quantize", {})
    for kind in KINDS:
        cfg, name = configured_section(job_config, kind), f"quantize.{kind}.{FAMILY}"
        if cfg is not None:
            check_section_listed(name, FAMILY in written.get(kind, {}) or cfg != type(cfg)(),
                                 job_config.model.converters)


def _replace(model: nn.Module, fqn: str, new: nn.Module) -> None:
    parent, _, name = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


class _Converter(QuantizationConverter):
    kind: str

    def __init__(self, job_config, parallel_dims):
        self.section = f"quantize.{self.kind}.{FAMILY}"
        self.cfg, self.recipe = validate_job_config(job_config, self.kind)
        super().__init__(job_config, parallel_dims)  # torchtitan's one-quantization-family check
        conversion.set_up_process()
        rounding.start_step(job_config, 1)  # then set at the end of every step (metrics) and by the launcher

    def attach_fidelity(self, model: nn.Module, converted: list[str]) -> None:
        """fidelity_every > 0: measure the converted modules every N steps (integration/fidelity.py)."""
        if self.cfg.fidelity_every and converted:
            fidelity.attach(self.cfg.fidelity_every, [(fqn, model.get_submodule(fqn)) for fqn in converted])

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]):
        """The weights just changed: drop their cached quantizations (cache_weights)."""
        if self.cfg.cache_weights:
            for part in model if isinstance(model, list) else [model]:
                invalidate_weight_caches(part)


class FourOverSixLinearConverter(_Converter):
    """Swap matching nn.Linear for FourOverSixLinear; see [quantize.linear.four_over_six]."""

    kind = "linear"

    def convert(self, model: nn.Module):
        linears = {fqn: mod for fqn, mod in model.named_modules() if type(mod) is nn.Linear}

        def swap(fqn: str) -> None:
            _replace(model, fqn, FourOverSixLinear.from_linear(linears[fqn], self.recipe, self.cfg.cache_weights))

        converted = conversion.convert_linears(
            self.section, self.cfg, self.recipe, [(f, m.in_features, m.out_features) for f, m in linears.items()],
            layer_indices(model), type(model).__name__, swap)
        self.attach_fidelity(model, converted)


class FourOverSixGroupedMMConverter(_Converter):
    """Make matching routed experts run the four-over-six grouped GEMMs; see [quantize.grouped_mm.four_over_six]."""

    kind = "grouped_mm"

    def __init__(self, job_config, parallel_dims):
        super().__init__(job_config, parallel_dims)
        set_token_group_alignment_size_m(self.cfg.pad_multiple)  # EP dispatch pads every expert group to this
        # torchtitan compiles its own experts' chain (_run_experts_grouped_mm) when it compiles the model, and
        # skips the experts modules: the converted ones compile theirs alike
        compile_cfg = job_config.compile
        self.compile_backend = compile_cfg.backend if compile_cfg.enable and "model" in compile_cfg.components else None

    def convert(self, model: nn.Module):
        experts = {fqn: mod for fqn, mod in model.named_modules() if isinstance(mod, GroupedExperts)}

        def swap(fqn: str) -> int:
            mod = convert_experts(experts[fqn], self.recipe, self.cfg.pad_multiple, self.cfg.cache_weights,
                                  self.compile_backend)
            router = getattr(model.get_submodule(fqn.rpartition(".")[0]), "router", None)
            top_k = getattr(router, "top_k", mod.num_experts)
            return sum(getattr(mod, n).numel() for n in ("w1", "w2", "w3")) * top_k // mod.num_experts

        converted = conversion.convert_experts(
            self.section, self.cfg, self.recipe,
            [(f, {n: getattr(m, n).shape for n in ("w1", "w2", "w3")}) for f, m in experts.items()],
            layer_indices(model), type(model).__name__, swap)
        self.attach_fidelity(model, converted)


def register() -> None:
    """Register both converters with torchtitan; called once, by the config module job_config."""
    register_model_converter(FourOverSixLinearConverter, f"quantize.linear.{FAMILY}")
    register_model_converter(FourOverSixGroupedMMConverter, f"quantize.grouped_mm.{FAMILY}")
