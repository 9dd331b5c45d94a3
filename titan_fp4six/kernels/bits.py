"""Bit-exact scalar building blocks for the Triton quantizers, each equal to the reference's step.

Hopper has no E2M1 convert instruction and its E4M3 convert treats NaN differently from PyTorch's. The fast
path rounds onto both grids with one FP32 add of a "magic" constant (e2m1_magic, e4m3_round: exact for their
stated input ranges, checked on every input by the tests); the stored scale bytes and the exact path use
integer code on the FP32 bits with the reference's algorithms (torchao's f32_to_f4_unpacked, c10's
fp8e4m3fn_from_fp32_value): same rounding, same NaN and signed-zero handling. Sign bits are set with bit
operations, never with `-v` (Triton lowers that to 0 - v, which loses -0.0). Clamps keep NaN like torch.clamp.
"""

import functools

import torch
import triton
import triton.language as tl

from ..numerics.formats import NAN_CODE as _NAN_CODE

NAN_CODE = tl.constexpr(_NAN_CODE)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
SIGN_BIT = tl.constexpr(-2147483648)  # 0x80000000 as int32
ONE_SIXTH = tl.constexpr(0.1666666716337204)  # fl(1/6)


@functools.cache
def f32_reciprocal(value: float) -> float:
    """fl(1 / value) in FP32, as a Python float (exact: an FP32 value): the constexpr the kernels multiply by."""
    return (torch.tensor(1.0) / torch.tensor(value, dtype=torch.float32)).item()


