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

from .bits import FLT_MAX, clamp_e2m1, clamp_max, e2m1_code, e2m1_value, e4m3_bits, e4m3_value, nan_max, tree_sum16

BLOCK_ROWS = 16
BLOCKS_PER_PROGRAM = 8  # one block per thread: 83 registers on sm_90; two blocks per thread needed 177
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
def _load_block(x_ptr, word, mask, KIND: tl.constexpr):
    """The 16 elements of each block as a tuple of FP32 (BR, NB) tensors, read as 32-bit words.

    KIND 0: fp32 (one element a word); 1: bf16, 2: fp16 (element 2j in the low half of word j).
    """
    xs = ()
    for j in tl.static_range(16 if KIND == 0 else 8):
        w = tl.load(x_ptr + word + j, mask=mask, other=0)
        if KIND == 0:
            xs = xs + (w.to(tl.float32, bitcast=True), )
        elif KIND == 1:
            xs = xs + ((w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True))
        else:
            lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            xs = xs + (lo, hi)
    return xs


@triton.jit
def _candidate(xs, sf_bits, s_dec, amax, six_b, ERRORS: tl.constexpr, MSE: tl.constexpr):
    """One candidate scale (spec steps 4-5): packed codes as two int32 words and the block's error."""
    sf = e4m3_value(sf_bits)
    inv = clamp_max(_div(1.0, sf * s_dec), FLT_MAX)
    err = tl.zeros(inv.shape, tl.float32)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for i in tl.static_range(16):
        code = e2m1_code(clamp_e2m1(xs[i] * inv))
        if i < 8:
            lo = lo | (code << (4 * i))
        else:
            hi = hi | (code << (4 * (i - 8)))
        if ERRORS:
            d = _val_div_6b((e2m1_value(code) * sf) * amax, six_b) - xs[i]
            err = err + (d * d if MSE else tl.abs(d))
    return lo, hi, err


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
                     SIX_B: tl.constexpr, WRITE_DEC: tl.constexpr, BR: tl.constexpr, NB: tl.constexpr):
    """The integer arguments are not specialized on their values (Triton would otherwise compile a variant per
    divisibility pattern of the shape), and amax_stride is 0 (per-tensor) or 1 (per-row), so one compiled
    kernel serves every shape and both amax modes. SIX_B = 6B stays a constant: the divisions by it then
    share one reciprocal seed."""
    six_b = SIX_B
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    blks = tl.program_id(1) * NB + tl.arange(0, NB)
    ok = (rows < R)[:, None] & (blks < NBLK)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    xs = _load_block(x_ptr, rows64 * row_words + blks[None, :] * (16 if KIND == 0 else 8), ok, KIND)

    # Step 1: global encode / decode scales, per tensor or per row, as (BR, 1) so they broadcast over blocks.
    amax = tl.load(amax_ptr + rows * amax_stride, mask=rows < R, other=1.0)[:, None]
    s_enc = clamp_max(tl.math.div_rn(tl.zeros_like(amax) + six_b, amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = _div(1.0, s_enc)

    # Step 2: block amax (NaN propagates); a 16x16 tile shares its max over the tile's rows.
    bamax = tl.abs(xs[0])
    for i in tl.static_range(1, 16):
        bamax = nan_max(bamax, tl.abs(xs[i]))
    if TILE16:
        tile = tl.reduce(tl.reshape(bamax, [BR // 16, 16, NB]), 1, nan_max)
        bamax = tl.reshape(tl.broadcast_to(tile[:, None, :], [BR // 16, 16, NB]), [BR, NB])

    if FOUR_SIX:
        # Steps 3-7: both candidates; strict err4 < err6 picks map-to-4 (ties and NaN keep map-to-6).
        base = _div_by(bamax, 6.0) * s_enc
        sf6 = e4m3_bits(clamp_max(base, 448.0))
        sf4 = e4m3_bits(clamp_max(base * 1.5, 448.0))
        lo6, hi6, err6 = _candidate(xs, sf6, s_dec, amax, six_b, True, MSE)
        lo4, hi4, err4 = _candidate(xs, sf4, s_dec, amax, six_b, True, MSE)
        if TILE16:
            e6 = tree_sum16(err6, BR // 16, NB)
            e4 = tree_sum16(err4, BR // 16, NB)
            pick = tl.reshape(tl.broadcast_to((e4 < e6)[:, None, :], [BR // 16, 16, NB]), [BR, NB])
        else:
            pick = err4 < err6
        sf = tl.where(pick, sf4, sf6)
        lo = tl.where(pick, lo4, lo6)
        hi = tl.where(pick, hi4, hi6)
        tl.store(map4_ptr + rows64 * NBLK + blks[None, :], pick.to(tl.uint8), mask=ok)
    else:
        # Standard NVFP4: sf = e4m3(min(bamax * (S_enc * fl(1/6)), FLT_MAX)), one candidate, no error.
        mult = s_enc * _div(1.0, tl.full([BR, 1], 6.0, tl.float32))
        sf = e4m3_bits(clamp_max(clamp_max(bamax * mult, FLT_MAX), 448.0))
        lo, hi, unused = _candidate(xs, sf, s_dec, amax, six_b, False, MSE)

    tl.store(scales_ptr + rows64 * NBLK + blks[None, :], sf.to(tl.uint8), mask=ok)
    code_word = rows64 * (NBLK * 2) + blks[None, :] * 2
    tl.store(codes_ptr + code_word, lo, mask=ok)
    tl.store(codes_ptr + code_word + 1, hi, mask=ok)
    if WRITE_DEC:
        sf_value = e4m3_value(sf)
        dec_word = rows64 * (NBLK * 8) + blks[None, :] * 8
        for j in tl.static_range(8):
            tl.store(dec_ptr + dec_word + j, _decode_word(lo, hi, sf_value, j), mask=ok)


def _launch(x, amax, *, four_six: bool, block: str, err_mode: str, scale_bound: int, decode: bool):
    rows, cols = x.shape
    nblk = cols // 16
    words = x.view(torch.int32)
    codes = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nblk, dtype=torch.uint8, device=x.device)
    map4 = torch.empty(rows, nblk, dtype=torch.bool, device=x.device) if four_six else None
    dec = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if decode else None
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(nblk, BLOCKS_PER_PROGRAM))
    if rows and nblk:
        _quantize_kernel[grid](words, amax, codes.view(torch.int32), scales,
                               scales if map4 is None else map4.view(torch.uint8),
                               scales if dec is None else dec.view(torch.int32), rows, nblk, words.stride(0),
                               amax.dim(), KIND=_INPUT_KIND[x.dtype], FOUR_SIX=four_six, TILE16=block == "16x16",
                               MSE=err_mode == "mse", SIX_B=6.0 * scale_bound, WRITE_DEC=decode, BR=BLOCK_ROWS, NB=BLOCKS_PER_PROGRAM, num_warps=NUM_WARPS,
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
