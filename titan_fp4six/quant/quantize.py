"""The quantize, transform and decode primitives (a kernel of kernels/quantize.py, hadamard.py or decode.py and
its reference, which takes the kernel's arguments and returns the same bytes) and their run functions.

Nothing here checks arguments: the role quantizers (operands.py) pick these primitives for the ops' own, already
validated operands (the hot path checks nothing twice); the public entry points in api.py check theirs before
they call run_quantize / run_decode_block_scaled / run_dequantize (the last also the ops' dequantized backward).
"""

import torch

from ..numerics import reference
from ..numerics.formats import BLOCK_SIZE
from ..numerics.groups import RowGroups, TokenBlocks
from ..numerics.hadamard import rht16_columns_reference
from ..numerics.spec import OperandSpec
from ..numerics.validation import check_amax_covers, check_seed
from .amax import token_groups_amax_reference
from .primitives import Primitive, pick


def _quantize_reference(x, amax, spec: OperandSpec, decode=False, check_amax=False, groups=None, map4=True,
                        seed=None):
    if check_amax:
        check_amax_covers(x, amax)
    amax_rows = reference.amax_per_row(amax, x.shape[0], groups)
    if spec.candidates == "nvfp4":
        codes, scales = reference.nvfp4_reference(x, amax_rows, seed if spec.rounding == "stochastic" else None)
        mask = None
    else:
        codes, scales, mask = reference.four_over_six_reference(x, amax_rows, spec.block, spec.err_mode,
                                                                spec.scale_bound, spec.choose)
        if isinstance(map4, torch.Tensor):
            map4[0, :2].add_(reference.map4_counts(mask, groups))
    dec = reference.decode_block_scaled_reference(codes, scales, torch.bfloat16) if decode else None
    return codes, scales, (mask if map4 is True else None), dec


