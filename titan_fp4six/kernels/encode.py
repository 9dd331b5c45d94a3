"""The encode core every format shares: correctly rounded divisions, the candidate block scales and their
inverses (spec steps 2-3), E2M1 codes by one-add rounding (bits.e2m1_magic) packed eight to a word with the
input's sign bits set by bit operations (rounded to nearest, or stochastically from Philox bits), and the
block-scaled decode of packed codes."""

import struct

import triton
import triton.language as tl

from .bits import FLT_MAX, NAN_CODE, clamp_max, div6, e2m1_magic, e2m1_value, e4m3_round
from .operand_words import sign_bit
from .philox import randint4x

F32_2_23 = tl.constexpr(0x4B000000)  # the FP32 bits of 2^23
CAP = tl.constexpr(7 * 65536)  # stochastic_e2m1's c at a = 6


@triton.jit
def div(a, b):
    """Correctly rounded FP32 a / b for a constant a and a tensor b."""
    return tl.math.div_rn(tl.full(b.shape, a, tl.float32), b)


@triton.jit
def div_by(a, b):
    """Correctly rounded FP32 a / b for a tensor a and a scalar b."""
    return tl.math.div_rn(a, tl.full(a.shape, 0.0, tl.float32) + b)


@triton.jit
def val_div_6b(num, six_b):
    """num / 6B, correctly rounded. Zero numerators (every E2M1 zero code) skip the division, whose
    hardware range check (FCHK) can route them to the slow path and diverge the warp: +-0 / 6B is +-0."""
    zero = num == 0.0
    return tl.where(zero, num, div_by(tl.where(zero, 1.0, num), six_b))


@triton.jit
def round_e2m1(ax, inv, CLAMP: tl.constexpr):
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
def pack(ys):
    """The code magnitudes, the low 3 bits of each y = bits(a + magic) from round_e2m1 (a tuple of 16 int32),
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
def fast_encode_decode(xs, ws, inv, sf, KIND: tl.constexpr, CLAMP: tl.constexpr = False):
    """The chosen candidate's code magnitudes (packed as in fast_candidate) and its bf16 block-scaled decode
    as 8 int32 words (elements 2j, 2j+1 in word j), for the fast path's blocks (magnitudes xs, words ws).
    e2m1 value * sf has at most 6 significant bits and lies in bf16's range, so its FP32 bits are exactly the
    bf16 bits followed by zeros; the sign is x's (that of the code). CLAMP as in round_e2m1 (NVFP4 has no
    |x| * inv < 7 check)."""
    ys = ()
    dec = ()
    low_half = tl.zeros(inv.shape, tl.int32)
    for i in tl.static_range(16):
        y, magic = round_e2m1(xs[i], inv, CLAMP)
        ys = ys + (y.to(tl.int32, bitcast=True), )
        value = ((y - magic) * sf).to(tl.int32, bitcast=True) | sign_bit(ws, i, KIND)
        if i % 2 == 0:
            low_half = (value >> 16) & 0xFFFF
        else:
            dec = dec + ((value & -65536) | low_half, )
    lo, hi = pack(ys)
    return lo, hi, dec


@triton.jit
def prmt(a, b, SELECT: tl.constexpr):
    """PTX prmt.b32: byte k of the result is byte SELECT[k] of the 8 bytes {b, a} (a holds bytes 0-3); a select
    nibble with bit 3 set gives 0xFF or 0x00 by the sign bit of that byte instead."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, " + SELECT + ";", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def word_signs(w0, w1, w2, w3):
    """Bit 3 of each nibble set to the sign of the element a 16-bit input holds there: the sign bits of the
    four words' halves (bytes 1 and 3) gathered by byte permutes into the packed codes' layout."""
    even_odd01 = prmt(w0, w1, "0x7351")  # the sign bytes of elements 0, 2, 1, 3
    even_odd23 = prmt(w2, w3, "0x7351")  # and of elements 4, 6, 5, 7
    even = prmt(even_odd01, even_odd23, "0xDC98")  # byte j: 0xFF if element 2j is negative
    odd = prmt(even_odd01, even_odd23, "0x7632")  # byte j: bit 7 is the sign of element 2j + 1
    return (even & 0x08080808) | (odd & -2139062144)  # 0x80808080


