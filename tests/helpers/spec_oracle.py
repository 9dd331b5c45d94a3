"""An independent, scalar transcription of docs/numerics.md with numpy float32 arithmetic.

Deliberately written element by element (no torch, no vectorization) so that it shares no code and no
structure with titan_fp4six.numerics.reference; the tests compare the two byte for byte. Slow: use it on small
tensors only.
"""

import math

import numpy as np

F = np.float32
np.seterr(all="ignore")  # overflow to inf and NaN arithmetic are part of the spec
FLT_MAX = F(np.finfo(np.float32).max)
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def fmin(a, b):
    """min that propagates NaN from either side (as torch.clamp / minimum do)."""
    a, b = F(a), F(b)
    if math.isnan(a) or math.isnan(b):
        return F("nan")
    return a if a < b else b


def e4m3_bits(v) -> int:
    """FP32 -> E4M3 byte: saturate at 448, then round to nearest even (subnormal quantum 2^-9)."""
    v = fmin(v, F(448.0))
    if math.isnan(v):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, float(v)) < 0 else 0
    mag = abs(float(v))
    if mag == 0.0:
        return sign
    exp = max(math.floor(math.log2(mag)), -6)
    quantum = 2.0 ** (exp - 3)
    steps = round(mag / quantum)  # exact division by a power of two; round() is half-to-even
    value = steps * quantum
    if value == 0.0:
        return sign
    e = max(math.floor(math.log2(value)), -6)
    if value < 2.0 ** -6:  # subnormal: exponent field 0, mantissa = value / 2^-9
        return sign | int(value / 2.0 ** -9)
    mant = int(value / 2.0 ** (e - 3)) - 8
    return sign | ((e + 7) << 3) | mant


def e4m3_value(bits: int) -> F:
    sign = -1.0 if bits & 0x80 else 1.0
    e, m = (bits >> 3) & 0xF, bits & 0x7
    if e == 0xF and m == 0x7:
        return F("nan")
    if e == 0:
        return F(sign * m * 2.0 ** -9)
    return F(sign * (1 + m / 8) * 2.0 ** (e - 7))


def e2m1_code(q) -> int:
    """Round-to-nearest-even on the E2M1 grid with the spec's tie points; bit 3 is the IEEE sign of q."""
    q = F(q)
    if math.isnan(q):
        return 3  # the canonical NaN code (its block scale is NaN, so it decodes to NaN)
    sign = 8 if math.copysign(1.0, float(q)) < 0 else 0
    m = abs(float(q))
    bounds = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True)]
    for idx, (edge, inclusive) in enumerate(bounds):
        if m < edge or (inclusive and m == edge):
            return sign | idx
    return sign | 7


def e2m1_value(code: int) -> F:
    return F((-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7])


def encode_scale(amax, bound) -> F:
    s = F(F(bound * 6) / F(amax)) if F(amax) != 0 else F("inf")
    s = fmin(s, FLT_MAX)
    if F(amax) == 0 or s == 0:
        s = F(1.0)
    return s


def _block_error(xs, codes, sf, amax, bound, err_mode):
    err = F(0.0)
    for xi, c in zip(xs, codes):
        val = F(F(F(e2m1_value(c) * sf) * F(amax)) / F(6 * bound))
        d = F(val - xi)
        err = F(err + (abs(d) if err_mode == "mae" else F(d * d)))
    return err


def _candidate(xs, sf_bits, s_dec):
    sf = e4m3_value(sf_bits)
    prod = F(sf * s_dec)
    inv = fmin(F(F(1.0) / prod) if prod != 0 else F("inf"), FLT_MAX)
    return [e2m1_code(min(max(F(xi * inv), F(-6.0)), F(6.0)) if not math.isnan(F(xi * inv)) else F(xi * inv))
            for xi in xs]


def tree_sum(r):
    p = [F(r[a] + r[b]) for a, b in ((0, 8), (4, 12), (2, 10), (6, 14), (1, 9), (5, 13), (3, 11), (7, 15))]
    return F(F(F(p[0] + p[1]) + F(p[2] + p[3])) + F(F(p[4] + p[5]) + F(p[6] + p[7])))


