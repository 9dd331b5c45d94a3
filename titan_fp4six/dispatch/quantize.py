"""The quantizers' run functions: kernel or reference per backend.kernels_for, no argument checks.

The ops call these on their own, already validated operands (the hot path checks nothing twice); the public
entry points in api.py check their arguments first. Every function returns the same bytes whichever
implementation runs.
"""

import torch

from ..numerics import reference
from ..numerics.formats import BLOCK_SIZE
from ..numerics.hadamard import rht16_columns_reference
from ..numerics.groups import RowGroups, TokenBlocks
from ..numerics.spec import OperandSpec
from ..numerics.validation import check_amax_covers, check_seed
from .amax import run_tensor_amax
from .backend import kernels_for


def run_quantize(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, quantizer: str, decode: bool,
                 check_amax: bool = False, groups: RowGroups | None = None, map4: bool | torch.Tensor = True,
                 seed: int | None = None):
    """(codes, scales, map4 mask or None, bf16 block-scaled decode or None) of a validated 2-D x quantized by
    `spec` (`quantizer` resolved by backend.resolve_backends).

    Each row's amax: reference.amax_per_row(amax, rows, groups) (per tensor, row, run of rows or token group).
    With decode the kernel writes the decode in the same pass over x (what the emulated GEMMs consume);
    check_amax runs the public amax check (the kernel asserts it in its own read of x). map4 (four-over-six
    specs): True returns the map-to-4 mask, False none, a formats.map4_count_buffer gets the counts added
    instead (the kernel counts in its own pass: no mask, no reduction launch). seed: the Philox seed of a spec
    with rounding='stochastic' (an int in [0, 2^63), required there; docs/numerics.md section 12)."""
    _check_untransformed(spec, "run_quantize")
    if spec.rounding == "stochastic":
        check_seed(seed)
    kernels = kernels_for(x, quantizer, "quantize")
    if check_amax and (kernels is None or not x.numel()):  # the kernel checks in its read of x; none launches if empty
        check_amax_covers(x, amax)
    if kernels is not None:
        return kernels.quantize(x, amax, spec, decode, check_amax, groups, map4, seed=seed)
    amax_rows = reference.amax_per_row(amax, x.shape[0], groups)
    if spec.candidates == "nvfp4":
        codes, scales = reference.nvfp4_reference(x, amax_rows, seed if spec.rounding == "stochastic" else None)
        mask = None
    else:
        codes, scales, mask = reference.four_over_six_reference(x, amax_rows, spec.block, spec.err_mode,
                                                                spec.scale_bound, spec.choose)
        if isinstance(map4, torch.Tensor):
            map4[0, :2].add_(reference.map4_counts(mask, groups))
    dec = run_decode_block_scaled(codes, scales, quantizer) if decode else None
    return codes, scales, (mask if map4 is True else None), dec


def _check_untransformed(spec: OperandSpec, name: str) -> None:
    """A spec with a transform changes the amax too: run_transformed_columnwise quantizes it."""
    if spec.transform != "none":
        raise ValueError(f"{name} takes untransformed specs; got transform={spec.transform!r} (use "
                         "run_transformed_columnwise)")