@triton.jit
def clamp_max(v, hi):
    """torch.clamp(v, max=hi): NaN stays NaN (min.NaN, one instruction)."""
    return tl.minimum(v, hi, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def clamp_e2m1(v):
    """torch.clamp(v, -6, 6): NaN stays NaN."""
    return tl.minimum(tl.maximum(v, -6.0, propagate_nan=tl.PropagateNan.ALL), 6.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_max(a, b):
    """Combine function of a NaN-propagating max reduction (torch.amax semantics)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def e4m3_bits(f):
    """FP32 already clamped to <= 448 -> float8_e4m3fn bits (int32 0..255): RNE, <= 2^-10 -> 0, NaN -> 0x7F|sign."""
    bits = f.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    # Below 2^-6: let an FP32 add of 2^14 do the RNE to multiples of 2^-9, then read the mantissa.
    small = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
    # Normal: rebias the exponent (127 -> 7), add the RNE bias, keep the top 3 mantissa bits.
    normal = (mag + ((-120 << 23) + 0x7FFFF) + ((mag >> 20) & 1)) >> 20
    r = tl.where(mag >= (1087 << 20), 0x7F, tl.where(mag < (121 << 23), small, normal)) & 0xFF
    return tl.where(bits < 0, r | 0x80, r)


@triton.jit
def e4m3_round(f):
    """FP32 in [0, 448] (or NaN) -> its float8_e4m3fn value as FP32 (the value of e4m3_bits(f)) in five
    instructions: one FP32 add of M = 2^(e+20) (e the exponent of f, at least -6) rounds f to a multiple of
    2^(e-3), the E4M3 spacing in f's binade (2^-9 for the subnormals below 2^-6), ties to even; <= 2^-10 -> 0."""
    e = tl.maximum(f.to(tl.int32, bitcast=True) & 0x7F800000, 121 << 23)
    magic = (e + (20 << 23)).to(tl.float32, bitcast=True)
    return (f + magic) - magic


@triton.jit
def e4m3_byte(s):
    """E4M3 value s as FP32 (>= 0, finite: an output of e4m3_round) -> its float8_e4m3fn byte in two instructions.
    s * 2^-120 carries E4M3's exponent bias in FP32's exponent field (exact: a power-of-two scaling that lands the
    E4M3 subnormals k * 2^-9 on the FP32 subnormals k * 2^-129), so its bits shifted right by 20 are the byte."""
    return (s * 7.52316384526264e-37).to(tl.int32, bitcast=True) >> 20


@triton.jit
def div6(a):
    """fl(a / 6) for finite a >= 2^-124 without a division: q = fl(a * fl(1/6)) is within one ulp of a / 6, the
    remainder a - 6q is exact in one FMA, and q + remainder * fl(1/6) then rounds to a / 6 (Markstein's
    theorem). Smaller a (results near FP32's subnormals) give a result below 2^-124, like a / 6. Checked against
    a correctly rounded division on every FP32 (tests)."""
    q = a * ONE_SIXTH
    return tl.fma(tl.fma(q, -6.0, a), ONE_SIXTH, q)


@triton.jit
def e2m1_code(q):
    """FP32 in [-6, 6] (or NaN) -> E2M1 code (int32 0..15): torchao's RNE with -0.0 -> 0x8, and the reference's
    canonical NAN_CODE for every NaN (a NaN's sign and payload depend on the device's arithmetic)."""
    bits = q.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    a = mag.to(tl.float32, bitcast=True)
    # Below 1: an FP32 add of 2^22 rounds to multiples of 0.5 (ties to even), giving codes 0, 1, 2.
    small = ((a + 4194304.0).to(tl.int32, bitcast=True) - (149 << 23)) & 0xFF
    # Normal: rebias the exponent (127 -> 1), add the RNE bias, keep one mantissa bit. NaN lands here too.
    normal = ((mag + ((-126 << 23) + 0x1FFFFF) + ((mag >> 22) & 1)) >> 22) & 0xFF
    r = tl.where(a >= 6.0, 7, tl.where(a < 1.0, small, normal))
    return tl.where(q != q, NAN_CODE, tl.where(bits < 0, r | 8, r))


@triton.jit
def e2m1_magic(a):
    """For a in [0, 7) (never NaN): the FP32 M such that one add a + M rounds min(a, 6) onto the E2M1 grid
    exactly like e2m1_code, with the code's magnitude in the sum's low 3 mantissa bits and (a + M) - M the value
    (on (6, 7) the add rounds to 6, as the clamp would).

    Why: an FP32 add rounds a + 2^k to a multiple of 2^(k-23), ties to an even multiple. The E2M1 grid has
    spacing 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6] (k = 22, 23, 24), and its tie rule (0.25->0, 0.75->1,
    1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4) is exactly ties to an even multiple of the spacing. M is 2^k plus
    0, 2, 4 units of its last place: an even offset keeps every tie going the same way and lifts the
    mantissa from 2v, v, v/2 to the code 2v, v + 2, v/2 + 4. In bits, with e = max(exponent of a, 127):
    M = e * (2^23 + 2) + (22 << 23) - 254. Checked against e2m1_code on every FP32 in [0, 7) (tests).
    """
    e = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, 127)
    return (e * 8388610 + ((22 << 23) - 254)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_value(code):
    """E2M1 code (int32 0..15) -> FP32 value, exact; 0x8 -> -0.0 like torchao's decode."""
    mag = code & 7
    # Magnitudes 2..7 are 1, 1.5, 2, 3, 4, 6: FP32 bits (mag + 252) << 22. Then 0.5 and 0.
    v = tl.where(mag > 1, (mag + 252) << 22, tl.where(mag == 1, 0x3F000000, 0))
    return tl.where(code >= 8, v | SIGN_BIT, v).to(tl.float32, bitcast=True)


@triton.jit
def tree_sum16(e):
    """(N, 16) row-block errors of N tiles -> (N, 1) tile errors in the spec's tree order (step 6).

    That order is a halving tree: rows j and j+8 first, then j and j+4 of those sums, and so on. A sum over
    an axis of size 2 is a single add, and FP addition is commutative, so each level is exact to the spec.
    """
    n: tl.constexpr = e.shape[0]
    e = tl.sum(tl.reshape(e, [n, 2, 8]), 1)
    e = tl.sum(tl.reshape(e, [n, 2, 4]), 1)
    e = tl.sum(tl.reshape(e, [n, 2, 2]), 1)
    return tl.sum(tl.reshape(e, [n, 2, 1]), 1)
