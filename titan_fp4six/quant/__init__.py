"""The operand layer: how each operand of a four-over-six GEMM is quantized, and where.

recipe (the knobs and their rules) -> GemmPlan (a spec per operand role) -> operands.gemm_quantizers (the plan's
role quantizers on a device) -> the run functions of quantize.py / amax.py / epilogue.py -> primitives.pick (a
Triton kernel or the reference, the same bytes). process_state holds the process-wide state (stochastic
rounding seeds, map-to-4 counts); api.py the public quantize / decode / amax entry points (checked, and opaque
custom ops under torch.compile, library.py).
"""

from ..numerics.reference import global_decode_factor
from .api import (NVFP4Blocks, decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, group_amax,
                  nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax)
from .backends import QUANTIZER_ENV, QUANTIZERS

__all__ = [
    "NVFP4Blocks", "QUANTIZERS", "QUANTIZER_ENV", "decode_block_scaled", "four_over_six_quantize",
    "four_over_six_quantize_decode", "global_decode_factor", "group_amax", "nvfp4_dequantize", "nvfp4_quantize",
    "row_amax", "tensor_amax",
]
