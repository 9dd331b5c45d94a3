"""The quantizers' run functions: kernel or reference per backend.kernels_for, no argument checks.

The ops call these on their own, already validated operands (the hot path checks nothing twice); the public
entry points in api.py check their arguments first. Every function returns the same bytes whichever
implementation runs.
"""

import torch

from ..numerics import reference
from .backend import kernels_for


def run_four_over_six(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                      quantizer: str, decode: bool, choose: bool = True):
    """(codes, scales, map4, bf16 block-scaled decode or None) of a validated 2-D x.

    With decode the kernel writes the decode in the same pass over x (what the emulated GEMMs consume).
    choose=False (map-to-6 only) has no kernel yet: it runs the reference, also on CUDA (same bytes)."""
    kernels = kernels_for(x, quantizer, "quantize") if choose else None
    if kernels is not None:
        if decode:
            dec, codes, scales, map4 = kernels.four_over_six_quantize_decode(x, amax, block, err_mode, scale_bound)
            return codes, scales, map4, dec
        return (*kernels.four_over_six_quantize(x, amax, block, err_mode, scale_bound), None)
    codes, scales, map4 = reference.four_over_six_reference(x, amax, block, err_mode, scale_bound, choose)
    return codes, scales, map4, (run_decode_block_scaled(codes, scales, quantizer) if decode else None)


def run_nvfp4(x: torch.Tensor, amax: torch.Tensor, quantizer: str):
    """(codes, scales) of standard NVFP4 (B=448, 1x16) of a validated 2-D x."""
    kernels = kernels_for(x, quantizer, "quantize")
    return kernels.nvfp4_quantize(x, amax) if kernels is not None else reference.nvfp4_reference(x, amax)


def run_decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, quantizer: str = "auto",
                            dtype=torch.bfloat16) -> torch.Tensor:
    """Exact e2m1 * block scale of validated codes and scales (in bf16: the emulated GEMMs' operand)."""
    return reference.decode_block_scaled_reference(codes, scales, dtype)


def run_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int, dtype,
                   quantizer: str = "auto") -> torch.Tensor:
    """Real values of validated codes, scales and amax, in dtype."""
    return reference.dequantize_reference(codes, scales, amax, scale_bound, dtype)
