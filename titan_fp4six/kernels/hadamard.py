"""Triton 16-point randomized Hadamard transform ('rht16') down the columns of x, bitwise equal to
numerics/hadamard.py (docs/numerics.md section 11).

One program transforms 16 rows x BLOCK_K columns: each thread holds its column's 16 elements as a tuple of FP32
values (converted exactly from the input's bits), multiplies them by +-0.25 (the sign times 1/sqrt(16)), runs the
four butterfly stages h = 1, 2, 4, 8 in the spec's order (separately rounded FP32 adds), makes a zero +0 and rounds
to the input dtype (bf16 by its bits, to nearest even; NaN as 0x7FC0). Rows at or past M read as the zero rows
that pad x to a multiple of 16. With AMAX the same pass also takes max |output| and max |input| (exact, as
kernels/amax.py: the max of FP32 bit patterns, a NaN propagating), per tensor or per token group: the amaxes the
quantizer of the transformed operand and the untransformed dgrad operand need, without another read of either.
The columnwise quantizer then reads the result in place (quant/quantize.py).
"""

import torch
import triton
import triton.language as tl

from ..numerics.formats import RHT_SIGNS
from .launch import COMPILE_OPTIONS, cdiv

BLOCK_K = 128
_NEG_MASK = sum(1 << i for i, s in enumerate(RHT_SIGNS) if s < 0)  # bit i: element i's sign is -1
_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@triton.jit
def _load_f32(ptr, offs, mask, KIND: tl.constexpr):
    """FP32 (exact) of the elements at offs: fp32 words (KIND 0), bf16 (1) or fp16 (2) halves; masked: +0."""
    w = tl.load(ptr + offs, mask=mask, other=0)
    # one branch per kind, no early return: Triton compiles the statements after a constexpr branch's return too
    if KIND == 0:
        v = w.to(tl.float32, bitcast=True)
    elif KIND == 1:
        v = (w.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        v = w.to(tl.float16, bitcast=True).to(tl.float32)
    return v


@triton.jit
def _store_from_f32(ptr, offs, v, mask, KIND: tl.constexpr):
    """v rounded to nearest even in the output dtype (bf16 through its FP32 bits; NaN as 0x7FC0); returns the
    FP32 bit pattern of |stored value| (what an amax of the output reads)."""
    if KIND == 0:
        bits = v.to(tl.int32, bitcast=True)
        tl.store(ptr + offs, bits, mask=mask)
    elif KIND == 1:
        nan = v != v
        u = tl.where(nan, 0, v.to(tl.int32, bitcast=True))
        r = tl.where(nan, 0x7FC0, ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF)
        tl.store(ptr + offs, r.to(tl.int16), mask=mask)
        bits = r << 16
    else:
        h = v.to(tl.float16)
        tl.store(ptr + offs, h.to(tl.int16, bitcast=True), mask=mask)
        bits = h.to(tl.float32).to(tl.int32, bitcast=True)
    return bits & 0x7FFFFFFF


@triton.jit
def _atomic_max_bits(ptr, bits, mask):
    """Atomic max of non-negative FP32 bit patterns, skipped where the value there already covers `bits`: the
    value only grows, so a read that covers `bits` proves the final one does (most programs then skip the
    atomic, which all programs of a per-tensor amax would otherwise queue on one address)."""
    seen = tl.load(ptr, mask=mask, other=0)
    tl.atomic_max(ptr, bits, mask=mask & (bits > seen), sem="relaxed")


@triton.jit
def _rht16_columns_kernel(x_ptr, blocks_ptr, out_ptr, amax_ptr, M, K, stride, NBLK, E, KIND: tl.constexpr,
                          NEG: tl.constexpr, BK: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, AMAX: tl.constexpr):
    """Output rows 16b..16b+15 (b the program's block) of BK columns: x's rows 16b + i below M, or with
    TOKEN_BLOCKS the block's rows of x by its entry in the token-block table (first row blocks_ptr[b], tokens
    blocks_ptr[NBLK + b], group blocks_ptr[2 NBLK + b]), transformed. AMAX: max |output| and max |input| as FP32
    bits into int32 zeros, amax_ptr[0] and [1], or with TOKEN_BLOCKS amax_ptr[g] and [E + g] for the block's
    group g < E (blocks of no group add nothing)."""
    row0 = tl.program_id(0) * 16
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    in_cols = cols < K
    if TOKEN_BLOCKS:
        first = tl.load(blocks_ptr + tl.program_id(0))
        rows = tl.load(blocks_ptr + NBLK + tl.program_id(0))
    else:
        first = row0
        rows = M - row0
    ys = ()
    in_max = tl.zeros([BK], tl.int32)
    for i in tl.static_range(16):
        # the row test as a tensor: Triton's interpreter cannot combine a scalar bool with a tensor
        v = _load_f32(x_ptr, (first + i).to(tl.int64) * stride + cols, in_cols & (tl.zeros_like(cols) + i < rows),
                      KIND)
        if AMAX:
            in_max = tl.maximum(in_max, v.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        v = v * 0.25
        if (NEG >> i) & 1:  # -(v * 0.25) is v * -0.25: rounding to nearest is symmetric
            v = -v
        ys = ys + (v, )
    for s in tl.static_range(4):
        nys = ()
        for i in tl.static_range(16):
            if (i >> s) & 1 == 0:
                nys = nys + (ys[i] + ys[i + (1 << s)], )
            else:
                nys = nys + (ys[i - (1 << s)] - ys[i], )
        ys = nys
    out_max = tl.zeros([BK], tl.int32)
    for i in tl.static_range(16):
        row = (row0 + i).to(tl.int64)
        bits = _store_from_f32(out_ptr, row * K + cols, tl.where(ys[i] == 0.0, 0.0, ys[i]), in_cols, KIND)  # -0: +0
        if AMAX:
            out_max = tl.maximum(out_max, bits)
    if AMAX:
        if TOKEN_BLOCKS:
            group = tl.load(blocks_ptr + 2 * NBLK + tl.program_id(0))
            slot, second, ok = group, E + group, group < E
        else:
            slot, second, ok = 0, 1, True
        _atomic_max_bits(amax_ptr + slot, tl.max(out_max, 0), ok)
        _atomic_max_bits(amax_ptr + second, tl.max(in_max, 0), ok)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def eligible(x: torch.Tensor) -> bool:
    """Inputs the kernel takes (a validated 2-D float x): CUDA and unit column stride (any row stride)."""
    return x.is_cuda and x.stride(1) == 1


def _launch(x: torch.Tensor, rows: int, table: torch.Tensor | None, amax: torch.Tensor | None) -> torch.Tensor:
    """The transformed (rows, K) output of x, by the token-block `table` (3, rows/16) or x's own 16-row blocks;
    amax: int32 zeros (2,) or (2, E) taking max |output| and max |input| (per group with a table), or None."""
    k = x.shape[1]
    out = torch.empty(rows, k, dtype=x.dtype, device=x.device)
    nblk = rows // 16
    if nblk and k:
        groups = 0 if amax is None or amax.dim() == 1 else amax.shape[1]
        _rht16_columns_kernel[(nblk, cdiv(k, BLOCK_K))](_bits(x), out if table is None else table, _bits(out),
                                                        out if amax is None else amax, x.shape[0], k, x.stride(0),
                                                        nblk, groups, _KIND[x.dtype], _NEG_MASK, BLOCK_K,
                                                        table is not None, amax is not None, **COMPILE_OPTIONS)
    return out


def rht16_columns(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) zero-padded to ceil16(M) rows, each 16-row block of every column transformed: (ceil16(M), K)
    contiguous, in x's dtype (numerics.hadamard.rht16_columns_reference)."""
    return _launch(x, -(-x.shape[0] // 16) * 16, None, None)


def rht16_columns_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rht16_columns(x), FP32 (2,): max |transformed|, max |x|) from one pass over x."""
    amax = torch.zeros(2, dtype=torch.int32, device=x.device)
    return _launch(x, -(-x.shape[0] // 16) * 16, None, amax), amax.view(torch.float32)


def rht16_token_blocks_amax(x: torch.Tensor, blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's token rows laid out by `blocks` (a numerics.groups.TokenBlocks: its (3, P/16) int32 table holds each
    block's first row of x, its tokens and its group), every 16-token block of every column transformed: (P, K)
    contiguous in x's dtype, rows 16b+i past a block's tokens transformed as zeros; FP32 (2, E): per token group
    max |transformed| over its blocks and max |x| over its tokens, 0 for empty groups), from one pass over x."""
    amax = torch.zeros(2, blocks.ends.numel(), dtype=torch.int32, device=x.device)
    return _launch(x, blocks.table.shape[1] * 16, blocks.table, amax), amax.view(torch.float32)
