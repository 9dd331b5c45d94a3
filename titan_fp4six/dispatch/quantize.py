"""The quantizers' run functions: kernel or reference per backend.kernels_for, no argument checks.

The ops call these on their own, already validated operands (the hot path checks nothing twice); the public
entry points in api.py check their arguments first. Every function returns the same bytes whichever
implementation runs.
"""

import torch

from ..numerics import reference
from ..numerics.formats import BLOCK_SIZE
from ..numerics.reference import RowGroups
from ..numerics.validation import check_amax_covers
from .backend import kernels_for


def run_four_over_six(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                      quantizer: str, decode: bool, choose: bool = True, check_amax: bool = False,
                      groups: RowGroups | None = None, map4: bool | torch.Tensor = True):
    """(codes, scales, map4 mask or None, bf16 block-scaled decode or None) of a validated 2-D x.

    Each row's amax: reference.amax_per_row(amax, rows, groups) (per tensor, row, run of rows or token group).
    With decode the kernel writes the decode in the same pass over x (what the emulated GEMMs consume);
    choose=False keeps map-to-6 in every block; check_amax runs the public amax check (the kernel asserts it in
    its own read of x). map4: True returns the map-to-4 mask, False none, a formats.map4_count_buffer gets
    the counts added instead (the kernel counts in its own pass: no mask, no reduction launch)."""
    kernels = _quantize_kernels(x, amax, quantizer, check_amax)
    if kernels is not None:
        if decode:
            dec, codes, scales, mask = kernels.four_over_six_quantize_decode(x, amax, block, err_mode, scale_bound,
                                                                             choose, check_amax, groups, map4)
            return codes, scales, mask, dec
        return (*kernels.four_over_six_quantize(x, amax, block, err_mode, scale_bound, choose, check_amax, groups,
                                                map4), None)
    amax_rows = reference.amax_per_row(amax, x.shape[0], groups)
    codes, scales, mask = reference.four_over_six_reference(x, amax_rows, block, err_mode, scale_bound, choose)
    if isinstance(map4, torch.Tensor):
        map4[0, :2].add_(reference.map4_counts(mask, groups))
    dec = run_decode_block_scaled(codes, scales, quantizer) if decode else None
    return codes, scales, (mask if map4 is True else None), dec


def run_nvfp4(x: torch.Tensor, amax: torch.Tensor, quantizer: str, decode: bool = False, check_amax: bool = False):
    """(codes, scales, bf16 block-scaled decode or None) of standard NVFP4 (B=448, 1x16) of a validated 2-D x;
    check_amax as in run_four_over_six."""
    kernels = _quantize_kernels(x, amax, quantizer, check_amax)
    if kernels is not None:
        if decode:
            dec, codes, scales = kernels.nvfp4_quantize_decode(x, amax, check_amax)
            return codes, scales, dec
        return (*kernels.nvfp4_quantize(x, amax, check_amax), None)
    codes, scales = reference.nvfp4_reference(x, amax)
    return codes, scales, (run_decode_block_scaled(codes, scales, quantizer) if decode else None)


def _quantize_kernels(x: torch.Tensor, amax: torch.Tensor, quantizer: str, check_amax: bool):
    """The quantize kernels for x, or None for the reference; with check_amax, the amax check runs here unless
    the kernel will run it (it launches nothing for an empty x)."""
    kernels = kernels_for(x, quantizer, "quantize")
    if check_amax and (kernels is None or not x.numel()):
        check_amax_covers(x, amax)
    return kernels


def _columnwise_kernels(x: torch.Tensor, amax: torch.Tensor, quantizer: str):
    return kernels_for(x, quantizer, "quantize", check="eligible_columnwise") if amax.dim() == 0 else None


def padded_transpose(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) -> x^T (K, ceil16(M)) with zero columns appended: zeros are transparent to the quantizers (they
    never raise a block amax, encode exactly and add +0 to both candidates' errors)."""
    extra = -x.shape[0] % BLOCK_SIZE
    return torch.nn.functional.pad(x, (0, 0, 0, extra)).t().contiguous()


def run_four_over_six_columnwise(x: torch.Tensor, amax: torch.Tensor, err_mode: str, scale_bound: int,
                                 quantizer: str, decode: bool, choose: bool = True, map4: bool = True):
    """Four-over-six (1x16) of x^T for a 2-D x (M, K) with a per-tensor amax, blocked along M: (codes, scales,
    map4 or None, decode or None) of shape (K, ceil16(M) ...). The kernel reads x in place; the reference
    quantizes the zero-padded transpose (same bytes)."""
    kernels = _columnwise_kernels(x, amax, quantizer)
    if kernels is not None:
        dec, codes, scales, mask = kernels.four_over_six_quantize_columnwise(x, amax, err_mode, scale_bound, decode,
                                                                             choose, map4)
        return codes, scales, mask, dec
    return run_four_over_six(padded_transpose(x), amax, "1x16", err_mode, scale_bound, quantizer, decode, choose,
                             map4=map4)


def run_nvfp4_columnwise(x: torch.Tensor, amax: torch.Tensor, quantizer: str, decode: bool):
    """Standard NVFP4 of x^T for a 2-D x (M, K), blocked along M, as run_four_over_six_columnwise."""
    kernels = _columnwise_kernels(x, amax, quantizer)
    if kernels is not None:
        dec, codes, scales = kernels.nvfp4_quantize_columnwise(x, amax, decode)
        return codes, scales, dec
    return run_nvfp4(padded_transpose(x), amax, quantizer, decode)


def run_decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, quantizer: str = "auto",
                            dtype=torch.bfloat16) -> torch.Tensor:
    """Exact e2m1 * block scale of validated codes and scales (in bf16: the emulated GEMMs' operand)."""
    kernels = kernels_for(codes, quantizer, "decode", scales) if dtype == torch.bfloat16 else None
    if kernels is not None:
        return kernels.decode_block_scaled(codes, scales)
    return reference.decode_block_scaled_reference(codes, scales, dtype)


def run_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int, dtype,
                   quantizer: str = "auto", groups: RowGroups | None = None) -> torch.Tensor:
    """Real values of validated codes, scales and amax (each row's by reference.amax_per_row), in dtype."""
    kernels = kernels_for(codes, quantizer, "decode", scales)
    if kernels is not None:
        return kernels.nvfp4_dequantize(codes, scales, amax, scale_bound, dtype, groups)
    amax_rows = reference.amax_per_row(amax, codes.shape[0], groups)
    return reference.dequantize_reference(codes, scales, amax_rows, scale_bound, dtype)
