"""Triton four-over-six and standard NVFP4 quantizers, bitwise equal to numerics/reference.py.

Each program quantizes BR rows x NB 1x16 blocks; every tensor in the kernel is one value per block (BR, NB),
and the 16 elements of a block are a tuple unrolled at compile time, so each thread owns whole blocks (no
cross-thread shuffles) and the error sum runs i = 0..15 in order by construction. Every rounding step is
the reference's: FP32 ops one at a time (launched with enable_fp_fusion=False, so a*b+c never becomes an
FMA), every division tl.math.div_rn (Triton's `/` is approximate), E4M3/E2M1 encodings in integer code
(bits.py), and 16x16 tiles add their row errors in the spec's tree. Launchers take validated arguments;
numerics.quantize dispatches here.
"""

import torch
import triton
import triton.language as tl

from .bits import (FLT_MAX, SIGN_BIT, clamp_e2m1, clamp_max, e2m1_code, e2m1_magic, e2m1_value, e4m3_bits, e4m3_value,
                   nan_max, tree_sum16)

# (rows, blocks) per program, one block per thread. 1x16: a warp covers 32 consecutive blocks of a row (1 KB
# of bf16 input, whole sectors of codes and scales). 16x16: a warp covers 2 tiles' 16 rows.
PROGRAM_SHAPE = {"1x16": (4, 32), "16x16": (16, 8)}
NUM_WARPS = 4
COMPILE_OPTIONS = {"enable_fp_fusion": False}  # the spec forbids contracting a*b + c into an FMA
_INPUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


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
def _store_words(ptr, word, ws, mask, VEC: tl.constexpr):
    """Store a tuple of 2 or 8 int32 (BR, NB) tensors at consecutive words from `word` (aligned to 8 or 16 bytes
    when VEC): one 8- or 16-byte store per thread and group instead of one per word."""
    if VEC:
        if len(ws) == 2:
            offs = _aligned_run(word, 2)
            tl.store(ptr + offs, tl.join(ws[0], ws[1]), mask=mask[:, :, None])
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
def _load_block(x_ptr, word, mask, KIND: tl.constexpr, VEC: tl.constexpr):
    """The 16 elements of each block as a tuple of FP32 (BR, NB) tensors (16-bit inputs: element 2j in the low
    half of word j)."""
    ws = _load_words(x_ptr, word, mask, 16 if KIND == 0 else 8, VEC)
    xs = ()
    for j in tl.static_range(len(ws)):
        if KIND == 0:
            xs = xs + (_word_to_f32(ws[j], KIND, False), )
        else:
            xs = xs + (_word_to_f32(ws[j], KIND, False), _word_to_f32(ws[j], KIND, True))
    return xs


