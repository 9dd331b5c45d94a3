"""FourOverSixConfig: quantization_config of an exported checkpoint (ops/checkpoint.py) -> one method per layer."""

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ..ops.checkpoint import QUANT_METHOD, serving_recipe
from .linear import FourOverSixLinearMethod
from .moe import FourOverSixMoEMethod

_KEYS = {"quant_method", "format", "tensors", "group_size", "weights_quantized_from", "modules", "ignore"}


@register_quantization_config(QUANT_METHOD)
class FourOverSixConfig(QuantizationConfig):
    """Per quantized module (its checkpoint prefix) the inference recipe; everything else unquantized."""

    def __init__(self, recipes: dict, ignore: list[str]):
        super().__init__()
        self.recipes = recipes
        self.ignore = ignore

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # any device: the ops emulate NVFP4 GEMMs where no FP4 tensor cores exist

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "FourOverSixConfig":
        unknown = set(config) - _KEYS
        if unknown or config.get("format") != "nvfp4" or config.get("tensors") != "modelopt" \
                or config.get("group_size") != 16:
            raise ValueError(f"quantization_config of {QUANT_METHOD!r}: format 'nvfp4', tensors 'modelopt' and "
                             f"group_size 16 are what this plugin reads (python -m titan_fp4six.export --format "
                             f"nvfp4); got {({k: config.get(k) for k in ('format', 'tensors', 'group_size')})}"
                             f"{f', unknown keys {sorted(unknown)}' if unknown else ''}")
        modules, ignore = config.get("modules", {}), config.get("ignore", [])
        if not isinstance(modules, dict):
            raise ValueError(f"quantization_config of {QUANT_METHOD!r}: 'modules' must map each quantized module's "
                             f"name to its knobs (an object, as python -m titan_fp4six.export writes it), got "
                             f"{type(modules).__name__} {modules!r:.200}")
        if not isinstance(ignore, list) or not all(isinstance(n, str) for n in ignore):
            raise ValueError(f"quantization_config of {QUANT_METHOD!r}: 'ignore' must be a list of module names, got "
                             f"{ignore!r:.200}")
        return cls({name: serving_recipe(knobs, name) for name, knobs in modules.items()}, list(ignore))

    def _partitions(self, prefix: str) -> list[str]:
        """The checkpoint modules a (possibly fused) vLLM layer loads: qkv_proj -> q_proj, k_proj, v_proj."""
        parent, _, name = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(name)
        return [f"{parent}.{p}" if parent else p for p in parts] if parts else [prefix]

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            names = self._partitions(prefix)
            recipes = [self.recipes.get(n) for n in names]
            if all(r is None for r in recipes):
                return UnquantizedLinearMethod()
            if any(r != recipes[0] for r in recipes):
                raise ValueError(f"{prefix}: vLLM fuses {names} into one layer, but quantization_config gives them "
                                 f"different recipes ({recipes}); re-export with all of them converted alike")
            return FourOverSixLinearMethod(recipes[0], names)
        if isinstance(layer, RoutedExperts) and prefix in self.recipes:
            return FourOverSixMoEMethod(self.recipes[prefix], layer.moe_config)
        if prefix in self.recipes:
            raise ValueError(f"quantization_config quantizes {prefix}, a {type(layer).__name__} that this plugin "
                             "cannot run (it runs Linear layers and routed experts)")
        return None
