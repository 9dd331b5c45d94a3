"""The four-over-six choice between the map-to-4 and map-to-6 candidates (spec step 5): a cheap error estimate
with a proven bound (the comment above value_step), 16x16 tiles reduced in the spec's tree order, and the exact
path that redoes with the spec's arithmetic as written any block the bounds cannot settle."""

import triton
import triton.language as tl

from .bits import clamp_e2m1, e2m1_code, e2m1_value, e4m3_bits, nan_max, tree_sum16
from .encode import candidate_scales, decode_words, pack, round_e2m1, val_div_6b
from .operand_words import load_element


@triton.jit
def exact_candidate(x_ptr, word, mask, sf, inv, amax, six_b, KIND: tl.constexpr, ERRORS: tl.constexpr,
                     MSE: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """One candidate scale (spec steps 4-5) exactly as written, for every input including NaN and the edges of
    FP32's range: packed codes (with signs) as two int32 words and the block's error. A runtime loop that reads
    x again, so this rarely taken path adds few registers to the kernel (registers decide its occupancy)."""
    err = tl.zeros(inv.shape, tl.float32)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    for i in tl.range(16, loop_unroll_factor=1):
        x = load_element(x_ptr, word, i, mask, KIND, TRANSPOSED)
        code = e2m1_code(clamp_e2m1(x * inv))
        nibble = code << (4 * (i % 8))
        lo = tl.where(i < 8, lo | nibble, lo)
        hi = tl.where(i < 8, hi, hi | nibble)
        if ERRORS:
            d = val_div_6b((e2m1_value(code) * sf) * amax, six_b) - x
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
# (5) error_bounds rounds these out to e~ (1 +- R) +- c with R = 1.25 * 2^-16 (27u above t + 37u) and
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
def value_step(sf, amax, R6B: tl.constexpr):
    """g = fl(fl(sf * amax) * fl(1/6B)): the value of E2M1 magnitude 1 under scale sf, within 3 roundings."""
    return (sf * amax) * R6B


@triton.jit
def fast_setting(row_fast, bamax, inv6):
    """The fast path's setting per block: the row's (amax_in_fast_range), the block's (no NaN, bamax <= 2^56) and
    |x| * inv < 7 so the rounding needs no clamp (round_e2m1): a normal E4M3 scale keeps it below 6.4; subnormal
    ones (bamax / amax below ~2^-15) fall outside. s4 >= s6 (rounding is monotone), so inv4 <= inv6 and checking
    map-to-6 covers map-to-4."""
    return row_fast & (bamax <= BAMAX_MAX) & (bamax * inv6 < 7.0)


@triton.jit
def amax_in_fast_range(amax):
    """The per-row part of the fast path's setting (comment above); NaN is outside."""
    return (amax == 0.0) | ((amax >= AMAX_MIN) & (amax <= AMAX_MAX))


@triton.jit
def fast_candidate(xs, inv, g, PACK: tl.constexpr, ERRORS: tl.constexpr, MSE: tl.constexpr, CLAMP: tl.constexpr):
    """One candidate on the fast path, from the magnitudes xs: exact code magnitudes packed into two int32 words
    (if PACK; the signs come from with_signs) and (if ERRORS) the error estimate e~ of the comment above."""
    err = tl.zeros(inv.shape, tl.float32)
    ys = ()
    for i in tl.static_range(16):
        y, magic = round_e2m1(xs[i], inv, CLAMP)
        ys = ys + (y.to(tl.int32, bitcast=True), )
        if ERRORS:
            d = tl.fma(magic - y, g, xs[i])  # -(v g - |x|): no negated |x| to compute
            err = tl.fma(d, d, err) if MSE else err + tl.abs(d)
    lo = tl.zeros(inv.shape, tl.int32)
    hi = tl.zeros(inv.shape, tl.int32)
    if PACK:
        lo, hi = pack(ys)
    return lo, hi, err


# Blocks the bounds cannot settle are mostly exact ties, err4 == err6, which keep map-to-6. One kind needs no
# error at all: both candidates decode every element to the same value, v4_i * s4 == v6_i * s6 (products of at
# most 3 and 4 significant bits, exact in FP32), so the spec's val_i, its differences and its sums are bitwise
# the same for both. decode_tie checks the sufficient s4 == 1.5 s6 and v6_i == 1.5 v4_i (pairs of values (0, 0),
# (1, 1.5), (2, 3), (4, 6)). Blocks of few nonzero values often are such ties (a third of one-value blocks: a
# token block of a group's last token and padding), where the exact path would redo every chunk holding one.
# Such a block's fast-path codes (fast setting: exact codes) and scale are map-to-6's, which is what the fast
# path wrote for it (an unsettled block is never picked as map-to-4).


@triton.jit
def block_amax_again(x_ptr, word, ok, KIND: tl.constexpr, TILE16: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Step 2's block amax (a 16x16 tile's, broadcast over its rows) read again after the chunk loop, one element
    at a time in a runtime loop (few registers), for decode_tie and four_six_exact."""
    bamax = tl.abs(load_element(x_ptr, word, 0, ok, KIND, TRANSPOSED))
    for i in tl.range(1, 16, loop_unroll_factor=1):
        bamax = nan_max(bamax, tl.abs(load_element(x_ptr, word, i, ok, KIND, TRANSPOSED)))
    return tl.broadcast_to(tile_max(bamax, TILE16), bamax.shape)


@triton.jit
def decode_tie(x_ptr, word, ok, bamax, s_enc, s_dec, neg_s_dec, row_fast, KIND: tl.constexpr,
               TILE16: tl.constexpr, TRANSPOSED: tl.constexpr, PTX: tl.constexpr):
    """Whether a block (its block_amax_again bamax) is in the fast setting and both its candidates decode every
    element to the same value (the comment above): an exact error tie, settled as map-to-6. Recomputes the chunk
    loop's scales bit for bit and reads the block once more, one element at a time. A 16x16 tile ties when each
    of its rows does."""
    base6, base4, s6, s4, inv6, inv4 = candidate_scales(bamax, s_enc, s_dec, neg_s_dec, False, PTX)
    tie = fast_setting(row_fast, bamax, inv6) & (s4 == s6 * 1.5)
    for i in tl.range(16, loop_unroll_factor=1):
        magnitude = tl.abs(load_element(x_ptr, word, i, ok, KIND, TRANSPOSED))
        y4, magic4 = round_e2m1(magnitude, inv4, False)
        y6, magic6 = round_e2m1(magnitude, inv6, False)
        tie = tie & ((y4 - magic4) * 1.5 == y6 - magic6)
    if TILE16:
        tie = tl.broadcast_to(tl.min(tie.to(tl.int32), 1, keep_dims=True), tie.shape) != 0
    return tie


@triton.jit
def error_bounds(e, g, MSE: tl.constexpr):
    """[lo, hi] enclosing the spec's exact error of a fast-path block from its estimate e (comment above)."""
    tau = tl.full(g.shape, TAU, tl.float32)  # a bare 2^-140 (an FP32 subnormal) would make Triton 3.6 work in FP64
    c = tl.fma(g, g * 7.62939453125e-06, tau) if MSE else tl.fma(g, 6.103515625e-05, tau)  # 2^-17 g^2, 2^-14 g
    return tl.fma(e, BOUND_DOWN, -c), tl.fma(e, BOUND_UP, c)


@triton.jit
def prefers_map4(err4, err6, TILE16: tl.constexpr):
    """Spec step 7 from exact errors: strict err4 < err6 (ties and NaN keep map-to-6); a 16x16 tile compares its
    row errors' sums in the spec's tree order, and the choice holds for each of its rows."""
    if TILE16:
        return tl.broadcast_to(tree_sum16(err4) < tree_sum16(err6), err4.shape)
    return err4 < err6


@triton.jit
def tile_max(bamax, TILE16: tl.constexpr):
    """Step 2's block amax as the scale sees it: a 16x16 tile shares its max over the tile's rows, one value per
    block column that broadcasts over them."""
    if TILE16:
        bamax = tl.reduce(bamax, 1, nan_max, keep_dims=True)
    return bamax


@triton.jit
def four_six_exact(x_ptr, word, ok, bamax, amax, s_enc, s_dec, six_b, KIND: tl.constexpr, MSE: tl.constexpr,
                    TILE16: tl.constexpr, WRITE_DEC: tl.constexpr, TRANSPOSED: tl.constexpr = False,
                    MAP6_ONLY: tl.constexpr = False):
    """Steps 3-7 exactly as written, for any input, from the block_amax_again bamax, reading the chunk's x again:
    (map-to-4 choice, scale byte, packed signed codes, decode words)."""
    base6, base4, s6, s4, inv6, inv4 = candidate_scales(bamax, s_enc, s_dec, s_dec, True, False)
    lo6, hi6, err6 = exact_candidate(x_ptr, word, ok, s6, inv6, amax, six_b, KIND, True, MSE, TRANSPOSED)
    lo4, hi4, err4 = exact_candidate(x_ptr, word, ok, s4, inv4, amax, six_b, KIND, True, MSE, TRANSPOSED)
    pick = prefers_map4(err4, err6, TILE16)
    if MAP6_ONLY:  # an operand outside the recipe's scope keeps map-to-6
        pick = tl.zeros(pick.shape, tl.int1)
    lo = tl.where(pick, lo4, lo6)
    hi = tl.where(pick, hi4, hi6)
    dec = ()
    if WRITE_DEC:
        dec = decode_words(lo, hi, tl.where(pick, s4, s6))
    return pick, e4m3_bits(tl.where(pick, base4, base6)), lo, hi, dec
