"""Bit-exact NVFP4 and four-over-six numerics (pure PyTorch, no torchtitan)."""

from .amax import group_amax, group_index, row_amax, tensor_amax
from .quantize import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, global_decode_factor,
                       nvfp4_dequantize, nvfp4_quantize)

__all__ = [
    "NVFP4Blocks", "decode_block_scaled", "four_over_six_quantize", "four_over_six_quantize_decode", "global_decode_factor", "group_amax",
    "group_index", "nvfp4_dequantize", "nvfp4_quantize", "row_amax", "tensor_amax",
]