@triton.jit
def with_signs(lo, hi, ws, KIND: tl.constexpr, PTX: tl.constexpr):
    """Packed code magnitudes with bit 3 of each code set to the IEEE sign of x (that of q, since inv > 0). On a
    GPU with 16-bit input, 12 byte-permute and mask instructions for the 16 signs instead of 32 shifts and ors."""
    if PTX and KIND != 0:
        return lo | word_signs(ws[0], ws[1], ws[2], ws[3]), hi | word_signs(ws[4], ws[5], ws[6], ws[7])
    for i in tl.static_range(16):
        sign = sign_bit(ws, i, KIND).to(tl.uint32, bitcast=True) >> (28 - 4 * (i % 8))
        if i < 8:
            lo = lo | sign.to(tl.int32, bitcast=True)
        else:
            hi = hi | sign.to(tl.int32, bitcast=True)
    return lo, hi


@triton.jit
def inverse_scale(sf, s_dec):
    """inv = min(1 / (sf * S_dec), FLT_MAX) of spec step 4."""
    return clamp_max(div(1.0, sf * s_dec), FLT_MAX)


# S_dec whose every b = sf * S_dec (sf an E4M3 value: 0 or in [2^-9, 448]) is in newton_inverse_scale's range.
NEWTON_S_DEC_MIN = tl.constexpr(2.0 ** -91)
NEWTON_S_DEC_MAX = tl.constexpr(2.0 ** 48)


@triton.jit
def newton_inverse_scale(sf, s_dec, neg_s_dec):
    """inverse_scale without a division, for b = sf * S_dec = 0 or in [2^-100, 2^57] (the fast path's range):
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
def candidate_scales(bamax, s_enc, s_dec, neg_s_dec, EXACT: tl.constexpr, PTX: tl.constexpr):
    """Spec step 3 for both candidates: (base6, base4, s6, s4, inv6, inv4), the E4M3 scales' inputs, their
    values and the inverse scales. EXACT divides with div_rn (any input). Otherwise bamax / 6 takes div6, equal
    wherever the scale can differ from 0 on the fast path (bamax <= 2^56, S_enc < 2^91), and with PTX (a
    GPU: the interpreter cannot run PTX) the inverse scales take newton_inverse_scale."""
    base = (div_by(bamax, 6.0) if EXACT else div6(bamax)) * s_enc
    base6 = clamp_max(base, 448.0)
    base4 = clamp_max(base * 1.5, 448.0)
    s6 = e4m3_round(base6)
    s4 = e4m3_round(base4)
    if PTX and not EXACT:
        return base6, base4, s6, s4, newton_inverse_scale(s6, s_dec, neg_s_dec), newton_inverse_scale(
            s4, s_dec, neg_s_dec)
    return base6, base4, s6, s4, inverse_scale(s6, s_dec), inverse_scale(s4, s_dec)


@triton.jit
def decode_word(lo, hi, sf, j: tl.constexpr):
    """Word j of the bf16 decode: elements 2j, 2j+1 as e2m1_value * f32(sf), exact in bf16."""
    packed = lo if j < 4 else hi
    shift: tl.constexpr = 8 * (j % 4)
    a = (e2m1_value((packed >> shift) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    b = (e2m1_value((packed >> (shift + 4)) & 15) * sf).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    return (a & 0xFFFF) | (b << 16)


@triton.jit
def decode_words(lo, hi, sf):
    """The block's whole bf16 decode: the 8 words of decode_word."""
    words = ()
    for j in tl.static_range(8):
        words = words + (decode_word(lo, hi, sf, j), )
    return words