@triton.jit
def _load_element(x_ptr, word, i, mask, KIND: tl.constexpr):
    """Element i (a runtime index) of each block as FP32, read from memory again (the exact path's input)."""
    if KIND == 0:
        return _word_to_f32(tl.load(x_ptr + word + i, mask=mask, other=0), KIND, False)
    w = tl.load(x_ptr + word + i // 2, mask=mask, other=0)
    return _word_to_f32(tl.where(i % 2 == 0, w, w >> 16), KIND, False)


@triton.jit
def _exact_candidate(x_ptr, word, mask, sf, inv, amax, six_b, KIND: tl.constexpr, ERRORS: tl.constexpr,
                     MSE: tl.constexpr):
    """One candidate scale (spec steps 4-5) exactly as written, for every input including NaN and the edges of
    FP32's range: packed codes (with signs) as two int32 words and the block's error. A runtime loop that reads
    x again, so this rarely taken path adds few registers to the kernel (registers decide its occupancy)."""
    err = tl.zeros(inv.shape, tl.float32)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for i in tl.range(16, loop_unroll_factor=1):
        x = _load_element(x_ptr, word, i, mask, KIND)
        code = e2m1_code(clamp_e2m1(x * inv))
        nibble = code << (4 * (i % 8))
        lo = tl.where(i < 8, lo | nibble, lo)
        hi = tl.where(i < 8, hi, hi | nibble)
        if ERRORS:
            d = _val_div_6b((e2m1_value(code) * sf) * amax, six_b) - x
            err = err + (d * d if MSE else tl.abs(d))
    return lo, hi, err


@triton.jit
def _in_fast_range(sf, amax):
    """Blocks whose candidate error _fast_candidate computes exactly (see there): a zero scale or amax, or
    2^-112 <= sf * amax and 1.5 * sf * amax <= 2^120. Every real tensor's blocks; the rest run exactly."""
    return (sf == 0.0) | (amax == 0.0) | ((sf * amax >= 1.925929944387236e-34) & ((sf * 1.5) * amax <= 1.329227995784916e36))


@triton.jit
def _fast_candidate(xs, inv, g1, g15, PACK: tl.constexpr, ERRORS: tl.constexpr, MSE: tl.constexpr):
    """Spec steps 4-5 in about a third of the instructions, bitwise equal to _exact_candidate on blocks with
    a finite amax >= 0, no NaN, and _in_fast_range (the kernel routes every other block to the exact one).

    Returns the code magnitudes packed into two int32 words (if PACK; signs are the inputs', added by the
    caller) and the block's error. Three exact shortcuts, each proven here:
    - inv is in (0, FLT_MAX] and x is never NaN, so q = x * inv is never NaN, sign(q) = sign(x), and the
      code of q is e2m1_magic's code of min(|q|, 6).
    - val = ((v * sf) * amax) / 6B with v = p * m (p in {1/2, 1, 2, 4}, m in {1, 1.5}): v * sf and m * sf
      are exact (at most 6 significant bits), and scaling by the power of two p commutes with FP32 rounding
      while no result leaves the normal range, so val = p * fl(fl(m * sf * amax) / 6B) = p * g_m. The range
      check guarantees that: m * sf * amax in [2^-112, 1.5 * 2^120] keeps every intermediate, times 1/2 to
      4 and divided by 6B <= 2688 < 2^12, inside [2^-125, 2^123]. A zero sf or amax makes g_m and every val 0.
    - val has the sign of x (or is zero), so |val - x| = |(|val| - |x|)| and the error terms are the same.
    """
    err = tl.zeros(inv.shape, tl.float32)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for i in tl.static_range(16):
        a = tl.minimum(tl.abs(xs[i] * inv), 6.0)
        magic = e2m1_magic(a)
        y = a + magic
        if PACK:
            mag = y.to(tl.int32, bitcast=True) & 7
            if i < 8:
                lo = lo | (mag << (4 * i))
            else:
                hi = hi | (mag << (4 * (i - 8)))
        if ERRORS:
            v = (y - magic).to(tl.int32, bitcast=True)
            p = (v & 0x7F800000).to(tl.float32, bitcast=True)
            d = p * tl.where((v & 0x400000) != 0, g15, g1) - tl.abs(xs[i])
            err = err + (d * d if MSE else tl.abs(d))
    return lo, hi, err


@triton.jit
def _fast_encode_decode(xs, inv, sf):
    """The chosen candidate's code magnitudes (packed as in _fast_candidate) and its bf16 block-scaled decode
    as 8 int32 words (elements 2j, 2j+1 in word j), for the fast path's blocks. e2m1 value * sf has at most 6
    significant bits and lies in bf16's range, so its FP32 bits are exactly the bf16 bits followed by zeros;
    the sign is x's (that of the code)."""
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    dec = ()
    low_half = tl.zeros(inv.shape, tl.int32)
    for i in tl.static_range(16):
        a = tl.minimum(tl.abs(xs[i] * inv), 6.0)
        magic = e2m1_magic(a)
        y = a + magic
        mag = y.to(tl.int32, bitcast=True) & 7
        if i < 8:
            lo = lo | (mag << (4 * i))
        else:
            hi = hi | (mag << (4 * (i - 8)))
        value = ((y - magic) * sf).to(tl.int32, bitcast=True) | (xs[i].to(tl.int32, bitcast=True) & SIGN_BIT)
        if i % 2 == 0:
            low_half = (value >> 16) & 0xFFFF
        else:
            dec = dec + ((value & -65536) | low_half, )
    return lo, hi, dec


@triton.jit
def _sign_nibbles(xs):
    """Bit 3 of each packed code: the IEEE sign of x (that of q, since inv > 0)."""
    lo = tl.zeros(xs[0].shape, tl.int32)
    hi = tl.zeros(xs[0].shape, tl.int32)
    for i in tl.static_range(16):
        sign = (xs[i].to(tl.int32, bitcast=True) & SIGN_BIT).to(tl.uint32, bitcast=True) >> (28 - 4 * (i % 8))
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
def _decode_word(lo, hi, sf, j: tl.constexpr):
    """Word j of the bf16 decode: elements 2j, 2j+1 as e2m1_value * f32(sf), exact in bf16."""
    packed = lo if j < 4 else hi
    shift: tl.constexpr = 8 * (j % 4)
    a = (e2m1_value((packed >> shift) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    b = (e2m1_value((packed >> (shift + 4)) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    return (a & 0xFFFF) | (b << 16)


@triton.jit(do_not_specialize=["R", "NBLK", "row_words", "amax_stride"])
def _quantize_kernel(x_ptr, amax_ptr, codes_ptr, scales_ptr, map4_ptr, dec_ptr, R, NBLK, row_words, amax_stride,
                     KIND: tl.constexpr, FOUR_SIX: tl.constexpr, TILE16: tl.constexpr, MSE: tl.constexpr,
                     SIX_B: tl.constexpr, WRITE_DEC: tl.constexpr, VEC: tl.constexpr, BR: tl.constexpr,
                     NB: tl.constexpr):
    """The integer arguments are not specialized on their values (Triton would otherwise compile a variant per
    divisibility pattern of the shape), and amax_stride is 0 (per-tensor) or 1 (per-row), so one compiled
    kernel serves every shape and both amax modes. SIX_B = 6B stays a constant: the divisions by it then
    share one reciprocal seed."""
    six_b = SIX_B
    if TILE16:  # (blocks, rows): a tile's 16 rows sit in one warp, so the tile reductions are warp shuffles
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[None, :]
        blks = (tl.program_id(1) * NB + tl.arange(0, NB))[:, None]
    else:  # (rows, blocks): a warp reads one long run of a row
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[:, None]
        blks = (tl.program_id(1) * NB + tl.arange(0, NB))[None, :]
    ok = (rows < R) & (blks < NBLK)
    rows64 = rows.to(tl.int64)
    word = rows64 * row_words + blks * (16 if KIND == 0 else 8)
    xs = _load_block(x_ptr, word, ok, KIND, VEC)

    # Step 1: global encode / decode scales, per tensor or per row; they broadcast over blocks.
    amax = tl.load(amax_ptr + rows * amax_stride, mask=rows < R, other=1.0)
    s_enc = clamp_max(tl.math.div_rn(tl.zeros_like(amax) + six_b, amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = _div(1.0, s_enc)

    # Step 2: block amax (NaN propagates); a 16x16 tile shares its max over the tile's rows.
    bamax = tl.abs(xs[0])
    for i in tl.static_range(1, 16):
        bamax = nan_max(bamax, tl.abs(xs[i]))
    if TILE16:
        bamax = tl.broadcast_to(tl.reduce(bamax, 1, nan_max, keep_dims=True), bamax.shape)

    # The fast path takes blocks with a finite amax >= 0 and no NaN; the exact one runs for a program only
    # if one of its blocks is outside (NaN data or amax, or scales at the edge of FP32's range).
    fast = (amax >= 0.0) & (amax <= FLT_MAX) & (bamax == bamax)
    if FOUR_SIX:
        # Steps 3-7: both candidates; strict err4 < err6 picks map-to-4 (ties and NaN keep map-to-6). With the
        # decode, the codes are encoded once, for the winner, together with its decode.
        base = _div_by(bamax, 6.0) * s_enc
        sf6 = e4m3_bits(clamp_max(base, 448.0))
        sf4 = e4m3_bits(clamp_max(base * 1.5, 448.0))
        s6 = e4m3_value(sf6)
        s4 = e4m3_value(sf4)
        inv6 = _inverse_scale(s6, s_dec)
        inv4 = _inverse_scale(s4, s_dec)
        fast = fast & _in_fast_range(s6, amax) & _in_fast_range(s4, amax)
        lo6, hi6, err6 = _fast_candidate(xs, inv6, _val_div_6b(s6 * amax, six_b),
                                         _val_div_6b((s6 * 1.5) * amax, six_b), not WRITE_DEC, True, MSE)
        lo4, hi4, err4 = _fast_candidate(xs, inv4, _val_div_6b(s4 * amax, six_b),
                                         _val_div_6b((s4 * 1.5) * amax, six_b), not WRITE_DEC, True, MSE)
        slow = tl.max(tl.where(fast, 0, 1)) != 0
        if slow:
            lo6e, hi6e, err6e = _exact_candidate(x_ptr, word, ok, s6, inv6, amax, six_b, KIND, True, MSE)
            lo4e, hi4e, err4e = _exact_candidate(x_ptr, word, ok, s4, inv4, amax, six_b, KIND, True, MSE)
            lo6, hi6, err6 = tl.where(fast, lo6, lo6e), tl.where(fast, hi6, hi6e), tl.where(fast, err6, err6e)
            lo4, hi4, err4 = tl.where(fast, lo4, lo4e), tl.where(fast, hi4, hi4e), tl.where(fast, err4, err4e)
        if TILE16:
            pick = tl.broadcast_to(tree_sum16(err4) < tree_sum16(err6), err4.shape)
        else:
            pick = err4 < err6
        sf = tl.where(pick, sf4, sf6)
        lo = tl.where(pick, lo4, lo6)  # with the decode: the exact blocks' codes (fast blocks get theirs below)
        hi = tl.where(pick, hi4, hi6)
        tl.store(map4_ptr + _block_index(rows64, blks, NBLK, TILE16), pick.to(tl.uint8), mask=ok)
        inv = tl.where(pick, inv4, inv6)
        s = tl.where(pick, s4, s6)
    else:
        # Standard NVFP4: sf = e4m3(min(bamax * (S_enc * fl(1/6)), FLT_MAX)), one candidate, no error.
        mult = s_enc * _div(1.0, tl.full(s_enc.shape, 6.0, tl.float32))
        sf = e4m3_bits(clamp_max(clamp_max(bamax * mult, FLT_MAX), 448.0))
        s = e4m3_value(sf)
        inv = _inverse_scale(s, s_dec)
        lo, hi, unused = _fast_candidate(xs, inv, s, s, True, False, MSE)
        slow = tl.max(tl.where(fast, 0, 1)) != 0
        if slow:
            lo_e, hi_e, unused = _exact_candidate(x_ptr, word, ok, s, inv, amax, six_b, KIND, False, MSE)
            lo, hi = tl.where(fast, lo, lo_e), tl.where(fast, hi, hi_e)

    sign_lo, sign_hi = _sign_nibbles(xs)
    if WRITE_DEC:
        lo_f, hi_f, dec = _fast_encode_decode(xs, inv, s)
        lo, hi = tl.where(fast, lo_f | sign_lo, lo), tl.where(fast, hi_f | sign_hi, hi)
        if slow:
            dec_exact = ()
            for j in tl.static_range(8):
                dec_exact = dec_exact + (tl.where(fast, dec[j], _decode_word(lo, hi, s, j)), )
            dec = dec_exact
        _store_words(dec_ptr, rows64 * (NBLK * 8) + blks * 8, dec, ok, True)
    else:
        lo, hi = tl.where(fast, lo | sign_lo, lo), tl.where(fast, hi | sign_hi, hi)
    tl.store(scales_ptr + _block_index(rows64, blks, NBLK, TILE16), sf.to(tl.uint8), mask=ok)
    _store_words(codes_ptr, rows64 * (NBLK * 2) + blks * 2, (lo, hi), ok, True)


def _launch(x, amax, *, four_six: bool, block: str, err_mode: str, scale_bound: int, decode: bool):
    rows, cols = x.shape
    nblk = cols // 16
    words = x.view(torch.int32)
    codes = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nblk, dtype=torch.uint8, device=x.device)
    map4 = torch.empty(rows, nblk, dtype=torch.bool, device=x.device) if four_six else None
    dec = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if decode else None
    program_rows, program_blocks = PROGRAM_SHAPE[block]
    grid = (triton.cdiv(rows, program_rows), triton.cdiv(nblk, program_blocks))
    if rows and nblk:
        _quantize_kernel[grid](words, amax, codes.view(torch.int32), scales,
                               scales if map4 is None else map4.view(torch.uint8),
                               scales if dec is None else dec.view(torch.int32), rows, nblk, words.stride(0),
                               amax.dim(), KIND=_INPUT_KIND[x.dtype], FOUR_SIX=four_six, TILE16=block == "16x16",
                               MSE=err_mode == "mse", SIX_B=6.0 * scale_bound, WRITE_DEC=decode,
                               VEC=x.data_ptr() % 16 == 0 and words.stride(0) % 4 == 0, BR=program_rows,
                               NB=program_blocks, num_warps=NUM_WARPS,
                               **COMPILE_OPTIONS)
    return codes, scales.view(torch.float8_e4m3fn), map4, dec


def eligible(x: torch.Tensor) -> bool:
    """Inputs the kernels take (shape and dtype already validated): CUDA, rows contiguous and 4-byte aligned."""
    return (x.is_cuda and x.stride(1) == 1 and (x.stride(0) * x.element_size()) % 4 == 0
            and x.data_ptr() % 4 == 0)


def four_over_six_quantize(x, amax, block: str, err_mode: str, scale_bound: int):
    """(codes, scales, map4) of a validated x; bitwise equal to reference.four_over_six_reference."""
    codes, scales, map4, _ = _launch(x, amax, four_six=True, block=block, err_mode=err_mode,
                                     scale_bound=scale_bound, decode=False)
    return codes, scales, map4


def four_over_six_quantize_decode(x, amax, block: str, err_mode: str, scale_bound: int):
    """(bf16 block-scaled decode, codes, scales, map4) from one read of x."""
    codes, scales, map4, dec = _launch(x, amax, four_six=True, block=block, err_mode=err_mode,
                                       scale_bound=scale_bound, decode=True)
    return dec, codes, scales, map4


def nvfp4_quantize(x, amax):
    """(codes, scales) of standard NVFP4 (B=448, 1x16); bitwise equal to reference.nvfp4_reference."""
    codes, scales, _, _ = _launch(x, amax, four_six=False, block="1x16", err_mode="mse", scale_bound=448,
                                  decode=False)
    return codes, scales
