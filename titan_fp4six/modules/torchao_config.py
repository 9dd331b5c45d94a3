"""torchao entry point: `quantize_(model, FourOverSixTrainingConfig(...), filter_fn=...)` swaps nn.Linear for
FourOverSixLinear on any nn.Module, the way torchao installs its own training workflows (an AOBaseConfig
dataclass plus a handler registered with `register_quantize_module_handler`).

A Linear whose in_features or out_features is not a multiple of 16 cannot be quantized (NVFP4 blocks both GEMM
dims by 16): the handler raises instead of silently leaving it in high precision, since that would change the
numerics the caller asked for. Pass `filter_fn=quantizable_linear` to convert exactly the Linears that can be
converted, or any filter of your own that leaves such layers out (and, usually, the LM head).
"""

from dataclasses import field, make_dataclass

from torch import nn
from torchao.core.config import AOBaseConfig
from torchao.quantization.transform_module import register_quantize_module_handler

from ..numerics.formats import BLOCK_SIZE
from ..ops.checks import blockable
from ..quant.recipe import KNOBS, FourOverSixRecipe
from .linear import FourOverSixLinear


def _post_init(self):
    try:
        self.recipe()
    except (ValueError, TypeError) as e:
        raise ValueError(f"FourOverSixTrainingConfig: {e}") from e
    if type(self.cache_weights) is not bool:
        raise ValueError(f"FourOverSixTrainingConfig: cache_weights={self.cache_weights!r}; it must be True or False")


def _recipe(self) -> FourOverSixRecipe:
    """The FourOverSixRecipe of these knobs."""
    return FourOverSixRecipe(**{f.name: getattr(self, f.name) for f in KNOBS})


FourOverSixTrainingConfig = make_dataclass(
    "FourOverSixTrainingConfig", [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in KNOBS]
    + [("cache_weights", bool, field(default=False))],
    bases=(AOBaseConfig,), kw_only=True,
    namespace={"__post_init__": _post_init, "recipe": _recipe, "__module__": __name__,
               "__doc__": "The four-over-six recipe's knobs (FourOverSixRecipe's fields, names, values and "
                          "defaults), validated when the config is built, and cache_weights: quantize each weight "
                          "once per change (modules/weight_cache.py says which writes need invalidate_weight_caches)."})


def quantizable_linear(module: nn.Module, fqn: str = "") -> bool:
    """A `filter_fn` for quantize_: plain nn.Linear layers whose two dims are multiples of 16, and converted ones
    (so quantize_ on a converted model checks that its config is the one they have)."""
    if isinstance(module, FourOverSixLinear):
        return True
    return type(module) is nn.Linear and blockable(module.in_features, module.out_features)


def _check_same_config(module: FourOverSixLinear, config) -> None:
    """quantize_ on a converted model: a no-op with the same config; another config would be silently ignored
    (the module keeps its recipe), so it is an error."""
    recipe, cached = config.recipe().resolve(grouped=False), module.weight_cache is not None
    if recipe != module.recipe or cached != config.cache_weights:
        raise ValueError(f"FourOverSixTrainingConfig: this Linear is already a FourOverSixLinear with recipe="
                         f"{module.recipe}, cache_weights={cached}; the new config asks for recipe={recipe}, "
                         f"cache_weights={config.cache_weights}. quantize_ the original (unconverted) model once, "
                         "with the config you want")


@register_quantize_module_handler(FourOverSixTrainingConfig)
def _four_over_six_training_transform(module: nn.Module, config: FourOverSixTrainingConfig,
                                      parameter_name: str | None = None) -> nn.Module:
    """quantize_'s handler: nn.Linear -> FourOverSixLinear, converted in place (state_dict unchanged): quantize_
    visits a module used at two places once, and the in-place class swap reaches both."""
    if isinstance(module, FourOverSixLinear):
        _check_same_config(module, config)
        return module
    if not isinstance(module, nn.Linear):
        return module
    if type(module) is not nn.Linear:
        raise TypeError(f"FourOverSixTrainingConfig converts plain nn.Linear only; the filter selected a "
                        f"{type(module).__name__}: leave it out with filter_fn")
    if not quantizable_linear(module):
        raise ValueError(f"FourOverSixTrainingConfig: the filter selected a Linear with in_features="
                         f"{module.in_features}, out_features={module.out_features}; both must be multiples of "
                         f"{BLOCK_SIZE} (NVFP4 blocks). Leave it out with filter_fn (e.g. "
                         "titan_fp4six.quantizable_linear)")
    return FourOverSixLinear.convert(module, config.recipe(), config.cache_weights)
