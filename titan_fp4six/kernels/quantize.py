"""Triton four-over-six and standard NVFP4 quantizers, bitwise equal to numerics/reference.py.

Each thread owns whole 1x16 blocks: the 16 elements are a tuple of (rows, blocks) tensors unrolled at compile
time, so the error sum runs i = 0..15 in order by construction and only 16x16 tiles talk across threads (warp
shuffles, in the spec's tree order). Codes and scale values come from one-add roundings (bits.py); the
four-over-six choice from a cheap error estimate with a proven bound (the comment above _value_step). A chunk
of blocks the bound cannot settle, or outside the bound's range (NaN, FP32's edges), is redone after the
chunk loop with the spec's arithmetic exactly as written. Launched with enable_fp_fusion=False (no contracted
FMA); every division is tl.math.div_rn except two the fast path replaces by exact FMA sequences (bits.div6,
_newton_inverse_scale). Launchers take validated arguments; titan_fp4six.dispatch decides when they run.
docs/kernels.md has the design, the validation and the H200 speed.
"""
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..numerics.formats import MAP4_COUNT_ROWS, MAP4_COUNT_WIDTH
from ..numerics.validation import NEGATIVE_AMAX_MSG, SMALL_AMAX_MSG
from .bits import (FLT_MAX, NAN_CODE, SIGN_BIT, clamp_e2m1, clamp_max, div6, e2m1_code, e2m1_magic, e2m1_value,
                   e4m3_bits, e4m3_byte, e4m3_round, f32_reciprocal, nan_max, tree_sum16)
from .decode import AmaxLayout, e4m3_value, load_row_amax
from .launch import COMPILE_OPTIONS, MAX_GRID_Y, FastLaunch, cdiv


class Launch(NamedTuple):
    """How a kernel variant is launched: a chunk of rows x blocks (one block per thread), at most most_chunks
    chunks per program, warps per program and a register cap (None: the compiler's choice)."""
    rows: int
    blocks: int
    most_chunks: int
    warps: int
    max_registers: int | None = None


# Launch per (kernel, decode). 1x16 and NVFP4: a warp covers 32 consecutive blocks of a row (1 KB of bf16 input,
# whole sectors of codes and scales), one block per thread. 16x16: a program covers 4 blocks of 16 rows (whole
# 32-byte sectors of codes). The quantizer runs it in one warp, each thread holding rows r and r + 8 of a block
# column, so every tile reduction is a register add and shuffles; capped at 96 registers (with one amax per row
# the compiler takes ~101) for 21 resident warps. The fused kernel needs more registers per block and runs it in
# two warps of 4 blocks x 8 rows, whose tile reductions cross the warps through shared memory. The fastest of the
# shapes and caps tried on an H200 (docs/kernels.md).
LAUNCH = {
    ("1x16", False): Launch(1, 32, 8, 1),
    ("1x16", True): Launch(1, 32, 8, 1),
    ("16x16", False): Launch(16, 4, 8, 1, max_registers=96),
    ("16x16", True): Launch(16, 4, 8, 2),
    ("nvfp4", False): Launch(1, 32, 8, 1),
    ("nvfp4", True): Launch(1, 32, 8, 1),
}
# Columnwise (x^T of a row-major x, 1x16 blocks along x's rows): a warp covers 32 consecutive columns k of x, one
# block (16 rows of one column) per thread, so each of a block's 16 element loads reads a contiguous run of the
# warp's 32 columns; the chunk loop walks down x's rows. Not yet timed against other shapes on a GPU.
COLUMN_LAUNCH = Launch(32, 1, 8, 1)
MIN_PROGRAMS = 4096  # about 132 SMs x 32 resident one-warp programs
_INPUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# The amax check's device asserts are compiled in only with debug on; sanitize_overflow off keeps the integer
# arithmetic free of the overflow asserts debug would add.
CHECK_OPTIONS = {"debug": True, "sanitize_overflow": False}
_NEGATIVE_AMAX = tl.constexpr(NEGATIVE_AMAX_MSG)
_SMALL_AMAX = tl.constexpr(SMALL_AMAX_MSG)
_COUNT_ROWS = tl.constexpr(MAP4_COUNT_ROWS)
_COUNT_WIDTH = tl.constexpr(MAP4_COUNT_WIDTH)


@triton.jit
def _div(a, b):
    """Correctly rounded FP32 a / b for a constant a and a tensor b."""
    return tl.math.div_rn(tl.full(b.shape, a, tl.float32), b)


@triton.jit
def _div_by(a, b):
    """Correctly rounded FP32 a / b for a tensor a and a scalar b."""
    return tl.math.div_rn(a, tl.full(a.shape, 0.0, tl.float32) + b)


@triton.jit
def _val_div_6b(num, six_b):
    """num / 6B, correctly rounded. Zero numerators (every E2M1 zero code) skip the division, whose
    hardware range check (FCHK) can route them to the slow path and diverge the warp: +-0 / 6B is +-0."""
    zero = num == 0.0
    return tl.where(zero, num, _div_by(tl.where(zero, 1.0, num), six_b))


@triton.jit
def _aligned_run(word, N: tl.constexpr):
    """(BR, NB, N) word offsets word + 0..N-1, marked as N-aligned runs so they become one vector access."""
    offs = word[:, :, None] + tl.arange(0, N)[None, None, :]
    return tl.max_contiguous(tl.multiple_of(offs, [1, 1, N]), [1, 1, N])