def four_over_six(x, amax, block="1x16", err_mode="mse", bound=256, force=None):
    """x: 2-D numpy float32; amax: float or per-row list. Returns (codes (R,C) ints, scale bytes (R,C/16),
    map4 (R,C/16) bools, err4, err6). force='6' keeps map-to-6 everywhere (for comparisons)."""
    rows, cols = x.shape
    amaxes = [F(amax)] * rows if np.ndim(amax) == 0 else [F(a) for a in amax]
    nb = cols // 16
    codes = [[0] * cols for _ in range(rows)]
    scales = [[0] * nb for _ in range(rows)]
    map4 = [[False] * nb for _ in range(rows)]
    errs = {4: [[F(0)] * nb for _ in range(rows)], 6: [[F(0)] * nb for _ in range(rows)]}
    cands = {}
    for r in range(rows):
        s_enc = encode_scale(amaxes[r], bound)
        s_dec = F(F(1.0) / s_enc)
        for b in range(nb):
            if block == "1x16":
                tile = x[r, b * 16:(b + 1) * 16]
            else:
                t0 = (r // 16) * 16
                tile = x[t0:t0 + 16, b * 16:(b + 1) * 16].reshape(-1)
            bamax = F(0.0)
            for v in tile:
                bamax = F("nan") if (math.isnan(v) or math.isnan(bamax)) else max(bamax, F(abs(v)))
            base = F(F(bamax / F(6.0)) * s_enc)
            xs = [F(v) for v in x[r, b * 16:(b + 1) * 16]]
            for k, mult in ((6, F(1.0)), (4, F(1.5))):
                sf_bits = e4m3_bits(fmin(F(base * mult), F(448.0)))
                c = _candidate(xs, sf_bits, s_dec)
                cands[(r, b, k)] = (c, sf_bits)
                errs[k][r][b] = _block_error(xs, c, e4m3_value(sf_bits), amaxes[r], bound, err_mode)
    for r in range(rows):
        for b in range(nb):
            if block == "1x16":
                e4, e6 = errs[4][r][b], errs[6][r][b]
            else:
                t0 = (r // 16) * 16
                e4 = tree_sum([errs[4][t0 + i][b] for i in range(16)])
                e6 = tree_sum([errs[6][t0 + i][b] for i in range(16)])
            choose4 = force != "6" and bool(e4 < e6)
            c, sf_bits = cands[(r, b, 4 if choose4 else 6)]
            codes[r][b * 16:(b + 1) * 16] = c
            scales[r][b] = sf_bits
            map4[r][b] = choose4
    return np.array(codes), np.array(scales), np.array(map4), errs[4], errs[6]


def nvfp4(x, amax):
    """Standard NVFP4 (B=448, 1x16). Returns (codes (R,C), scale bytes (R,C/16))."""
    rows, cols = x.shape
    amaxes = [F(amax)] * rows if np.ndim(amax) == 0 else [F(a) for a in amax]
    codes = np.zeros((rows, cols), dtype=np.int64)
    scales = np.zeros((rows, cols // 16), dtype=np.int64)
    sixth = F(F(1.0) / F(6.0))
    for r in range(rows):
        s_enc = encode_scale(amaxes[r], 448)
        s_dec = F(F(1.0) / s_enc)
        mult = F(s_enc * sixth)
        for b in range(cols // 16):
            xs = [F(v) for v in x[r, b * 16:(b + 1) * 16]]
            bamax = F(0.0)
            for v in xs:
                bamax = F("nan") if (math.isnan(v) or math.isnan(bamax)) else max(bamax, F(abs(v)))
            sf_bits = e4m3_bits(fmin(fmin(F(bamax * mult), FLT_MAX), F(448.0)))
            scales[r, b] = sf_bits
            codes[r, b * 16:(b + 1) * 16] = _candidate(xs, sf_bits, s_dec)
    return codes, scales


def dequantize(codes, scale_bits, amax, bound):
    """value = e2m1_value(code) * ((f32(sf) * amax) * fl(1/(6B))), rescaled by 2^-64 / 2^64 where amax >= 2^119."""
    rows, cols = codes.shape
    amaxes = [F(amax)] * rows if np.ndim(amax) == 0 else [F(a) for a in amax]
    inv = F(F(1.0) / F(6 * bound))
    out = np.zeros((rows, cols), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            big = amaxes[r] >= F(2.0 ** 119)  # the spec's rescaled order where f32(sf) * amax may overflow
            down, up = (F(2.0 ** -64), F(2.0 ** 64)) if big else (F(1.0), F(1.0))
            scale = F(F(F(e4m3_value(int(scale_bits[r, c // 16])) * F(amaxes[r] * down)) * inv) * up)
            out[r, c] = F(e2m1_value(int(codes[r, c])) * scale)
    return out
