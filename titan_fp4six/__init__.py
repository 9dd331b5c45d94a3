"""titan_fp4six: NVFP4 four-over-six training for torchtitan.

Layers, each importing only those below it: numerics (formats, checks, the pure-PyTorch reference) and
kernels (Triton, bitwise equal to it) -> quant (the recipe, its plans and role quantizers, the one choice of
kernel or reference; the public quantize entry points) -> ops (GEMMs with autograd) -> modules (Linear /
experts) -> integration (torchtitan converters, config, data, launcher). Only `integration` imports torchtitan.
"""

from .quant import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode,
                    global_decode_factor, group_amax, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax)
from .modules import FourOverSixLinear, convert_experts, four_over_six_experts_class
from .ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear, four_over_six_mm

__all__ = [
    "NVFP4Blocks", "decode_block_scaled", "four_over_six_quantize", "four_over_six_quantize_decode",
    "global_decode_factor", "group_amax", "nvfp4_dequantize", "nvfp4_quantize", "row_amax", "tensor_amax",
    "FourOverSixRecipe", "four_over_six_grouped_mm", "four_over_six_linear", "four_over_six_mm",
    "FourOverSixLinear", "FourOverSixTrainingConfig", "convert_experts", "four_over_six_experts_class",
    "quantizable_linear",
]


def __getattr__(name: str):
    """FourOverSixTrainingConfig and quantizable_linear import torchao, so they load on first use."""
    if name in ("FourOverSixTrainingConfig", "quantizable_linear"):
        from .modules import torchao_config

        return getattr(torchao_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
