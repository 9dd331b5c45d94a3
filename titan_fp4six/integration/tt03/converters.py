"""torchtitan 0.3 converters: the 4/6 Linear and routed-experts conversions as `ModelConfigConverter` configs.

torchtitan 0.3 converts the model config tree before the model is built: `Linear.Config` nodes become
`FourOverSixLinearModule.Config` and `GroupedExperts.Config` nodes the 4/6 subclass's config, whose token dispatcher
is swapped for torchtitan's padding one (`swap_token_dispatcher`, groups padded to `pad_multiple`). The converter
configs carry the same fields as the 0.2 TOML sections (sections.py, derived from FourOverSixRecipe); the checks,
the process set-up, the selection, the bf16 layer window and the accounting are conversion.py's, as in 0.2.

`has_quantization` (torchtitan's test of whether MFU may use the bf16 peak) knows only torchtitan's converters;
`install()` (run on import) extends it to these configs, so a converted model reports True and a stock one False.
"""

import functools
from dataclasses import dataclass, fields

import torchtitan.components.quantization.utils as quant_utils
import torchtitan.trainer as tt_trainer
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.protocols.module import Module

from ...modules.experts import cached_weights, converted_experts_forward
from ...modules.linear import FourOverSixLinear
from ...modules.weight_cache import WeightCache
from ...ops import FourOverSixRecipe
from .. import conversion
from ..sections import make_section

EXPERT_WEIGHTS = ("w1_EFD", "w2_EDF", "w3_EFD")  # torchtitan 0.3's names, each (E, out, in)


class FourOverSixLinearModule(FourOverSixLinear, Module):
    """FourOverSixLinear satisfying torchtitan 0.3's Module protocol (built from its config)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        recipe: FourOverSixRecipe
        cache_weights: bool = False

    def __init__(self, config: Config):
        FourOverSixLinear.__init__(self, config.in_features, config.out_features, bias=config.bias,
                                   recipe=config.recipe, cache_weights=config.cache_weights)


_EXPERTS: dict[type, type] = {}


def four_over_six_experts_class(parent: type) -> type:
    """The 4/6 subclass of a torchtitan 0.3 experts class (created once per parent)."""
    if parent not in _EXPERTS:
        class FourOverSixExperts(parent):
            @dataclass(kw_only=True, slots=True)
            class Config(parent.Config):
                recipe: FourOverSixRecipe
                cache_weights: bool = False

            def __init__(self, config):
                super().__init__(config)
                self.recipe = config.recipe
                self.weight_cache = WeightCache() if config.cache_weights else None

            def forward(self, x_RD, num_tokens_per_expert_E):
                """The padding dispatcher aligned the groups: the 0.2 experts' forward without its padding (rows
                past offs[-1] never reach an amax and come back as zeros)."""
                quantize = None if self.weight_cache is None else functools.partial(
                    cached_weights, self, self.weight_cache, recipe=self.recipe, names=EXPERT_WEIGHTS)
                return converted_experts_forward(self, EXPERT_WEIGHTS, x_RD, num_tokens_per_expert_E, self.recipe,
                                                 quantize)

        FourOverSixExperts.__name__ = FourOverSixExperts.__qualname__ = f"FourOverSix{parent.__name__}"
        _EXPERTS[parent] = FourOverSixExperts
    return _EXPERTS[parent]


def _replace(model_config, parent, attr, new):
    if parent is None:
        return new
    if isinstance(parent, list):
        parent[attr] = new
    else:
        setattr(parent, attr, new)
    return model_config


def _layers(model_config) -> list[int] | None:
    layers = getattr(model_config, "layers", None)
    return None if layers is None else list(range(len(layers)))


class _Converter(QuantizationConverter):
    """Built by the trainer after its config checks (trainer.check_config: conversion.check_section)."""

    def __init__(self, config):
        self.config = config
        self.section = config.SECTION
        self.recipe = config.recipe()
        conversion.set_up_process()


class FourOverSixLinearConverter(_Converter):
    """Linear.Config -> FourOverSixLinearModule.Config for the Linears the section selects."""

    Config = make_section("Config", __name__, False, ["lm_head", "router.gate"],
                          bases=(QuantizationConverter.Config,), slots=True)

    def convert(self, model_config):
        found = {fqn: (c, parent, attr) for fqn, c, parent, attr in model_config.traverse(Linear.Config)
                 if type(c) is Linear.Config}  # converted ones are subclasses: converting twice is a no-op

        def swap(fqn: str) -> None:
            nonlocal model_config
            c, parent, attr = found[fqn]
            new = FourOverSixLinearModule.Config(**{f.name: getattr(c, f.name) for f in fields(c)},
                                                 recipe=self.recipe, cache_weights=self.config.cache_weights)
            model_config = _replace(model_config, parent, attr, new)

        conversion.convert_linears(self.section, self.config, self.recipe,
                                   [(fqn, c.in_features, c.out_features) for fqn, (c, _, _) in found.items()],
                                   _layers(model_config), type(model_config).__qualname__, swap)
        return model_config


class FourOverSixGroupedExpertsConverter(_Converter):
    """GroupedExperts.Config -> the 4/6 subclass's config, its dispatcher padding groups to pad_multiple rows."""

    Config = make_section("Config", __name__, True, ["routed_experts"],
                          bases=(QuantizationConverter.Config,), slots=True)

    def convert(self, model_config):
        found = {fqn: (c, parent) for fqn, c, parent, _ in model_config.traverse(GroupedExperts.Config)
                 if type(c)._owner not in _EXPERTS.values()}
        shapes = lambda c: {"w1_EFD": (c.num_experts, c.hidden_dim, c.dim),  # noqa: E731
                            "w2_EDF": (c.num_experts, c.dim, c.hidden_dim),
                            "w3_EFD": (c.num_experts, c.hidden_dim, c.dim)}

        def swap(fqn: str) -> int:
            c, routed = found[fqn]  # routed: the RoutedExperts.Config owning inner_experts and the dispatcher
            quant_utils.swap_token_dispatcher(routed, self.config.pad_multiple)
            cls = four_over_six_experts_class(type(c)._owner)
            routed.inner_experts = cls.Config(**{f.name: getattr(c, f.name) for f in fields(c)}, recipe=self.recipe,
                                              cache_weights=self.config.cache_weights)
            return 3 * c.dim * c.hidden_dim * routed.token_dispatcher.top_k

        conversion.convert_experts(self.section, self.config, self.recipe,
                                   [(fqn, shapes(c)) for fqn, (c, _) in found.items()], _layers(model_config),
                                   type(model_config).__qualname__, swap)
        return model_config


def converted(model_config) -> bool:
    """Whether a model config holds a module of either converter."""
    experts = tuple(cls.Config for cls in _EXPERTS.values())
    return (any(True for _ in model_config.traverse(FourOverSixLinearModule.Config))
            or any(isinstance(c, experts) for _, c, _, _ in model_config.traverse(GroupedExperts.Config)))


@functools.cache
def install() -> None:
    """torchtitan's has_quantization, also True for a model converted here (the trainer imported the name)."""
    stock = quant_utils.has_quantization

    @functools.wraps(stock)
    def has_quantization(model_config) -> bool:
        return stock(model_config) or converted(model_config)

    quant_utils.has_quantization = tt_trainer.has_quantization = has_quantization


install()