@triton.jit
def shift_right(v, BITS: tl.constexpr, PTX: tl.constexpr):
    """v >> BITS for v in [0, 2^31) (on a GPU any 32-bit v, read as a uint32: random_halves' words). On a GPU one
    mul.hi.u32 by 2^(32 - BITS): the FMA pipe's, where the shift would take the integer ALU pipe the stochastic
    quantizer is bound by (docs/kernels.md)."""
    if PTX:
        return tl.inline_asm_elementwise("mul.hi.u32 $0, $1, $2;", "=r,r,r",
                                         [v, tl.full(v.shape, 1 << (32 - BITS), tl.int32)], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return v >> BITS


@triton.jit
def multiply_add(v, FACTOR: tl.constexpr, word):
    """word + v * FACTOR mod 2^32 (FACTOR an int32: its bits as a uint32): one mad.lo.u32, on the FMA pipe (GPU
    only; ptxas takes the constant as the instruction's immediate)."""
    return tl.inline_asm_elementwise("mad.lo.u32 $0, $1, $2, $3;", "=r,r,r,r",
                                     [v, tl.full(v.shape, FACTOR, tl.int32), word], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def add_shifted(word, v, BITS: tl.constexpr, PTX: tl.constexpr):
    """word | (v << BITS) for v's bits clear of word's (BITS < 31): on a GPU word + v 2^BITS by multiply_add."""
    if PTX:
        return multiply_add(v, 1 << BITS, word)
    return word | (v << BITS)


@triton.jit
def random_halves(word, PTX: tl.constexpr):
    """(low, high) 16-bit halves of a random int32 word, each an int32 in [0, 2^16); on a GPU by the FMA pipe:
    high = shift_right(word, 16), low = word - high 2^16 (multiply_add by -2^16)."""
    if PTX:
        high = shift_right(word, 16, PTX)
        return multiply_add(high, -65536, word), high
    return word & 0xFFFF, (word >> 16) & 0xFFFF


def _biased_ceil_asm(scale: float, offset: float) -> str:
    """fma.rp.f32 of $1, scale and 2^23 + offset, the constants as PTX's exact 0f hex literals."""
    f32 = lambda v: "0f" + struct.pack(">f", v).hex().upper()
    return f"fma.rp.f32 $0, $1, {f32(scale)}, {f32(2.0 ** 23 + offset)};"


ROUND_UP = 65535  # 2^16 - 1: stochastic_e2m1's c + ROUND_UP - r has L + [r < ceil(t)] above bit 16
CEIL_N = tl.constexpr(_biased_ceil_asm(2.0 ** 17, ROUND_UP))  # n = ceil(a 2^17), + ROUND_UP
CEIL_HALF = tl.constexpr(_biased_ceil_asm(2.0 ** 16, 2.0 ** 17 + ROUND_UP))  # ceil(n / 2) + 2^17, + ROUND_UP
CEIL_QUARTER = tl.constexpr(_biased_ceil_asm(2.0 ** 15, 2.0 ** 18 + ROUND_UP))  # ceil(n / 4) + 2^18, + ROUND_UP
CAP_BITS = tl.constexpr(F32_2_23 + CAP + ROUND_UP)  # the biased terms' clamp to 6
CODE_BIAS = tl.constexpr(F32_2_23 >> 16)  # what F32_2_23 adds to a code shifted down by 16 (stochastic_code_biased)
# Minus CODE_BIAS in each of a word's 8 nibbles, mod 2^32, as an int32: a word packed from biased codes plus this.
UNBIAS_WORD = tl.constexpr((-sum(CODE_BIAS << (4 * k) for k in range(8)) + 2 ** 31) % 2 ** 32 - 2 ** 31)


@triton.jit
def biased_ceil(a, ASM: tl.constexpr):
    """As an int32, the FP32 bits of one of the CEIL_* fma.rp(a, 2^k, 2^23 + OFFSET) (no .ftz: a subnormal product
    rounds up to 1 like any positive one): F32_2_23 + OFFSET + ceil(a 2^k) while a 2^k + OFFSET < 2^23 (the exact
    sum lies in [2^23, 2^24), where FP32's spacing is 1, so rounding it up is the ceiling); monotone in a beyond
    that, and NaN's bits for NaN."""
    return tl.inline_asm_elementwise(ASM, "=r,f", [a], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def stochastic_code_biased(a, r, ADDEND: tl.constexpr):
    """GPU only: ADDEND + CODE_BIAS + stochastic_e2m1(a, r) mod 2^32 (ADDEND an int32), the ALU pipe doing only the
    two mins: the three CEIL_* terms carry ROUND_UP and F32_2_23 (as does CAP_BITS), so c - r (a mad.lo by -1)
    is F32_2_23 + (c + ROUND_UP - r as stochastic_e2m1 writes it), and one mad.hi by 2^16 shifts it and adds
    ADDEND: the code plus F32_2_23 >> 16 = CODE_BIAS. stochastic_codes packs these, one word's biases taken off
    by the first code's ADDEND (UNBIAS_WORD)."""
    c = tl.minimum(tl.minimum(biased_ceil(a, CEIL_N), biased_ceil(a, CEIL_HALF)),
                   tl.minimum(biased_ceil(a, CEIL_QUARTER), CAP_BITS))
    v = multiply_add(r, -1, c)
    if ADDEND == 0:  # a plain mul.hi: with an addend ptxas makes it an ALU-pipe LEA.HI
        return shift_right(v, 16, True)
    return tl.inline_asm_elementwise("mad.hi.u32 $0, $1, 65536, $2;", "=r,r,r", [v, tl.full(c.shape, ADDEND, tl.int32)],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def stochastic_e2m1(a, r, PTX: tl.constexpr):
    """The code magnitude of min(a, 6) for a = |q| rounded stochastically by 16 random bits r (int32 in
    [0, 2^16)): from the lower neighbour lo up exactly when r < ceil(t), t = (a - lo) 2^16 / (hi - lo)
    (docs/numerics.md section 12; a NaN a gives some code in [0, 7]). In integers, with no select: on [0, 2),
    [2, 4), [4, 6] the grid step is 1/2, 1, 2 and lo's code L is floor(a / step) + 0, 2, 4. With n = ceil(a 2^17)
    (an exact scaling), c = min(n, ceil(n / 2) + 2^17, ceil(n / 4) + 2^18) is ceil(t) + L 2^16 on a's interval
    (the lines of a concave map, each the least on its own interval, equal where two meet), so
    (c + 2^16 - 1 - r) >> 16 = L + [r < ceil(t)]; at a = 6, c = 7 2^16 = CAP. On a GPU the three terms are
    biased_ceil's (ceil(n / m) = ceil(a 2^17 / m)), the clamp to 6 is the min with the cap, which also keeps
    NaN's code in [0, 7], and the rest is on the FMA pipe: stochastic_code_biased, unbiased by its addend."""
    if PTX:
        return stochastic_code_biased(a, r, -CODE_BIAS)
    n = tl.math.ceil(clamp_max(a, 6.0) * 131072.0).to(tl.int32)
    c = tl.minimum(n, tl.minimum((n + 262145) >> 1, (n + 1048579) >> 2))
    return (c + 65535 - r) >> 16


@triton.jit
def _packed_code(a, r, ADDEND: tl.constexpr, PTX: tl.constexpr):
    """A code as stochastic_codes packs it: on a GPU stochastic_code_biased's (ADDEND: UNBIAS_WORD for the first
    of a word, which takes the word's biases off, else 0), elsewhere stochastic_e2m1's."""
    if PTX:
        return stochastic_code_biased(a, r, ADDEND)
    return stochastic_e2m1(a, r, PTX)


@triton.jit
def stochastic_codes(xs, ws, inv, seed, first, NAN: tl.constexpr, KIND: tl.constexpr, PTX: tl.constexpr):
    """Packed signed codes (two int32 words) of a block rounded stochastically: element i has magnitude
    min(xs[i] * inv, 6) (|q| of spec step 4), the sign of x (that of q: inv > 0) set on the packed words, and
    with NAN a NaN |q| gets NAN_CODE (without, some code in [0, 7] with x's sign: the quantizer rewrites such
    chunks with NAN after its chunk loop, which only notes them). first (int64) is the block's first element
    index, a multiple of 16: the random bits of element i = 8j + 2w + h are half h (0: the low 16 bits) of word
    w of randint4x(seed, first // 8 + j), two Philox evaluations per block."""
    words = ()
    for j in tl.static_range(2):
        bits = randint4x(seed, first // 8 + j, PTX)
        halves = random_halves(bits[0], PTX)
        word = _packed_code(xs[8 * j] * inv, halves[0], UNBIAS_WORD, PTX)
        for k in tl.static_range(1, 8):
            if k % 2 == 0:
                halves = random_halves(bits[k // 2], PTX)
            word = add_shifted(word, _packed_code(xs[8 * j + k] * inv, halves[k % 2], 0, PTX), 4 * k, PTX)
        words = words + (word, )
    lo, hi = with_signs(words[0], words[1], ws, KIND, PTX)
    if NAN:
        for i in tl.static_range(16):
            a = xs[i] * inv
            nibble = tl.full(inv.shape, 15, tl.int32) << (4 * (i % 8))
            nan_code = tl.full(inv.shape, NAN_CODE, tl.int32) << (4 * (i % 8))
            if i < 8:
                lo = tl.where(a == a, lo, (lo & ~nibble) | nan_code)
            else:
                hi = tl.where(a == a, hi, (hi & ~nibble) | nan_code)
    return lo, hi