def padded_transpose(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) -> x^T (K, ceil16(M)) with zero columns appended: zeros are transparent to the quantizers (they
    never raise a block amax, encode exactly and add +0 to both candidates' errors)."""
    extra = -x.shape[0] % BLOCK_SIZE
    return torch.nn.functional.pad(x, (0, 0, 0, extra)).t().contiguous()


def run_quantize_columnwise(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, quantizer: str, decode: bool,
                            map4: bool = True, seed: int | None = None):
    """x^T for a 2-D x (M, K) with a per-tensor amax quantized by a 1x16 `spec`, blocked along M: as run_quantize,
    of shape (K, ceil16(M) ...). The kernel reads x in place; the reference quantizes the zero-padded transpose
    (same bytes); a stochastic spec's random bits follow the element index in x^T as quantized (K, ceil16(M))."""
    _check_untransformed(spec, "run_quantize_columnwise")
    if amax.dim() == 0:
        kernels = kernels_for(x, quantizer, "quantize", check="eligible_columnwise")
        if kernels is not None:
            return kernels.quantize_columnwise(x, amax, spec, decode, map4, seed=seed)
    return run_quantize(padded_transpose(x), amax, spec, quantizer, decode, map4=map4, seed=seed)


def run_rht16_columns(x: torch.Tensor, quantizer: str) -> torch.Tensor:
    """x (M, K) zero-padded to ceil16(M) rows with each 16-row block of every column transformed by the 16-point
    randomized Hadamard transform ('rht16', docs/numerics.md section 11): (ceil16(M), K) in x's dtype."""
    kernels = kernels_for(x, quantizer, "hadamard")
    return kernels.rht16_columns(x) if kernels is not None else rht16_columns_reference(x)


def run_transformed_columnwise(x: torch.Tensor, spec: OperandSpec, quantizer: str, decode: bool,
                               seed: int | None = None):
    """x^T for a 2-D x (M, K) quantized by a 1x16 `spec` with a transform ('rht16'), blocked along M: the
    transform of each block of 16 rows (zero rows appended up to ceil16(M)), its own per-tensor amax (max |.| of
    the transformed tensor, in x's dtype), then the columnwise quantization of the transformed tensor by the spec
    without its transform (a stochastic spec's seed: its rounding's). (codes (K, ceil16(M)/2), scales
    (K, ceil16(M)/16), amax (), bf16 decode or None)."""
    t = run_rht16_columns(x, quantizer)
    amax = run_tensor_amax(t, quantizer)
    codes, scales, _, dec = run_quantize_columnwise(t, amax, spec.untransformed, quantizer, decode, map4=False,
                                                    seed=seed)
    return codes, scales, amax, dec


def run_quantize_token_blocks(x: torch.Tensor, blocks: TokenBlocks, amax: torch.Tensor, spec: OperandSpec,
                              quantizer: str, decode: bool, seed: int | None = None):
    """(codes (C, P/2), scales (C, P/16), bf16 decode (C, P) or None): the grouped wgrad's columnwise operand of
    x (M, C), x's token rows laid out by `blocks` and quantized along the tokens by a 1x16 `spec`, the j-th
    16-token block of every row with its group's amax (amax (E,)) or its group's for its column (amax (E, C)).

    The reference lays the blocks out as the rows of a (P/16, C * 16) matrix (one row per block index j, an
    amax per row), or of a (P/16 * C, 16) matrix (one row per block, for per-column amaxes), and quantizes it
    rowwise: a 1x16 block's codes and scale depend only on its 16 values and its amax, so these are the bytes of
    the layout's transpose quantized block by block. A stochastically rounded spec (seed) takes its random bits
    by the element's index in that block-row matrix (docs/numerics.md section 12). The kernel reads x in place
    by the blocks' table, the same bytes."""
    _check_untransformed(spec, "run_quantize_token_blocks")
    kernels = kernels_for(x, quantizer, "quantize", check="eligible_columnwise")
    if kernels is not None:
        codes, scales, _, dec = kernels.quantize_token_blocks(x, blocks.table, amax, spec, decode, seed)
        return codes, scales, dec
    laid = blocks.gather(x)
    p, c = laid.shape
    block_amax = blocks.block_amax(amax)
    rows = laid.view(p // BLOCK_SIZE, BLOCK_SIZE, c).transpose(1, 2)
    if block_amax.dim() == 1:
        rows = rows.reshape(p // BLOCK_SIZE, c * BLOCK_SIZE)
    else:
        rows, block_amax = rows.reshape(-1, BLOCK_SIZE), block_amax.reshape(-1)
    codes, scales, _, dec = run_quantize(rows, block_amax.contiguous(), spec, quantizer, decode, map4=False, seed=seed)
    codes = codes.view(p // BLOCK_SIZE, c, BLOCK_SIZE // 2).transpose(0, 1).reshape(c, p // 2)
    scales = scales.view(torch.uint8).view(p // BLOCK_SIZE, c).t().contiguous().view(torch.float8_e4m3fn)
    if dec is not None:
        dec = dec.view(p // BLOCK_SIZE, c, BLOCK_SIZE).transpose(0, 1).reshape(c, p)
    return codes, scales, dec


def run_rht16_token_blocks(x: torch.Tensor, blocks: TokenBlocks, quantizer: str) -> torch.Tensor:
    """x's token rows laid out by `blocks` (P, C), each 16-token block of every column transformed by the
    16-point randomized Hadamard transform (run_rht16_columns of the layout; the kernel reads x in place)."""
    kernels = kernels_for(x, quantizer, "hadamard")
    if kernels is not None:
        return kernels.rht16_token_blocks(x, blocks.table)
    return rht16_columns_reference(blocks.gather(x))


def run_decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, quantizer: str,
                            dtype=torch.bfloat16) -> torch.Tensor:
    """Exact e2m1 * block scale of validated codes and scales (in bf16: the emulated GEMMs' operand)."""
    kernels = kernels_for(codes, quantizer, "decode", scales) if dtype == torch.bfloat16 else None
    if kernels is not None:
        return kernels.decode_block_scaled(codes, scales)
    return reference.decode_block_scaled_reference(codes, scales, dtype)


def run_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int, dtype,
                   quantizer: str, groups: RowGroups | None = None) -> torch.Tensor:
    """Real values of validated codes, scales and amax (each row's by reference.amax_per_row), in dtype."""
    kernels = kernels_for(codes, quantizer, "decode", scales)
    if kernels is not None:
        return kernels.nvfp4_dequantize(codes, scales, amax, scale_bound, dtype, groups)
    amax_rows = reference.amax_per_row(amax, codes.shape[0], groups)
    return reference.dequantize_reference(codes, scales, amax_rows, scale_bound, dtype)
