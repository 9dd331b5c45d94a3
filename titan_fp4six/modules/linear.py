"""FourOverSixLinear: an nn.Linear whose GEMM runs through the four-over-six op.

Stateless on purpose: it owns exactly nn.Linear's parameters (`weight`, optional `bias`) and no buffers,
so bf16 and converted checkpoints load into each other and FSDP/`init_weights` see the usual attributes.
The recipe and the optional weight cache (weight_cache.py) are plain attributes, never part of the state_dict.
"""

import torch
from torch import nn

from ..ops import FourOverSixRecipe, four_over_six_linear, quantize_linear_weight
from ..ops.checks import check_recipe
from .autocast import autocast_operands, no_autocast
from .dtensor import local_weight
from .weight_cache import WeightCache


class FourOverSixLinear(nn.Linear):
    """nn.Linear computing y = x W^T + b with NVFP4 four-over-six quantized operands."""

    recipe: FourOverSixRecipe
    weight_cache: WeightCache | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: FourOverSixRecipe | None = None, cache_weights: bool = False, device=None, dtype=None):
        recipe = recipe if recipe is not None else FourOverSixRecipe()
        check_recipe(recipe)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = recipe.resolve(grouped=False)
        self.weight_cache = WeightCache() if cache_weights else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: FourOverSixRecipe,
                    cache_weights: bool = False) -> "FourOverSixLinear":
        """Swap in place of `linear`, sharing its Parameter objects (works on the meta device)."""
        if type(linear) is not nn.Linear:
            raise TypeError(f"expected a plain nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, recipe=recipe,
                  cache_weights=cache_weights, device="meta", dtype=linear.weight.dtype)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    @classmethod
    def convert(cls, linear: nn.Linear, recipe: FourOverSixRecipe, cache_weights: bool = False) -> "FourOverSixLinear":
        """Turn `linear` itself into this class (its class swapped; parameters, hooks and state_dict untouched),
        so every place that holds it, a module used twice among them, runs the four-over-six forward."""
        if type(linear) is not nn.Linear:
            raise TypeError(f"expected a plain nn.Linear, got {type(linear).__name__}")
        check_recipe(recipe)
        linear.__class__ = cls
        linear.recipe = recipe.resolve(grouped=False)
        linear.weight_cache = WeightCache() if cache_weights else None
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, weight, bias = autocast_operands(x, local_weight(self.weight, "weight"), self.bias)
        with no_autocast(x.device):
            quantized = None if self.weight_cache is None else self.weight_cache.get(
                "weight", self.weight, weight, lambda: quantize_linear_weight(weight, recipe=self.recipe))
            return four_over_six_linear(x, weight, bias, recipe=self.recipe, quantized_weight=quantized)

    def extra_repr(self) -> str:
        cached = ", cache_weights=True" if self.weight_cache is not None else ""
        return f"{super().extra_repr()}, recipe={self.recipe}{cached}"