@triton.jit
def _load_words(ptr, word, mask, N: tl.constexpr, VEC: tl.constexpr):
    """N consecutive int32 words from each block's first word as a tuple of (BR, NB) tensors. VEC (the launcher
    guarantees 16-byte alignment) reads them four at a time: one 16-byte load per thread instead of four."""
    ws = ()
    for k in tl.static_range(N // 4 if VEC else N):
        if VEC:
            offs = _aligned_run(word + 4 * k, 4)
            v = tl.load(ptr + offs, mask=mask[:, :, None], other=0)
            even, odd = tl.split(tl.reshape(v, [v.shape[0], v.shape[1], 2, 2]))
            w0, w2 = tl.split(even)
            w1, w3 = tl.split(odd)
            ws = ws + (w0, w1, w2, w3)
        else:
            ws = ws + (tl.load(ptr + word + k, mask=mask, other=0), )
    return ws


@triton.jit
def _store_words(ptr, word, ws, mask, VEC: tl.constexpr, WHOLE_SECTORS: tl.constexpr = False):
    """Store a tuple of 2 or 8 int32 (BR, NB) tensors at consecutive words from `word` (aligned to 8 or 16 bytes
    when VEC): one 8- or 16-byte store per thread and group instead of one per word. Eight words stored as two
    16-byte groups write half of each 32-byte sector per store instruction; WHOLE_SECTORS stores them as one
    32-byte run, which Triton lays over two threads per block (a layout change through shared memory, or
    shuffles within one warp) so each instruction writes whole sectors."""
    if VEC:
        if len(ws) == 2:
            offs = _aligned_run(word, 2)
            tl.store(ptr + offs, tl.join(ws[0], ws[1]), mask=mask[:, :, None])
        elif WHOLE_SECTORS:  # word 4a + 2b + c at index [a, b, c] of the joins, flattened in that order
            run = tl.join(tl.join(tl.join(ws[0], ws[4]), tl.join(ws[2], ws[6])),
                          tl.join(tl.join(ws[1], ws[5]), tl.join(ws[3], ws[7])))
            offs = _aligned_run(word, 8)
            tl.store(ptr + offs, tl.reshape(run, [run.shape[0], run.shape[1], 8]), mask=mask[:, :, None])
        else:
            for k in tl.static_range(len(ws) // 4):
                quad = tl.join(tl.join(ws[4 * k], ws[4 * k + 2]), tl.join(ws[4 * k + 1], ws[4 * k + 3]))
                offs = _aligned_run(word + 4 * k, 4)
                tl.store(ptr + offs, tl.reshape(quad, [quad.shape[0], quad.shape[1], 4]), mask=mask[:, :, None])
    else:
        for j in tl.static_range(len(ws)):
            tl.store(ptr + word + j, ws[j], mask=mask)


@triton.jit
def _block_index(rows64, blks, NBLK, TILE16: tl.constexpr):
    """Flat (row, block) index of the one-byte outputs. In the 16x16 (blocks, rows) layout it is declared
    non-contiguous, so Triton stores it in the kernel's layout rather than moving it through shared memory."""
    index = rows64 * NBLK + blks
    return tl.max_contiguous(index, [1, 1]) if TILE16 else index


@triton.jit
def _word_to_f32(w, KIND: tl.constexpr, HIGH: tl.constexpr):
    """FP32 of an fp32 word (KIND 0), or of the low / HIGH half of a bf16 (1) or fp16 (2) word; exact."""
    if KIND == 0:
        return w.to(tl.float32, bitcast=True)
    if KIND == 1:
        return (w & -65536).to(tl.float32, bitcast=True) if HIGH else (w << 16).to(tl.float32, bitcast=True)
    return ((w >> 16) if HIGH else w).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _block_magnitudes(ws, KIND: tl.constexpr):
    """|x| of the 16 elements of each block as a tuple of FP32 (BR, NB) tensors, from its words (16-bit inputs:
    element 2j in the low half of word j). The fast path works on magnitudes (|x * inv| = |x| * inv, one abs
    per element for both candidates) and takes the signs from the words (_with_signs)."""
    xs = ()
    for j in tl.static_range(len(ws)):
        if KIND == 0:
            xs = xs + (tl.abs(_word_to_f32(ws[j], KIND, False)), )
        else:
            xs = xs + (tl.abs(_word_to_f32(ws[j], KIND, False)), tl.abs(_word_to_f32(ws[j], KIND, True)))
    return xs


@triton.jit
def _sign_bit(ws, i: tl.constexpr, KIND: tl.constexpr):
    """The IEEE sign of element i of each block, in bit 31 of an int32, read off its word."""
    if KIND == 0:
        return ws[i] & SIGN_BIT
    return (ws[i // 2] if i % 2 == 1 else ws[i // 2] << 16) & SIGN_BIT


@triton.jit
def _column_start(rows64, blks, stride, M):
    """Where the blocks of x^T start in a row-major x (M, K) of row stride `stride` elements: for output row k
    (x's column) and block b, element i is x[16b + i, k] at offset + i * stride, and exists for i < left (rows at
    or past M read as the zero rows that pad x to a multiple of 16). (offset, stride, left)."""
    return (blks.to(tl.int64) * 16) * stride + rows64, stride, M - blks * 16


@triton.jit
def _load_column_words(ptr, where, mask, KIND: tl.constexpr):
    """The words _load_words gives for a block of x^T, built from its 16 element loads down a column of x (ptr
    addresses elements: int16 for 16-bit input, int32 for fp32); each load is a contiguous run over a warp's
    consecutive columns. Missing rows (padding) load as +0."""
    start, stride, left = where
    es = ()
    for i in tl.static_range(16):
        es = es + (tl.load(ptr + start + i * stride, mask=mask & (i < left), other=0).to(tl.int32), )
    ws = es
    if KIND != 0:  # two 16-bit elements per word, element 2j in the low half
        ws = ()
        for j in tl.static_range(8):
            ws = ws + ((es[2 * j] & 0xFFFF) | (es[2 * j + 1] << 16), )
    return ws


@triton.jit
def _load_element(x_ptr, word, i, mask, KIND: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Element i (a runtime index) of each block as FP32, read from memory again (the exact path's input).
    TRANSPOSED: word is _column_start's (offset, stride, left) and x_ptr addresses elements."""
    if TRANSPOSED:
        start, stride, left = word
        w = tl.load(x_ptr + start + i * stride, mask=mask & (i < left), other=0).to(tl.int32)
        return _word_to_f32(w, KIND, False)
    else:  # a constexpr branch: a tuple word never reaches the row-major code
        if KIND == 0:
            return _word_to_f32(tl.load(x_ptr + word + i, mask=mask, other=0), KIND, False)
        w = tl.load(x_ptr + word + i // 2, mask=mask, other=0)
        return _word_to_f32(tl.where(i % 2 == 0, w, w >> 16), KIND, False)


@triton.jit
def _exact_candidate(x_ptr, word, mask, sf, inv, amax, six_b, KIND: tl.constexpr, ERRORS: tl.constexpr,
                     MSE: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """One candidate scale (spec steps 4-5) exactly as written, for every input including NaN and the edges of
    FP32's range: packed codes (with signs) as two int32 words and the block's error. A runtime loop that reads
    x again, so this rarely taken path adds few registers to the kernel (registers decide its occupancy)."""
    err = tl.zeros(inv.shape, tl.float32)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for i in tl.range(16, loop_unroll_factor=1):
        x = _load_element(x_ptr, word, i, mask, KIND, TRANSPOSED)
        code = e2m1_code(clamp_e2m1(x * inv))
        nibble = code << (4 * (i % 8))
        lo = tl.where(i < 8, lo | nibble, lo)
        hi = tl.where(i < 8, hi, hi | nibble)
        if ERRORS:
            d = _val_div_6b((e2m1_value(code) * sf) * amax, six_b) - x
            err = err + (d * d if MSE else tl.abs(d))
    return lo, hi, err


# The four-over-six fast path estimates each candidate's error cheaply and bounds the estimate's distance from
# the spec's exact error; only blocks whose choice the bounds cannot settle run the exact arithmetic.
#
# Setting: amax A = 0 or 2^-79 <= A <= 2^58 (one check per row), a block without NaN and bamax <= 2^56. A
# candidate's scale s is an E4M3 value, 0 or in [2^-9, 448], so with 6B in {1536, 2688} the step
# g = fl(fl(s * A) * fl(1/6B)) is 0 (s = 0 or A = 0: every val is then +-0) or in [2^-100, 2^56].
# Codes are exact: same inv, same q, and e2m1_magic is the spec's rounding; unclamped, because the fast path
# also asks fl(bamax * inv6) < 7, so every |q| < 7 for both candidates (inv4 <= inv6, rounding is monotone),
# where it rounds (6, 7) to 6 as the clamp would. Let u = 2^-24, D_i = val_i - |x_i|
# (val_i the spec's value, |val_i - x_i| = |D_i| since val_i has x_i's sign), S = sum D_i^2, T = sum |D_i|.
# Every rounding below is off by at most u times its result or, in FP32's subnormal range, by 2^-150.
# (1) val_i = fl(fl(v_i s A) / 6B) (v_i s is exact) is V_i = v_i s A / 6B times two (1 +- u) factors and g v_i
#     is V_i times three, V_i <= 6 s A / 6B <= 6 g / (1 - u)^3, all normal: |val_i - v_i g| <= eta = 30.01 u g.
# (2) The estimate: d~_i = fma(v_i, g, -|x_i|) = P_i (1 + b_i), P_i = D_i + e_i, |e_i| <= eta, |b_i| <= u
#     (the code takes fma(magic - y, g, |x_i|) = -d~_i: magic - y = -v_i exactly and rounding is symmetric),
#     summed with fma (mse: e~ = sum d~_i^2, two roundings in each square, up to 16 in the sum) or add (mae:
#     e~ = sum |d~_i|): e~ = sum P_i^2 times 1 +- 18.001u, or sum |P_i| times 1 +- 17.001u.
# (3) The exact error: err = S times 1 +- 18.001u (rounded difference, square, 15 rounded adds), or T times
#     1 +- 16.001u.
# (4) mse: sum P_i^2 = S + 2 sum D_i e_i + sum e_i^2 with |2 sum D_i e_i| <= 2 eta T <= 8 eta sqrt(S)
#     (Cauchy-Schwarz over 16 terms) <= t S + 16 eta^2 / t for any t > 0 (2ab <= a^2 + b^2), and
#     sum e_i^2 <= 16 eta^2. With t = 2^-16, 16 eta^2 (1 + 1/t) < 2^-18 g^2, so sum P_i^2 lies in
#     [S (1 - t) - 2^-18 g^2, S (1 + t) + 2^-18 g^2], and with (2), (3): err <= e~ (1 + t + 37u) + 2^-18 g^2,
#     err >= e~ (1 - t - 37u) - 2^-18 g^2. mae: ||P_i| - |D_i|| <= eta, so err lies in e~ (1 +- 34u) +- 16.01 eta,
#     and 16.01 eta < 2^-15 g.
# (5) _error_bounds rounds these out to e~ (1 +- R) +- c with R = 1.25 * 2^-16 (27u above t + 37u) and
#     c = 2^-17 g^2 (mse) or 2^-14 g (mae), twice the terms they cover: margins that also cover its own three
#     roundings. It widens by TAU = 2^-140 for the subnormal roundings (each <= 2^-150, at most ~60 of them,
#     at most doubled). Nothing overflows: |d_i| <= 7 * 2^56, a 16x16 tile's sum < 2^126.
# 16x16 tiles add the row bounds in the spec's tree, as the spec adds the row errors: 15 rounded adds, 4u deep.
# Every hi is positive, so that is 4u of their sum, inside SLACK = 2^-16. A lo can be negative, and then the
# sum's rounding is 4u of the sum of |lo|; every lo sits at least 20u |lo| below its row's error (the margin
# of (5); all of |lo| when lo < 0), which absorbs it. Candidates with the same scale have bitwise equal errors:
# a tie, map-to-6.
SLACK_UP = tl.constexpr(1.0 + 2.0 ** -16)
SLACK_DOWN = tl.constexpr(1.0 - 2.0 ** -16)
BOUND_UP = tl.constexpr(1.0 + 1.25 * 2.0 ** -16)
BOUND_DOWN = tl.constexpr(1.0 - 1.25 * 2.0 ** -16)
TAU = tl.constexpr(2.0 ** -140)
AMAX_MIN = tl.constexpr(2.0 ** -79)
AMAX_MAX = tl.constexpr(2.0 ** 58)
BAMAX_MAX = tl.constexpr(2.0 ** 56)


@triton.jit
def _value_step(sf, amax, R6B: tl.constexpr):
    """g = fl(fl(sf * amax) * fl(1/6B)): the value of E2M1 magnitude 1 under scale sf, within 3 roundings."""
    return (sf * amax) * R6B


@triton.jit
def _amax_in_fast_range(amax):
    """The per-row part of the fast path's setting (comment above); NaN is outside."""
    return (amax == 0.0) | ((amax >= AMAX_MIN) & (amax <= AMAX_MAX))


@triton.jit
def _round_e2m1(ax, inv, CLAMP: tl.constexpr):
    """(y, magic) with y = a + magic, a = min(|x| * inv, 6) for a magnitude ax = |x|: the code magnitude is
    bits(y) & 7, the value y - magic. On the fast path inv is in (0, FLT_MAX] and x is never NaN, so q = x * inv
    is never NaN, |q| = |x| * inv and sign(q) = sign(x): this is the spec's code of q up to its sign bit.
    Without CLAMP the caller has checked |x| * inv < 7 for the whole block, where e2m1_magic rounds (6, 7) to 6
    like the clamp: the same y for one instruction less per element and candidate."""
    a = ax * inv
    if CLAMP:
        a = tl.minimum(a, 6.0)
    magic = e2m1_magic(a)
    return a + magic, magic


@triton.jit
def _pack(ys):
    """The code magnitudes, the low 3 bits of each y = bits(a + magic) from _round_e2m1 (a tuple of 16 int32),
    as two packed words (elements 0-7 in lo, 8-15 in hi, element 2j in the low nibble). y's bits 3-22 are zero
    and its exponent bits leave the word when shifted by 16 or more, so each word adds the shifted y of its
    nibbles 4-7 and, apart, those of nibbles 0-3, whose exponents only touch bits 23-31, cut by one mask: one
    shift-add per element and one mask-or per word."""
    words = ()
    for w in tl.static_range(2):
        low = ys[8 * w]
        high = ys[8 * w + 4] << 16
        for k in tl.static_range(1, 4):
            low = low + (ys[8 * w + k] << (4 * k))
            high = high + (ys[8 * w + 4 + k] << (16 + 4 * k))
        words = words + ((low & 0xFFFF) | high, )
    return words[0], words[1]


@triton.jit
def _fast_candidate(xs, inv, g, PACK: tl.constexpr, ERRORS: tl.constexpr, MSE: tl.constexpr, CLAMP: tl.constexpr):
    """One candidate on the fast path, from the magnitudes xs: exact code magnitudes packed into two int32 words
    (if PACK; the signs come from _with_signs) and (if ERRORS) the error estimate e~ of the comment above."""
    err = tl.zeros(inv.shape, tl.float32)
    ys = ()
    for i in tl.static_range(16):
        y, magic = _round_e2m1(xs[i], inv, CLAMP)
        ys = ys + (y.to(tl.int32, bitcast=True), )
        if ERRORS:
            d = tl.fma(magic - y, g, xs[i])  # -(v g - |x|): no negated |x| to compute
            err = tl.fma(d, d, err) if MSE else err + tl.abs(d)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    if PACK:
        lo, hi = _pack(ys)
    return lo, hi, err


@triton.jit
def _error_bounds(e, g, MSE: tl.constexpr):
    """[lo, hi] enclosing the spec's exact error of a fast-path block from its estimate e (comment above)."""
    tau = tl.full(g.shape, TAU, tl.float32)  # a bare 2^-140 (an FP32 subnormal) would make Triton 3.6 work in FP64
    c = tl.fma(g, g * 7.62939453125e-06, tau) if MSE else tl.fma(g, 6.103515625e-05, tau)  # 2^-17 g^2, 2^-14 g
    return tl.fma(e, BOUND_DOWN, -c), tl.fma(e, BOUND_UP, c)


@triton.jit
def _fast_encode_decode(xs, ws, inv, sf, KIND: tl.constexpr, CLAMP: tl.constexpr = False):
    """The chosen candidate's code magnitudes (packed as in _fast_candidate) and its bf16 block-scaled decode
    as 8 int32 words (elements 2j, 2j+1 in word j), for the fast path's blocks (magnitudes xs, words ws).
    e2m1 value * sf has at most 6 significant bits and lies in bf16's range, so its FP32 bits are exactly the
    bf16 bits followed by zeros; the sign is x's (that of the code). CLAMP as in _round_e2m1 (NVFP4 has no
    |x| * inv < 7 check)."""
    ys = ()
    dec = ()
    low_half = tl.zeros(inv.shape, tl.int32)
    for i in tl.static_range(16):
        y, magic = _round_e2m1(xs[i], inv, CLAMP)
        ys = ys + (y.to(tl.int32, bitcast=True), )
        value = ((y - magic) * sf).to(tl.int32, bitcast=True) | _sign_bit(ws, i, KIND)
        if i % 2 == 0:
            low_half = (value >> 16) & 0xFFFF
        else:
            dec = dec + ((value & -65536) | low_half, )
    lo, hi = _pack(ys)
    return lo, hi, dec


@triton.jit
def _prmt(a, b, SELECT: tl.constexpr):
    """PTX prmt.b32: byte k of the result is byte SELECT[k] of the 8 bytes {b, a} (a holds bytes 0-3); a select
    nibble with bit 3 set gives 0xFF or 0x00 by the sign bit of that byte instead."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, " + SELECT + ";", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _word_signs(w0, w1, w2, w3):
    """Bit 3 of each nibble set to the sign of the element a 16-bit input holds there: the sign bits of the
    four words' halves (bytes 1 and 3) gathered by byte permutes into the packed codes' layout."""
    even_odd01 = _prmt(w0, w1, "0x7351")  # the sign bytes of elements 0, 2, 1, 3
    even_odd23 = _prmt(w2, w3, "0x7351")  # and of elements 4, 6, 5, 7
    even = _prmt(even_odd01, even_odd23, "0xDC98")  # byte j: 0xFF if element 2j is negative
    odd = _prmt(even_odd01, even_odd23, "0x7632")  # byte j: bit 7 is the sign of element 2j + 1
    return (even & 0x08080808) | (odd & -2139062144)  # 0x80808080


@triton.jit
def _with_signs(lo, hi, ws, KIND: tl.constexpr, PTX: tl.constexpr):
    """Packed code magnitudes with bit 3 of each code set to the IEEE sign of x (that of q, since inv > 0). On a
    GPU with 16-bit input, 12 byte-permute and mask instructions for the 16 signs instead of 32 shifts and ors."""
    if PTX and KIND != 0:
        return lo | _word_signs(ws[0], ws[1], ws[2], ws[3]), hi | _word_signs(ws[4], ws[5], ws[6], ws[7])
    for i in tl.static_range(16):
        sign = _sign_bit(ws, i, KIND).to(tl.uint32, bitcast=True) >> (28 - 4 * (i % 8))
        if i < 8:
            lo = lo | sign.to(tl.int32, bitcast=True)
        else:
            hi = hi | sign.to(tl.int32, bitcast=True)
    return lo, hi


@triton.jit
def _inverse_scale(sf, s_dec):
    """inv = min(1 / (sf * S_dec), FLT_MAX) of spec step 4."""
    return clamp_max(_div(1.0, sf * s_dec), FLT_MAX)


@triton.jit
def _newton_inverse_scale(sf, s_dec, neg_s_dec):
    """_inverse_scale without a division, for b = sf * S_dec = 0 or in [2^-100, 2^57] (the fast path's range):
    a Newton step from the hardware's approximate reciprocal lands within an ulp of 1 / b, and Markstein's
    correction with the exact residual 1 - b * y rounds it to fl(1 / b) (checked on every b in that range on the
    GPU). b = 0 turns into NaN, which the NaN-dropping clamp makes FLT_MAX, like min(1 / 0, FLT_MAX)."""
    y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [sf * s_dec], dtype=tl.float32,
                                  is_pure=True, pack=1)
    neg_b = sf * neg_s_dec  # -b, exactly: the residuals below need no negation
    y = tl.fma(y, tl.fma(neg_b, y, 1.0), y)
    y = tl.fma(y, tl.fma(neg_b, y, 1.0), y)
    return tl.minimum(y, FLT_MAX)


@triton.jit
def _candidate_scales(bamax, s_enc, s_dec, neg_s_dec, EXACT: tl.constexpr, PTX: tl.constexpr):
    """Spec step 3 for both candidates: (base6, base4, s6, s4, inv6, inv4), the E4M3 scales' inputs, their
    values and the inverse scales. EXACT divides with div_rn (any input). Otherwise bamax / 6 takes div6, equal
    wherever the scale can differ from 0 on the fast path (bamax <= 2^56, S_enc < 2^91), and with PTX (a
    GPU: the interpreter cannot run PTX) the inverse scales take _newton_inverse_scale."""
    base = (_div_by(bamax, 6.0) if EXACT else div6(bamax)) * s_enc
    base6 = clamp_max(base, 448.0)
    base4 = clamp_max(base * 1.5, 448.0)
    s6 = e4m3_round(base6)
    s4 = e4m3_round(base4)
    if PTX and not EXACT:
        return base6, base4, s6, s4, _newton_inverse_scale(s6, s_dec, neg_s_dec), _newton_inverse_scale(
            s4, s_dec, neg_s_dec)
    return base6, base4, s6, s4, _inverse_scale(s6, s_dec), _inverse_scale(s4, s_dec)


@triton.jit
def _decode_word(lo, hi, sf, j: tl.constexpr):
    """Word j of the bf16 decode: elements 2j, 2j+1 as e2m1_value * f32(sf), exact in bf16."""
    packed = lo if j < 4 else hi
    shift: tl.constexpr = 8 * (j % 4)
    a = (e2m1_value((packed >> shift) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    b = (e2m1_value((packed >> (shift + 4)) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    return (a & 0xFFFF) | (b << 16)


@triton.jit
def _prefers_map4(err4, err6, TILE16: tl.constexpr):
    """Spec step 7 from exact errors: strict err4 < err6 (ties and NaN keep map-to-6); a 16x16 tile compares its
    row errors' sums in the spec's tree order, and the choice holds for each of its rows."""
    if TILE16:
        return tl.broadcast_to(tree_sum16(err4) < tree_sum16(err6), err4.shape)
    return err4 < err6


@triton.jit
def _tile_max(bamax, TILE16: tl.constexpr):
    """Step 2's block amax as the scale sees it: a 16x16 tile shares its max over the tile's rows, one value per
    block column that broadcasts over them."""
    if TILE16:
        bamax = tl.reduce(bamax, 1, nan_max, keep_dims=True)
    return bamax


@triton.jit
def _store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, pick, dec,
                 WRITE_MAP4: tl.constexpr, TILE16: tl.constexpr, WRITE_DEC: tl.constexpr):
    """A chunk's outputs: scale bytes and packed codes; the map-to-4 flags (WRITE_MAP4) and the decode."""
    index = _block_index(rows64, blks, NBLK, TILE16)
    if WRITE_MAP4:
        tl.store(map4_ptr + index, pick.to(tl.uint8), mask=ok)
    if WRITE_DEC:  # whole sectors for 16x16 (0.237 -> 0.230 ms on an H200), not for 1x16 (0.176 -> 0.188 ms)
        _store_words(dec_ptr, rows64 * (NBLK * 8) + blks * 8, dec, ok, True, TILE16)
    tl.store(scales_ptr + index, sf.to(tl.uint8), mask=ok)
    _store_words(codes_ptr, rows64 * (NBLK * 2) + blks * 2, (lo, hi), ok, True)


@triton.jit
def _four_six_exact(x_ptr, word, ok, amax, s_enc, s_dec, six_b, KIND: tl.constexpr, MSE: tl.constexpr,
                    TILE16: tl.constexpr, WRITE_DEC: tl.constexpr, TRANSPOSED: tl.constexpr = False,
                    MAP6_ONLY: tl.constexpr = False):
    """Steps 2-7 exactly as written, for any input, reading the chunk's x again: (map-to-4 choice, scale byte,
    packed signed codes, decode words)."""
    bamax = tl.abs(_load_element(x_ptr, word, 0, ok, KIND, TRANSPOSED))
    for i in tl.range(1, 16, loop_unroll_factor=1):
        bamax = nan_max(bamax, tl.abs(_load_element(x_ptr, word, i, ok, KIND, TRANSPOSED)))
    bamax = tl.broadcast_to(_tile_max(bamax, TILE16), bamax.shape)  # the exact candidates work per block
    base6, base4, s6, s4, inv6, inv4 = _candidate_scales(bamax, s_enc, s_dec, s_dec, True, False)
    lo6, hi6, err6 = _exact_candidate(x_ptr, word, ok, s6, inv6, amax, six_b, KIND, True, MSE, TRANSPOSED)
    lo4, hi4, err4 = _exact_candidate(x_ptr, word, ok, s4, inv4, amax, six_b, KIND, True, MSE, TRANSPOSED)
    pick = _prefers_map4(err4, err6, TILE16)
    if MAP6_ONLY:  # an operand outside the recipe's scope keeps map-to-6
        pick = tl.zeros(pick.shape, tl.int1)
    lo = tl.where(pick, lo4, lo6)
    hi = tl.where(pick, hi4, hi6)
    dec = ()
    if WRITE_DEC:
        for j in tl.static_range(8):
            dec = dec + (_decode_word(lo, hi, tl.where(pick, s4, s6), j), )
    return pick, e4m3_bits(tl.where(pick, base4, base6)), lo, hi, dec


@triton.jit
def _assert_amax_covers(bamax, amax, ok):
    """The public quantizers' amax check (numerics.validation.check_amax_covers) on the blocks at `ok`: amax >= 0
    and block max <= amax, NaN on either side passing. Device asserts: a failure traps the kernel and surfaces
    at the next synchronization as "device-side assert triggered", as torch._assert_async does."""
    amax = tl.broadcast_to(amax, ok.shape)  # a tensor even from a scalar amax, as for row_fast
    tl.device_assert(~ok | ~(amax < 0.0), _NEGATIVE_AMAX)
    tl.device_assert(~ok | ~(bamax > amax), _SMALL_AMAX)


@triton.jit
def _stochastic_e2m1(a, r):
    """The code magnitude of a = min(|q|, 6) (or NaN: then any) rounded stochastically by the 16 random bits r
    (int32 in [0, 2^16)), docs/numerics.md section 12: between neighbouring magnitudes lo <= a < hi, up exactly
    when r < t = (a - lo) * (2^16 / (hi - lo)), exact in FP32 (a - lo by Sterbenz's lemma, the factor a power of
    two); for an integer r that is r < ceil(t), compared in int32 (ceil(t) <= 2^16)."""
    idx = ((a >= 0.5).to(tl.int32) + (a >= 1.0).to(tl.int32) + (a >= 1.5).to(tl.int32) + (a >= 2.0).to(tl.int32)
           + (a >= 3.0).to(tl.int32) + (a >= 4.0).to(tl.int32) + (a >= 6.0).to(tl.int32))
    factor = tl.where(a < 2.0, 131072.0, tl.where(a < 4.0, 65536.0, 32768.0))
    t = (a - e2m1_value(idx)) * factor
    t = tl.where(a == a, t, 0.0)
    up = r < tl.math.ceil(t).to(tl.int32)
    return idx + up.to(tl.int32)


@triton.jit
def _stochastic_codes(xs, ws, inv, seed, first, KIND: tl.constexpr):
    """Packed signed codes (two int32 words) of a block rounded stochastically: element i has magnitude
    min(xs[i] * inv, 6) (|q| of spec step 4; NaN stays NaN), the sign of x, read off its word (that of q:
    inv > 0), and NaN gets NAN_CODE. first (int64) is the block's first element index, a multiple of 16: the
    random bits of element i = 8j + 2w + h are half h (0: the low 16 bits) of word w of
    tl.randint4x(seed, first // 8 + j), two Philox evaluations per block."""
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for j in tl.static_range(2):
        words = tl.randint4x(seed, first // 8 + j)
        for k in tl.static_range(8):
            r = ((words[k // 2] >> (16 * (k % 2))) & 0xFFFF).to(tl.int32)
            a = clamp_max(xs[8 * j + k] * inv, 6.0)
            mag = _stochastic_e2m1(a, r)
            sign = (_sign_bit(ws, 8 * j + k, KIND).to(tl.uint32, bitcast=True) >> 28).to(tl.int32, bitcast=True)
            code = tl.where(a == a, mag | sign, NAN_CODE)
            if j == 0:
                lo = lo | (code << (4 * k))
            else:
                hi = hi | (code << (4 * k))
    return lo, hi


@triton.jit
def _bit_or(a, b):
    """Combine function of a bitwise-or reduction."""
    return a | b


@triton.jit(do_not_specialize=["R", "NBLK", "row_words", "amax_div", "n_groups", "CHUNKS", "M", "seed"])
def _quantize_kernel(x_ptr, amax_ptr, group_ptr, codes_ptr, scales_ptr, map4_ptr, dec_ptr, R, NBLK, row_words,
                     amax_div, n_groups, CHUNKS, M, seed, KIND: tl.constexpr, FOUR_SIX: tl.constexpr,
                     TILE16: tl.constexpr, MSE: tl.constexpr, SIX_B: tl.constexpr, R6B: tl.constexpr,
                     WRITE_DEC: tl.constexpr, VEC: tl.constexpr, PTX: tl.constexpr, SCALAR_AMAX: tl.constexpr,
                     BR: tl.constexpr, NB: tl.constexpr, TRANSPOSED: tl.constexpr = False, MAP6_ONLY: tl.constexpr = False,
                     CHECK_AMAX: tl.constexpr = False, GROUPS: tl.constexpr = False, BY_GROUP: tl.constexpr = False,
                     MAP4: tl.constexpr = 1, STOCHASTIC: tl.constexpr = False):
    """A program quantizes BR rows x CHUNKS chunks of NB blocks (one block per thread), so the per-row work
    (amax, global scales) and the program's launch are shared by CHUNKS blocks per thread.

    Four-over-six writes every chunk from the fast path and notes (one bit per chunk) those whose choice it
    cannot settle or that lie outside its setting; after the chunk loop those are recomputed exactly as the spec
    writes them and written again. Keeping the exact arithmetic out of the loop keeps the loop's registers (and
    so the kernel's occupancy) and its code those of the fast path alone: 0.167 against 0.175 ms for a branch
    to it inside the loop (H200, 16384x7168, 1x16, same bounds).

    The integer arguments are not specialized on their values (Triton would otherwise compile a variant per
    divisibility pattern of the shape), and each row's amax is read by load_row_amax (per tensor, per row, per
    run of rows such as an expert's, or per token group with GROUPS / BY_GROUP), so one compiled kernel serves
    every shape and the per-tensor and per-row modes; except 16x16 with one amax per tensor, which reads it as a
    scalar (SCALAR_AMAX): a tile column's scales are then computed once per thread, not once for each row it
    holds (0.168 -> 0.151 ms on an H200; 1x16 gains nothing from it and measured 2% slower). SIX_B = 6B stays
    a constant: the divisions by it then share one reciprocal seed.

    TRANSPOSED (1x16 and NVFP4) quantizes x^T of a row-major x (M, K) in place: output row k is x's column k,
    its block b x[16b:16b+16, k] (rows from M on read as zeros), x_ptr addresses elements, row_words is x's row
    stride in elements; only the loads differ (_load_column_words builds the same words), the rest is shared.

    The launcher passes x, codes, map4 and the decode in their own dtypes (a host-side dtype view costs ~1 us
    each); the kernel reads x as int32 words (int16 elements when TRANSPOSED reads a 16-bit x) and writes codes
    and the decode as int32 words, scales and map4 as bytes.

    CHECK_AMAX (launched with CHECK_OPTIONS) asserts the public quantizers' amax check in the same read of x,
    instead of a second kernel that reads x again.

    MAP4 (four-over-six): 1 writes the map-to-4 flags to map4_ptr (bytes), 2 instead adds (map-to-4 blocks,
    blocks) of the rows that are data to a row of the numerics.formats.map4_count_buffer at map4_ptr (one atomic add
    each per program, the programs spread over the buffer's rows: the statistics without a mask or a reduction
    launch), 0 does neither.

    STOCHASTIC (NVFP4 only) rounds the codes stochastically with 16 random bits per element, from
    tl.randint4x(seed, element index in the quantized matrix // 8) (docs/numerics.md section 12: one Philox
    evaluation per 8 elements); seed is unused otherwise. Its scales are the nearest mode's."""
    if TRANSPOSED and KIND != 0:
        x_ptr = x_ptr.to(tl.pointer_type(tl.int16))
    else:
        x_ptr = x_ptr.to(tl.pointer_type(tl.int32))
    codes_ptr = codes_ptr.to(tl.pointer_type(tl.int32))
    map4_ptr = map4_ptr.to(tl.pointer_type(tl.uint8))
    dec_ptr = dec_ptr.to(tl.pointer_type(tl.int32))
    six_b = SIX_B
    if TILE16:  # (blocks, rows): the tile reductions run along axis 1
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[None, :]
        lanes = tl.arange(0, NB)[:, None]
    else:  # (rows, blocks): a warp reads one long run of a row
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[:, None]
        lanes = tl.arange(0, NB)[None, :]
    rows64 = rows.to(tl.int64)

    # Step 1: global encode / decode scales, per tensor or per row; they broadcast over blocks.
    if SCALAR_AMAX:
        amax = tl.load(amax_ptr)
        data = rows < R
    else:
        amax, data = load_row_amax(amax_ptr, group_ptr, rows, R, amax_div, n_groups, GROUPS, BY_GROUP)
    s_enc = clamp_max(tl.math.div_rn(tl.zeros_like(amax) + six_b, amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = _div(1.0, s_enc)
    neg_s_dec = (s_dec.to(tl.int32, bitcast=True) ^ SIGN_BIT).to(tl.float32, bitcast=True)
    # A tensor even from a scalar amax: Triton's interpreter cannot combine a scalar bool with a tensor.
    row_fast = _amax_in_fast_range(tl.broadcast_to(amax, rows.shape))

    WORDS: tl.constexpr = 16 if KIND == 0 else 8
    first = tl.program_id(1) * CHUNKS * NB + lanes
    # Per thread, bit c: a block of chunk c needs the exact arithmetic. Kept per thread and or-reduced once after
    # the loop: a reduction per chunk costs a shared-memory round trip and two barriers in 2-warp programs.
    deferred = tl.zeros(rows.shape, tl.int32) + tl.zeros(lanes.shape, tl.int32)
    if MAP4 == 2:  # per thread: map-to-4 blocks and blocks counted, and bit c: chunk c's fast path chose map-to-4
        hits = deferred
        blocks = deferred
        picked = deferred
    if TRANSPOSED:
        ws_next = _load_column_words(x_ptr, _column_start(rows64, first, row_words, M), (rows < R) & (first < NBLK),
                                     KIND)
    else:
        ws_next = _load_words(x_ptr, rows64 * row_words + first * WORDS, (rows < R) & (first < NBLK), WORDS, VEC)
    for chunk in tl.range(CHUNKS):
        blks = first + chunk * NB
        ok = (rows < R) & (blks < NBLK)
        if TRANSPOSED:
            word = _column_start(rows64, blks, row_words, M)
        else:
            word = rows64 * row_words + blks * WORDS
        # Read the next chunk before working on this one: its load latency hides behind this chunk's arithmetic.
        ws = ws_next
        nxt = blks + NB
        if TRANSPOSED:
            ws_next = _load_column_words(x_ptr, _column_start(rows64, nxt, row_words, M),
                                         (rows < R) & (nxt < NBLK) & (nxt < first + CHUNKS * NB), KIND)
        else:
            ws_next = _load_words(x_ptr, word + NB * WORDS, (rows < R) & (nxt < NBLK) & (nxt < first + CHUNKS * NB),
                                  WORDS, VEC)
        xs = _block_magnitudes(ws, KIND)
        # Step 2: block amax (NaN propagates).
        bamax = xs[0]
        for i in tl.static_range(1, 16):
            bamax = nan_max(bamax, xs[i])
        if CHECK_AMAX:
            _assert_amax_covers(bamax, amax, ok)
        bamax = _tile_max(bamax, TILE16)

        if FOUR_SIX:
            # Steps 3-7: both candidates; strict err4 < err6 picks map-to-4 (ties and NaN keep map-to-6), settled
            # by the error bounds where they separate (the comment above _value_step). With the decode, the fast
            # path encodes the codes once, for the winner, together with its decode.
            base6, base4, s6, s4, inv6, inv4 = _candidate_scales(bamax, s_enc, s_dec, neg_s_dec, False, PTX)
            # The setting (not NaN either), and |x| * inv < 7 so the rounding needs no clamp (_round_e2m1): a
            # normal E4M3 scale keeps it below 6.4; subnormal ones (bamax / amax below ~2^-15) are deferred.
            # s4 >= s6 (rounding is monotone), so inv4 <= inv6 and checking map-to-6 covers map-to-4.
            fast = row_fast & (bamax <= BAMAX_MAX) & (bamax * inv6 < 7.0)
            g6 = _value_step(s6, amax, R6B)
            g4 = _value_step(s4, amax, R6B)
            lo6, hi6, e6 = _fast_candidate(xs, inv6, g6, not WRITE_DEC, True, MSE, False)
            lo4, hi4, e4 = _fast_candidate(xs, inv4, g4, not WRITE_DEC, True, MSE, False)
            low6, high6 = _error_bounds(e6, g6, MSE)
            low4, high4 = _error_bounds(e4, g4, MSE)
            if TILE16:
                low6, high6 = tree_sum16(low6) * SLACK_DOWN, tree_sum16(high6) * SLACK_UP
                low4, high4 = tree_sum16(low4) * SLACK_DOWN, tree_sum16(high4) * SLACK_UP
            pick = tl.broadcast_to(high4 < low6, ok.shape)
            settled = pick | (low4 >= high6) | (s4 == s6)  # the same scale gives bitwise equal errors
            if MAP6_ONLY:  # no choice to settle: map-to-6 everywhere (only the fast setting defers)
                pick = tl.zeros(ok.shape, tl.int1)
                settled = pick == pick
            deferred = deferred | (tl.where(fast & settled, 0, 1) << chunk)
            if MAP4 == 2:
                counted = ok & data
                hits += tl.where(counted & pick, 1, 0)
                blocks += tl.where(counted, 1, 0)
                picked = picked | (tl.where(counted & pick, 1, 0) << chunk)
            sf = e4m3_byte(tl.where(pick, s4, s6))
            dec = ()
            if WRITE_DEC:
                lo, hi, dec = _fast_encode_decode(xs, ws, tl.where(pick, inv4, inv6), tl.where(pick, s4, s6), KIND)
            else:
                lo, hi = tl.where(pick, lo4, lo6), tl.where(pick, hi4, hi6)
            lo, hi = _with_signs(lo, hi, ws, KIND, PTX)
            _store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, pick, dec,
                         MAP4 == 1, TILE16, WRITE_DEC)
        else:
            # Standard NVFP4: sf = e4m3(min(bamax * (S_enc * fl(1/6)), FLT_MAX)), one candidate, no error. Its
            # fast path only needs an input without NaN and a finite, non-negative amax.
            mult = s_enc * _div(1.0, tl.full(s_enc.shape, 6.0, tl.float32))
            scaled = clamp_max(clamp_max(bamax * mult, FLT_MAX), 448.0)
            s = e4m3_round(scaled)
            inv = _inverse_scale(s, s_dec)
            # With the decode (WRITE_DEC): e2m1 value * the stored scale's value (NaN for a NaN scale).
            if STOCHASTIC:  # elementwise from the magnitudes, any input: no fast path to leave
                sf = e4m3_bits(scaled)
                lo, hi = _stochastic_codes(xs, ws, inv, seed, rows64 * (NBLK * 16) + blks * 16, KIND)
                dec = ()
                if WRITE_DEC:
                    for j in tl.static_range(8):
                        dec = dec + (_decode_word(lo, hi, e4m3_value(sf), j), )
            elif tl.max(tl.where((amax >= 0.0) & (amax <= FLT_MAX) & (bamax == bamax), 0, 1)) != 0:
                lo, hi, unused = _exact_candidate(x_ptr, word, ok, s, inv, amax, six_b, KIND, False, MSE, TRANSPOSED)
                sf = e4m3_bits(scaled)
                dec = ()
                if WRITE_DEC:
                    for j in tl.static_range(8):
                        dec = dec + (_decode_word(lo, hi, e4m3_value(sf), j), )
            else:
                if WRITE_DEC:
                    lo, hi, dec = _fast_encode_decode(xs, ws, inv, s, KIND, True)
                else:
                    lo, hi, unused = _fast_candidate(xs, inv, s, True, False, MSE, True)
                    dec = ()
                lo, hi = _with_signs(lo, hi, ws, KIND, PTX)
                sf = e4m3_byte(s)
            _store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, sf, dec,
                         False, TILE16, WRITE_DEC)

    if FOUR_SIX:
        deferred = tl.reduce(deferred, None, _bit_or)
        if deferred != 0:  # the same threads rewrite the same blocks: no other thread touches them
            for chunk in tl.range(CHUNKS):
                if ((deferred >> chunk) & 1) != 0:
                    blks = first + chunk * NB
                    ok = (rows < R) & (blks < NBLK)
                    if TRANSPOSED:
                        where = _column_start(rows64, blks, row_words, M)
                    else:
                        where = rows64 * row_words + blks * WORDS
                    pick, sf, lo, hi, dec = _four_six_exact(x_ptr, where, ok, amax, s_enc, s_dec, six_b, KIND, MSE,
                                                            TILE16, WRITE_DEC, TRANSPOSED, MAP6_ONLY)
                    _store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi,
                                 pick, dec, MAP4 == 1, TILE16, WRITE_DEC)
                    if MAP4 == 2:  # the exact choice replaces the fast path's count for the chunk
                        hits += tl.where(ok & data & pick, 1, 0) - ((picked >> chunk) & 1)
        if MAP4 == 2:
            slot = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) % _COUNT_ROWS
            counts_ptr = map4_ptr.to(tl.pointer_type(tl.int64)) + slot * _COUNT_WIDTH
            tl.atomic_add(counts_ptr, tl.sum(hits.to(tl.int64)))
            tl.atomic_add(counts_ptr + 1, tl.sum(blocks.to(tl.int64)))


_QUANTIZE = FastLaunch(_quantize_kernel)


@functools.cache
def _chunks_per_program(chunk_cols: int, row_groups: int, most: int) -> int:
    """Chunks each program runs: the most, up to `most`, that split a row group's chunks evenly (no program
    runs past the row's end) and still leave MIN_PROGRAMS programs to fill the GPU; 1 if none does."""
    for chunks in range(most, 1, -1):
        if chunk_cols % chunks == 0 and row_groups * (chunk_cols // chunks) >= MIN_PROGRAMS:
            return chunks
    return 1


class SpecFlags(NamedTuple):
    """The quantize kernel's compile-time flags of an operand spec (numerics.spec.OperandSpec)."""
    four_six: bool
    tile16: bool
    mse: bool
    six_b: float
    r6b: float
    map6_only: bool
    launch: str
    stochastic: bool


@functools.cache
def spec_flags(spec) -> SpecFlags:
    """The one place the kernel's constexprs come from a spec (cached per spec: fl(1/6B) costs a tensor division)."""
    four_six = spec.candidates != "nvfp4"
    six_b = 6.0 * spec.scale_bound
    return SpecFlags(four_six, spec.block == "16x16", spec.err_mode == "mse", six_b, f32_reciprocal(six_b),
                     spec.candidates == "6", spec.block if four_six else "nvfp4", spec.rounding == "stochastic")


def _launch(x, amax, spec, decode: bool, transposed: bool = False, check_amax: bool = False, groups=None,
            map4=True, seed=None):
    """(codes, scales, map4 mask or None, decode or None) of the (rows, cols) matrix quantized by `spec`: x
    itself, or with `transposed` x^T of a row-major x (M, K) padded with zero rows to a multiple of 16 (rows = K,
    cols = ceil16(M)), read from x in place (1x16 specs only). check_amax: assert the public amax check on the
    device (not with `transposed`). amax and RowGroups `groups` as reference.amax_per_row reads them. map4
    (four-over-six): True returns the map-to-4 mask, False writes none, a formats.map4_count_buffer gets
    (map-to-4 blocks, blocks) of the data rows added (reference.map4_counts). seed: an int in [0, 2^63) for a
    spec with stochastic rounding (required there, ignored otherwise)."""
    flags = spec_flags(spec)
    if flags.stochastic and seed is None:
        raise ValueError("a spec with rounding='stochastic' needs a seed")
    if transposed:
        cols, rows = -(-x.shape[0] // 16) * 16, x.shape[1]
        row_words = x.stride(0)  # the kernel loads elements
        launch = COLUMN_LAUNCH
    else:
        rows, cols = x.shape
        row_words = x.stride(0) * x.element_size() // 4
        launch = LAUNCH[flags.launch, decode]
    nblk = cols // 16
    codes = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nblk, dtype=torch.uint8, device=x.device)
    if not flags.four_six or map4 is False:
        map4_mode, map4_out, mask = 0, scales, None
    elif map4 is True:
        mask = torch.empty(rows, nblk, dtype=torch.bool, device=x.device)
        map4_mode, map4_out = 1, mask
    else:
        map4_mode, map4_out, mask = 2, map4, None
    dec = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if decode else None
    row_groups, chunk_cols = cdiv(rows, launch.rows), cdiv(nblk, launch.blocks)
    chunks = _chunks_per_program(chunk_cols, row_groups, launch.most_chunks)
    if chunk_cols // chunks > MAX_GRID_Y:
        raise ValueError(f"x of shape {tuple(x.shape)} needs {chunk_cols // chunks} programs along its blocks; the "
                         f"kernel's grid takes at most {MAX_GRID_Y}: split x")
    if rows and nblk:
        layout = AmaxLayout.of(amax, rows, groups)
        _QUANTIZE((row_groups, chunk_cols // chunks), x, amax, layout.group_ptr, codes, scales, map4_out,
                  scales if dec is None else dec, rows, nblk, row_words, layout.amax_div, layout.n_groups, chunks,
                  x.shape[0], seed if flags.stochastic else 0, _INPUT_KIND[x.dtype], flags.four_six, flags.tile16,
                  flags.mse, flags.six_b, flags.r6b,
                  decode, not transposed and x.data_ptr() % 16 == 0 and row_words % 4 == 0, x.is_cuda,
                  flags.four_six and flags.tile16 and amax.dim() == 0, launch.rows, launch.blocks, transposed,
                  flags.map6_only, check_amax, layout.groups, layout.by_group, map4_mode, flags.stochastic,
                  num_warps=launch.warps,
                  maxnreg=launch.max_registers, **COMPILE_OPTIONS, **(CHECK_OPTIONS if check_amax else {}))
    return codes, scales.view(torch.float8_e4m3fn), mask, dec


def eligible(x: torch.Tensor) -> bool:
    """Inputs the kernels take (shape and dtype already validated): CUDA, rows contiguous and 4-byte aligned."""
    return (x.is_cuda and x.stride(1) == 1 and (x.stride(0) * x.element_size()) % 4 == 0
            and x.data_ptr() % 4 == 0)


def quantize(x, amax, spec, decode: bool = False, check_amax: bool = False, groups=None, map4=True, seed=None):
    """(codes, scales, map4 mask or None, bf16 block-scaled decode or None) of a validated x quantized by `spec`
    in one read of x; bitwise equal to the reference of the amax per row (reference.amax_per_row of amax and
    RowGroups `groups`). check_amax: the public amax check as device asserts, in the same read of x; map4 as
    _launch takes it; seed for a stochastic spec."""
    return _launch(x, amax, spec, decode, check_amax=check_amax, groups=groups, map4=map4, seed=seed)


def eligible_columnwise(x: torch.Tensor) -> bool:
    """Inputs the columnwise kernels take: CUDA, unit column stride (any row stride)."""
    return x.is_cuda and x.stride(1) == 1


def quantize_columnwise(x, amax, spec, decode: bool = False, map4=True, seed=None):
    """x^T of a row-major x (M, K) quantized by a 1x16 `spec` with a per-tensor amax, read in place: x^T padded
    with zero columns to ceil16(M), i.e. the quantization of the zero-padded x^T made contiguous, without
    materializing it. Arguments checked by the caller (the dispatch layer): amax FP32 of shape () on x's device,
    x eligible_columnwise. Returns (codes uint8 (K, ceil16(M) / 2), scales float8_e4m3fn (K, ceil16(M) / 16),
    map4 mask or None, bf16 decode (K, ceil16(M)) or None)."""
    return _launch(x, amax, spec, decode, transposed=True, map4=map4, seed=seed)
