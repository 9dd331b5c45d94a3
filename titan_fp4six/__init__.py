"""titan_fp4six: NVFP4 four-over-six training for torchtitan.

Layers: numerics (bit-exact quantizers) -> kernels (Triton fast paths) -> ops (GEMMs with autograd)
-> modules (Linear / experts) -> integration (torchtitan converters, config, data, launcher).
Only `integration` imports torchtitan.
"""

from .numerics import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, group_amax, nvfp4_dequantize,
                       nvfp4_quantize, row_amax, tensor_amax)

__all__ = [
    "NVFP4Blocks", "decode_block_scaled", "four_over_six_quantize", "four_over_six_quantize_decode", "group_amax", "nvfp4_dequantize",
    "nvfp4_quantize", "row_amax", "tensor_amax",
]