def padded_transpose(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) -> x^T (K, ceil16(M)) with zero columns appended: zeros are transparent to the quantizers (they
    never raise a block amax, encode exactly and add +0 to both candidates' errors)."""
    extra = -x.shape[0] % BLOCK_SIZE
    return torch.nn.functional.pad(x, (0, 0, 0, extra)).t().contiguous()


def _columnwise_reference(x, amax, spec: OperandSpec, decode=False, map4=True, seed=None):
    return _quantize_reference(padded_transpose(x), amax, spec, decode, map4=map4, seed=seed)


def _token_blocks_reference(x, blocks: TokenBlocks, amax, spec: OperandSpec, decode=False, seed=None):
    """The layout's blocks as the rows of a (P/16, C * 16) matrix (one row per block index j, an amax per row), or
    of a (P/16 * C, 16) matrix (one row per block, for per-column amaxes), quantized rowwise: a 1x16 block's codes
    and scale depend only on its 16 values and its amax, so these are the bytes of the layout's transpose
    quantized block by block; a stochastic spec's random bits follow the element's index in that block-row
    matrix (docs/numerics.md section 12)."""
    laid = blocks.gather(x)
    p, c = laid.shape
    block_amax = blocks.block_amax(amax)
    rows = laid.view(p // BLOCK_SIZE, BLOCK_SIZE, c).transpose(1, 2)
    if block_amax.dim() == 1:
        rows = rows.reshape(p // BLOCK_SIZE, c * BLOCK_SIZE)
    else:
        rows, block_amax = rows.reshape(-1, BLOCK_SIZE), block_amax.reshape(-1)
    codes, scales, _, dec = _quantize_reference(rows, block_amax.contiguous(), spec, decode, map4=False, seed=seed)
    codes = codes.view(p // BLOCK_SIZE, c, BLOCK_SIZE // 2).transpose(0, 1).reshape(c, p // 2)
    scales = scales.view(torch.uint8).view(p // BLOCK_SIZE, c).t().contiguous().view(torch.float8_e4m3fn)
    if dec is not None:
        dec = dec.view(p // BLOCK_SIZE, c, BLOCK_SIZE).transpose(0, 1).reshape(c, p)
    return codes, scales, None, dec


def _dequantize_reference(codes, scales, amax, scale_bound: int, dtype, groups=None):
    amax_rows = reference.amax_per_row(amax, codes.shape[0], groups)
    return reference.dequantize_reference(codes, scales, amax_rows, scale_bound, dtype)


def _rht16_columns_amax_reference(x):
    t = rht16_columns_reference(x)
    return t, torch.stack((reference.tensor_amax_reference(t), reference.tensor_amax_reference(x)))


def _rht16_token_blocks_amax_reference(x, blocks: TokenBlocks):
    laid = blocks.gather(x)
    t = rht16_columns_reference(laid)
    return t, torch.stack((token_groups_amax_reference(t, blocks.ends),
                           token_groups_amax_reference(laid, blocks.ends)))


QUANTIZE = Primitive("quantize", _quantize_reference, lambda k: k.quantize.quantize, lambda k: k.quantize.eligible)
QUANTIZE_COLUMNWISE = Primitive("columnwise quantize", _columnwise_reference, lambda k: k.quantize.quantize_columnwise,
                                lambda k: k.quantize.eligible_columnwise)
QUANTIZE_TOKEN_BLOCKS = Primitive("token-block quantize", _token_blocks_reference,
                                  lambda k: k.quantize.quantize_token_blocks, lambda k: k.quantize.eligible_columnwise)
RHT16_COLUMNS = Primitive("RHT", rht16_columns_reference, lambda k: k.hadamard.rht16_columns,
                          lambda k: k.hadamard.eligible)
RHT16_COLUMNS_AMAX = Primitive("RHT with amaxes", _rht16_columns_amax_reference,
                               lambda k: k.hadamard.rht16_columns_amax, lambda k: k.hadamard.eligible)
RHT16_TOKEN_BLOCKS_AMAX = Primitive("token-block RHT with amaxes", _rht16_token_blocks_amax_reference,
                                    lambda k: k.hadamard.rht16_token_blocks_amax, lambda k: k.hadamard.eligible)
DECODE = Primitive("decode",
                   lambda codes, scales: reference.decode_block_scaled_reference(codes, scales, torch.bfloat16),
                   lambda k: k.decode.decode_block_scaled, lambda k: k.decode.eligible)
DEQUANTIZE = Primitive("dequantize", _dequantize_reference, lambda k: k.decode.nvfp4_dequantize,
                       lambda k: k.decode.eligible)


def run_quantize(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, quantizer: str, decode: bool,
                 check_amax: bool = False, groups: RowGroups | None = None, map4: bool | torch.Tensor = True,
                 seed: int | None = None):
    """(codes, scales, map4 mask or None, bf16 block-scaled decode or None) of a validated 2-D x quantized by
    `spec` (`quantizer` resolved by backends.resolve_backends).

    Each row's amax: reference.amax_per_row(amax, rows, groups) (per tensor, row, run of rows or token group).
    With decode the kernel writes the decode in the same pass over x (what the emulated GEMMs consume);
    check_amax runs the public amax check (the kernel asserts it in its own read of x). map4 (four-over-six
    specs): True returns the map-to-4 mask, False none, a map4_counts buffer gets the counts added instead (the
    kernel counts in its own pass: no mask, no reduction launch). seed: the Philox seed of a spec with
    rounding='stochastic' (an int in [0, 2^63), required there; docs/numerics.md section 12)."""
    _check_untransformed(spec, "run_quantize")
    if spec.rounding == "stochastic":
        check_seed(seed)
    if check_amax and not x.numel():  # the kernel checks in its read of x, and no launch reads an empty x
        check_amax_covers(x, amax)
    return pick(QUANTIZE, quantizer, x)(x, amax, spec, decode, check_amax, groups, map4, seed)


def _check_untransformed(spec: OperandSpec, name: str) -> None:
    """A spec with a transform changes the amax too: the role quantizer transforms first (operands.py)."""
    if spec.transform != "none":
        raise ValueError(f"{name} takes untransformed specs; got transform={spec.transform!r} (transform the "
                         "operand first: RoleQuantizer.columns / token_blocks)")


def run_quantize_token_blocks(x: torch.Tensor, blocks: TokenBlocks, amax: torch.Tensor, spec: OperandSpec,
                              quantizer: str, decode: bool, seed: int | None = None):
    """(codes (C, P/2), scales (C, P/16), bf16 decode (C, P) or None): the grouped wgrad's columnwise operand of
    x (M, C), x's token rows laid out by `blocks` and quantized along the tokens by a 1x16 `spec`, the j-th
    16-token block of every row with its group's amax (amax (E,)) or its group's for its column (amax (E, C)).
    The kernel reads x in place by the blocks' table; the reference quantizes the gathered layout
    (_token_blocks_reference), the same bytes."""
    _check_untransformed(spec, "run_quantize_token_blocks")
    codes, scales, _, dec = pick(QUANTIZE_TOKEN_BLOCKS, quantizer, x)(x, blocks, amax, spec, decode, seed)
    return codes, scales, dec


def run_rht16_columns(x: torch.Tensor, quantizer: str) -> torch.Tensor:
    """x (M, K) zero-padded to ceil16(M) rows with each 16-row block of every column transformed by the 16-point
    randomized Hadamard transform ('rht16', docs/numerics.md section 11): (ceil16(M), K) in x's dtype."""
    return pick(RHT16_COLUMNS, quantizer, x)(x)


def run_rht16_columns_amax(x: torch.Tensor, quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(run_rht16_columns(x), FP32 (2,): max |transformed|, max |x|): the kernel takes both amaxes in its one pass
    over x (exact: the same values as separate reductions)."""
    return pick(RHT16_COLUMNS_AMAX, quantizer, x)(x)


def run_rht16_token_blocks_amax(x: torch.Tensor, blocks: TokenBlocks,
                                quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's token rows laid out by `blocks` (P, C), each 16-token block of every column transformed (as
    run_rht16_columns of the layout; the kernel reads x in place), FP32 (2, E): per token group max |transformed|
    over its blocks and max |x| over its tokens)."""
    return pick(RHT16_TOKEN_BLOCKS_AMAX, quantizer, x)(x, blocks)


def run_decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, quantizer: str,
                            dtype=torch.bfloat16) -> torch.Tensor:
    """Exact e2m1 * block scale of validated codes and scales (in bf16: the emulated GEMMs' operand; the kernel
    writes bf16 only, other dtypes are the reference's)."""
    if dtype != torch.bfloat16:
        return reference.decode_block_scaled_reference(codes, scales, dtype)
    return pick(DECODE, quantizer, codes, scales)(codes, scales)


def run_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int, dtype,
                   quantizer: str, groups: RowGroups | None = None) -> torch.Tensor:
    """Real values of validated codes, scales and amax (each row's by reference.amax_per_row), in dtype."""
    return pick(DEQUANTIZE, quantizer, codes, scales)(codes, scales, amax, scale_bound, dtype, groups)
