"""The dispatch layer: the only place that chooses between the Triton kernels and the reference, and the
public quantize / decode / amax entry points (checked, and opaque custom ops under torch.compile)."""

from ..numerics.reference import global_decode_factor
from .api import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, group_amax,
                  nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax)
from .backend import QUANTIZER_ENV, QUANTIZERS

__all__ = [
    "NVFP4Blocks", "QUANTIZERS", "QUANTIZER_ENV", "decode_block_scaled", "four_over_six_quantize",
    "four_over_six_quantize_decode", "global_decode_factor", "group_amax", "nvfp4_dequantize", "nvfp4_quantize",
    "row_amax", "tensor_amax",
]
