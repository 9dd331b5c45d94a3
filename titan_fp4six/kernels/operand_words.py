"""How the quantizer reads its operand and writes its outputs: a block's 16 elements loaded as 32-bit words
(row-major; vector loads of aligned runs) or as a tile down the columns split into one block per thread (x^T
read in place, rows past M as zeros), their FP32 values and sign bits, and the chunk's codes, scales, map-to-4
marks and decode stored."""

import triton
import triton.language as tl

from .bits import SIGN_BIT


@triton.jit
def aligned_run(word, N: tl.constexpr):
    """(BR, NB, N) word offsets word + 0..N-1, marked as N-aligned runs so they become one vector access."""
    offs = word[:, :, None] + tl.arange(0, N)[None, None, :]
    return tl.max_contiguous(tl.multiple_of(offs, [1, 1, N]), [1, 1, N])


@triton.jit
def load_words(ptr, word, mask, N: tl.constexpr, VEC: tl.constexpr):
    """N consecutive int32 words from each block's first word as a tuple of (BR, NB) tensors. VEC (the launcher
    guarantees 16-byte alignment) reads them four at a time: one 16-byte load per thread instead of four."""
    ws = ()
    for k in tl.static_range(N // 4 if VEC else N):
        if VEC:
            offs = aligned_run(word + 4 * k, 4)
            v = tl.load(ptr + offs, mask=mask[:, :, None], other=0)
            even, odd = tl.split(tl.reshape(v, [v.shape[0], v.shape[1], 2, 2]))
            w0, w2 = tl.split(even)
            w1, w3 = tl.split(odd)
            ws = ws + (w0, w1, w2, w3)
        else:
            ws = ws + (tl.load(ptr + word + k, mask=mask, other=0), )
    return ws


@triton.jit
def store_words(ptr, word, ws, mask, VEC: tl.constexpr, WHOLE_SECTORS: tl.constexpr = False):
    """Store a tuple of 2 or 8 int32 (BR, NB) tensors at consecutive words from `word` (aligned to 8 or 16 bytes
    when VEC): one 8- or 16-byte store per thread and group instead of one per word. Eight words stored as two
    16-byte groups write half of each 32-byte sector per store instruction; WHOLE_SECTORS stores them as one
    32-byte run, which Triton lays over two threads per block (a layout change through shared memory, or
    shuffles within one warp) so each instruction writes whole sectors."""
    if VEC:
        if len(ws) == 2:
            offs = aligned_run(word, 2)
            tl.store(ptr + offs, tl.join(ws[0], ws[1]), mask=mask[:, :, None])
        elif WHOLE_SECTORS:  # word 4a + 2b + c at index [a, b, c] of the joins, flattened in that order
            run = tl.join(tl.join(tl.join(ws[0], ws[4]), tl.join(ws[2], ws[6])),
                          tl.join(tl.join(ws[1], ws[5]), tl.join(ws[3], ws[7])))
            offs = aligned_run(word, 8)
            tl.store(ptr + offs, tl.reshape(run, [run.shape[0], run.shape[1], 8]), mask=mask[:, :, None])
        else:
            for k in tl.static_range(len(ws) // 4):
                quad = tl.join(tl.join(ws[4 * k], ws[4 * k + 2]), tl.join(ws[4 * k + 1], ws[4 * k + 3]))
                offs = aligned_run(word + 4 * k, 4)
                tl.store(ptr + offs, tl.reshape(quad, [quad.shape[0], quad.shape[1], 4]), mask=mask[:, :, None])
    else:
        for j in tl.static_range(len(ws)):
            tl.store(ptr + word + j, ws[j], mask=mask)


@triton.jit
def block_index(rows64, blks, NBLK, TILE16: tl.constexpr):
    """Flat (row, block) index of the one-byte outputs. In the 16x16 (blocks, rows) layout it is declared
    non-contiguous, so Triton stores it in the kernel's layout rather than moving it through shared memory."""
    index = rows64 * NBLK + blks
    return tl.max_contiguous(index, [1, 1]) if TILE16 else index


@triton.jit
def word_to_f32(w, KIND: tl.constexpr, HIGH: tl.constexpr):
    """FP32 of an fp32 word (KIND 0), or of the low / HIGH half of a bf16 (1) or fp16 (2) word; exact."""
    if KIND == 0:
        return w.to(tl.float32, bitcast=True)
    if KIND == 1:
        return (w & -65536).to(tl.float32, bitcast=True) if HIGH else (w << 16).to(tl.float32, bitcast=True)
    return ((w >> 16) if HIGH else w).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def block_magnitudes(ws, KIND: tl.constexpr, PERMUTE: tl.constexpr = False):
    """|x| of the 16 elements of each block as a tuple of FP32 (BR, NB) tensors, from its words (16-bit inputs:
    element 2j in the low half of word j). The fast path works on magnitudes (|x * inv| = |x| * inv, one abs
    per element for both candidates) and takes the signs from the words (with_signs). PERMUTE (GPU only): a bf16
    half is one byte permute (bf16_half) and its abs an operand modifier of the instructions that read it."""
    xs = ()
    for j in tl.static_range(len(ws)):
        if KIND == 0:
            xs = xs + (tl.abs(word_to_f32(ws[j], KIND, False)), )
        elif KIND == 1 and PERMUTE:
            xs = xs + (magnitude(bf16_half(ws[j], False)), magnitude(bf16_half(ws[j], True)))
        else:
            xs = xs + (tl.abs(word_to_f32(ws[j], KIND, False)), tl.abs(word_to_f32(ws[j], KIND, True)))
    return xs


@triton.jit
def sign_bit(ws, i: tl.constexpr, KIND: tl.constexpr):
    """The IEEE sign of element i of each block, in bit 31 of an int32, read off its word."""
    if KIND == 0:
        return ws[i] & SIGN_BIT
    return (ws[i // 2] if i % 2 == 1 else ws[i // 2] << 16) & SIGN_BIT


@triton.jit
def column_start(rows64, blks, stride, M):
    """Where the blocks of x^T start in a row-major x (M, K) of row stride `stride` elements: for output row k
    (x's column) and block b, element i is x[16b + i, k] at offset + i * stride, and exists for i < left (rows at
    or past M read as the zero rows that pad x to a multiple of 16). (offset, stride, left)."""
    return (blks.to(tl.int64) * 16) * stride + rows64, stride, M - blks * 16


@triton.jit
def token_block_start(rows64, blks, stride, blocks_ptr, NBLK):
    """column_start for the grouped wgrad's token-block layout of a row-major x (M, K): block b of output row k
    is x[start_b + i, k] for i < left_b (the block's tokens; the rest of the 16 read as zeros), start_b and left_b
    at blocks_ptr[b] and blocks_ptr[NBLK + b] (int32)."""
    inside = blks < NBLK
    start = tl.load(blocks_ptr + blks, mask=inside, other=0)
    left = tl.load(blocks_ptr + NBLK + blks, mask=inside, other=0)
    return start.to(tl.int64) * stride + rows64, stride, left


@triton.jit
def load_column_tile(ptr, where, mask, KIND: tl.constexpr, VEC: tl.constexpr):
    """The 16 elements of each block of x^T as one (BR, NB, 16) tile, element i of a block x[16b + i, k] (ptr
    addresses elements: int16 for 16-bit input, int32 for fp32); missing rows (padding) load as +0. One load,
    so the next chunk's tile is in flight while this one is worked on (column_words splits it). VEC (the launcher
    guarantees x 16-byte aligned and its row stride and column count multiples of 16 bytes' worth of elements):
    a thread reads 16 bytes of consecutive columns per access, where alone Triton can prove no alignment (the
    row stride is not specialized) and reads one element at a time."""
    start, stride, left = where
    i = tl.arange(0, 16)[None, None, :]
    offs = start[:, :, None] + i * stride
    ok = mask[:, :, None] & (i < left[:, :, None])
    if VEC:
        V: tl.constexpr = 4 if KIND == 0 else 8
        offs = tl.max_contiguous(tl.multiple_of(offs, [V, 1, 1]), [V, 1, 1])
        ok = tl.max_constancy(ok, [V, 1, 1])
    return tl.load(ptr + offs, mask=ok, other=0)


@triton.jit
def bf16_half(w, HIGH: tl.constexpr):
    """word_to_f32 of a bf16 word's low / HIGH half on a GPU: one byte permute (that half into the high half, zeros
    below). Hidden from the compiler, which given a word packed from 16-bit halves spends two or three
    instructions on the shift and mask."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, " + ("0x3244;" if HIGH else "0x1044;"), "=r,r", [w],
                                     dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)


@triton.jit
def magnitude(f):
    """|f| on a GPU as an abs.f32, which the compiler folds into the instructions that read f (an operand
    modifier), where tl.abs of bits just built from integers becomes one more integer mask per element."""
    return tl.inline_asm_elementwise("abs.f32 $0, $1;", "=f,f", [f], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def halves_word(low, high):
    """The int32 word of two 16-bit halves on a GPU: a mov.b32 of the pair, which ptxas drops where the halves
    already are one register's (column_words)."""
    return tl.inline_asm_elementwise("mov.b32 $0, {$1, $2};", "=r,h,h", [low, high], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def column_words(tile, KIND: tl.constexpr, PERMUTE: tl.constexpr):
    """(words, magnitudes) of the blocks of a load_column_tile tile: the words load_words gives (one (BR, NB)
    tensor per word: per element for fp32, two 16-bit elements per word with element 2j in the low half) and
    block_magnitudes of them (PERMUTE as there). The tile's last axis is split off element by element (8a + 4b +
    2c + d split as d, c, b, a), which gathers each block's 16 elements into one thread with elements 2j and 2j + 1
    side by side in one register; with PERMUTE a word is that register as it is (mov.b32 of its two halves, which
    ptxas drops), where the compiler's shift and mask of the halves took two byte permutes per word."""
    es = (tl.reshape(tile, [tile.shape[0], tile.shape[1], 2, 2, 2, 2]), )
    for level in tl.static_range(4):
        halves = ()
        for j in tl.static_range(len(es)):
            lo, hi = tl.split(es[j])
            halves = halves + (lo, hi)
        es = halves
    ws = ()
    for i in tl.static_range(16):  # element 8a + 4b + 2c + d is es[8d + 4c + 2b + a]
        ws = ws + (es[8 * (i % 2) + 4 * (i // 2 % 2) + 2 * (i // 4 % 2) + i // 8], )
    if KIND != 0:
        packed = ()
        for j in tl.static_range(8):
            if PERMUTE:
                packed = packed + (halves_word(ws[2 * j], ws[2 * j + 1]), )
            else:
                packed = packed + ((ws[2 * j].to(tl.int32) & 0xFFFF) | (ws[2 * j + 1].to(tl.int32) << 16), )
        ws = packed
    return ws, block_magnitudes(ws, KIND, PERMUTE)


@triton.jit
def load_element(x_ptr, word, i, mask, KIND: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Element i (a runtime index) of each block as FP32, read from memory again (the exact path's input).
    TRANSPOSED: word is column_start's (offset, stride, left) and x_ptr addresses elements."""
    if TRANSPOSED:
        start, stride, left = word
        w = tl.load(x_ptr + start + i * stride, mask=mask & (i < left), other=0).to(tl.int32)
        return word_to_f32(w, KIND, False)
    else:  # a constexpr branch: a tuple word never reaches the row-major code
        if KIND == 0:
            return word_to_f32(tl.load(x_ptr + word + i, mask=mask, other=0), KIND, False)
        w = tl.load(x_ptr + word + i // 2, mask=mask, other=0)
        return word_to_f32(tl.where(i % 2 == 0, w, w >> 16), KIND, False)


@triton.jit
def store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, pick, dec,
                 WRITE_MAP4: tl.constexpr, TILE16: tl.constexpr, WRITE_DEC: tl.constexpr):
    """A chunk's outputs: scale bytes and packed codes; the map-to-4 flags (WRITE_MAP4) and the decode."""
    index = block_index(rows64, blks, NBLK, TILE16)
    if WRITE_MAP4:
        tl.store(map4_ptr + index, pick.to(tl.uint8), mask=ok)
    if WRITE_DEC:  # whole sectors for 16x16 (0.237 -> 0.230 ms on an H200), not for 1x16 (0.176 -> 0.188 ms)
        store_words(dec_ptr, rows64 * (NBLK * 8) + blks * 8, dec, ok, True, TILE16)
    tl.store(scales_ptr + index, sf.to(tl.uint8), mask=ok)
    # The codes of a block as one int64, stored from the kernel's layout: the columnwise stochastic kernel moved
    # the two words joined into a pair through shared memory first (an 8-byte store and load and two barriers per
    # chunk, sm_90a SASS). 16x16 keeps the pair, in whose loop the int64 took ~40 more instructions.
    if TILE16:
        store_words(codes_ptr, rows64 * (NBLK * 2) + blks * 2, (lo, hi), ok, True)
    else:
        pair = (lo.to(tl.uint32, bitcast=True).to(tl.int64) | (hi.to(tl.int64) << 32))
        tl.store(codes_ptr.to(tl.pointer_type(tl.int64)) + index, pair, mask=ok)
