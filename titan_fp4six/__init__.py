"""titan_fp4six: NVFP4 four-over-six training for torchtitan.

Layers: numerics (bit-exact quantizers) -> kernels (Triton fast paths) -> ops (GEMMs with autograd)
-> modules (Linear / experts) -> integration (torchtitan converters, config, data, launcher).
Only `integration` imports torchtitan.
"""

from .numerics import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, group_amax, nvfp4_dequantize,
                       nvfp4_quantize, row_amax, tensor_amax)
from .ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear, four_over_six_mm
from .modules import (FourOverSixLinear, FourOverSixTrainingConfig, convert_experts, four_over_six_experts_class,
                      quantizable_linear)

__all__ = [
    "NVFP4Blocks", "decode_block_scaled", "four_over_six_quantize", "four_over_six_quantize_decode", "group_amax", "nvfp4_dequantize",
    "nvfp4_quantize", "row_amax", "tensor_amax",
    "FourOverSixRecipe", "four_over_six_grouped_mm", "four_over_six_linear", "four_over_six_mm",
    "FourOverSixLinear", "FourOverSixTrainingConfig", "convert_experts", "four_over_six_experts_class",
    "quantizable_linear",
]
