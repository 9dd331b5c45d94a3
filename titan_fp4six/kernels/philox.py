"""Philox4x32-10 for the kernels: the words of tl.randint4x(seed, counter) (docs/numerics.md section 12).
On a GPU each round's two 32 x 32-bit products are one mul.wide.u32 apiece (upper and lower word together,
where Triton emits a mul.hi and a mul.lo), and the first round, whose c2 and c3 are 0, skips its B product."""

import triton
import triton.language as tl

from ..numerics.formats import PHILOX_KEYS, PHILOX_MULTIPLIERS
from ..numerics.formats import PHILOX_ROUNDS as _ROUNDS


def _mul_wide_asm(factor: int) -> str:
    """(upper, lower) 32 bits of $2 * factor as outputs $0, $1."""
    return f"{{ .reg .b64 p; mul.wide.u32 p, $2, {factor:#x}; mov.b64 {{$1, $0}}, p; }}"


MUL_WIDE_A = tl.constexpr(_mul_wide_asm(PHILOX_MULTIPLIERS[0]))
MUL_WIDE_B = tl.constexpr(_mul_wide_asm(PHILOX_MULTIPLIERS[1]))
PHILOX_ROUNDS = tl.constexpr(_ROUNDS)
PHILOX_KEY_A = tl.constexpr(PHILOX_KEYS[0])
PHILOX_KEY_B = tl.constexpr(PHILOX_KEYS[1])


@triton.jit
def _mul_wide(c, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,=r,r", [c], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def randint4x(seed, counter, PTX: tl.constexpr):
    """The four int32 words (bit patterns of the uint32s) of tl.randint4x(seed, counter) for a scalar seed in
    [0, 2^63) (int64, or int32 where Triton types an argument below 2^31 so) and an int64 tensor counter in
    [0, 2^63)."""
    if not PTX:
        c0, c1, c2, c3 = tl.randint4x(seed, counter)
        return (c0.to(tl.int32, bitcast=True), c1.to(tl.int32, bitcast=True), c2.to(tl.int32, bitcast=True),
                c3.to(tl.int32, bitcast=True))
    seed = seed.to(tl.int64)
    k0 = seed & 0xFFFFFFFF  # the key's words as int64 scalars, advanced mod 2^32
    k1 = seed >> 32
    c0 = counter.to(tl.int32)  # the low 32 bits
    hi_a, lo_a = _mul_wide(c0, MUL_WIDE_A)
    c0 = (counter >> 32).to(tl.int32) ^ k0.to(tl.int32)  # round 1 of c2 = c3 = 0: hi(B c2) = lo(B c2) = 0
    c1 = tl.zeros_like(c0)
    c2 = hi_a ^ k1.to(tl.int32)
    c3 = lo_a
    for _ in tl.static_range(1, PHILOX_ROUNDS):
        k0 = (k0 + PHILOX_KEY_A) & 0xFFFFFFFF
        k1 = (k1 + PHILOX_KEY_B) & 0xFFFFFFFF
        hi_b, lo_b = _mul_wide(c2, MUL_WIDE_B)
        hi_a, lo_a = _mul_wide(c0, MUL_WIDE_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0.to(tl.int32), lo_b, hi_a ^ c3 ^ k1.to(tl.int32), lo_a
    return c0, c1, c2, c3
