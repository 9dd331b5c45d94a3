"""FourOverSixLinear: an nn.Linear whose GEMM runs through the four-over-six op.

Stateless on purpose: it owns exactly nn.Linear's parameters (`weight`, optional `bias`) and no buffers,
so bf16 and converted checkpoints load into each other and FSDP/`init_weights` see the usual attributes.
The recipe is a plain (frozen) attribute, never part of the state_dict.
"""

import torch
from torch import nn

from ..ops import FourOverSixRecipe, four_over_six_linear
from .autocast import autocast_operands, no_autocast
from .dtensor import local_weight


class FourOverSixLinear(nn.Linear):
    """nn.Linear computing y = x W^T + b with NVFP4 four-over-six quantized operands."""

    recipe: FourOverSixRecipe

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: FourOverSixRecipe | None = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = (recipe if recipe is not None else FourOverSixRecipe()).resolve(grouped=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: FourOverSixRecipe) -> "FourOverSixLinear":
        """Swap in place of `linear`, sharing its Parameter objects (works on the meta device)."""
        if type(linear) is not nn.Linear:
            raise TypeError(f"expected a plain nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, recipe=recipe,
                  device="meta", dtype=linear.weight.dtype)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, weight, bias = autocast_operands(x, local_weight(self.weight, "weight"), self.bias)
        with no_autocast(x.device):
            return four_over_six_linear(x, weight, bias, recipe=self.recipe)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"
