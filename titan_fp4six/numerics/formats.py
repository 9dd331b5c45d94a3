"""Bit-level building blocks of NVFP4: E2M1 codes, E4M3 scales, nibble packing and the FP32 constants.

Constants that the spec defines as "the FP32 value of 1/n" are computed as FP32 tensor divisions (correctly
rounded), never by letting a Python float be lowered to a multiply by an inexact reciprocal.
"""

import torch

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max
STANDARD_BOUND = 448
"""Block-scale bound B of standard NVFP4 (E4M3's largest value): its scales use the whole E4M3 range."""
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DECODE_BIG_AMAX = 2.0 ** 119
"""From this amax on, f32(sf) * amax (|sf| <= 448 < 2^9) may overflow FP32, so the decode rescales it by
DECODE_RESCALE (docs/numerics.md, Decoding)."""
DECODE_RESCALE = 2.0 ** 64
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""The fixed sign vector of the 16-point randomized Hadamard transform (transform 'rht16', docs/numerics.md
section 11): element i of a block is multiplied by RHT_SIGNS[i] before the Hadamard butterfly. TransformerEngine's
wgrad sign vector, so the transform equals its reference implementation's."""
PHILOX_KEYS = (0x9E3779B9, 0xBB67AE85)
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
PHILOX_ROUNDS = 10
"""Philox4x32-10's constants as Triton defines the generator (key increments, round multipliers A and B, rounds):
the random bits of stochastic rounding (docs/numerics.md section 12; numerics/philox.py and kernels/philox.py)."""
SEED_LIMIT = 2 ** 63
"""Philox seeds are integers in [0, 2^63): a Triton kernel takes them as one int64 argument."""
NAN_CODE = 0x3
"""The one E2M1 code every NaN gets (torchao's code for a positive NaN): a NaN's sign bit depends on the
device's arithmetic, so the stored byte must not."""
# The spec's E2M1 tie points (midpoints of the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6), split by where RNE sends a tie
# (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4): the even code, below or above.
_E2M1_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)  # a tie here rounds down (to codes 0, 2, 4, 6): counted when |q| > t
_E2M1_TIES_UP = (0.75, 1.75, 3.5)  # a tie here rounds up (to codes 2, 4, 6): counted when |q| >= t


def fp32_const(value: float, device) -> torch.Tensor:
    """An exactly representable FP32 constant on `device`, filled by a kernel (no blocking host-to-device copy)."""
    return torch.full((), value, dtype=torch.float32, device=device)


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """FP32 values already clamped to [-6, 6] -> unpacked E2M1 codes (uint8, bit 3 = IEEE sign).

    Round to nearest even on the E2M1 grid with exactly the spec's tie points, sign = IEEE sign of q (so -0.0
    and negatives rounding to 0 give 0x8); bit-identical to torchao's f32_to_f4_unpacked (tests pin both), in
    pure PyTorch so importing the package never loads torchao. The code is the number of grid midpoints below
    |q| (counting a tie as below when it rounds up), which is device-independent comparison arithmetic.
    """
    a = q.abs()
    mag = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for t in _E2M1_TIES_DOWN:
        mag += a > t
    for t in _E2M1_TIES_UP:
        mag += a >= t
    mag = torch.where(torch.isnan(q), NAN_CODE, mag)
    return mag | (torch.signbit(q).to(torch.uint8) << 3)


_E2M1_GRID = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the positive E2M1 magnitudes, codes 1..7


def e2m1_encode_stochastic(q: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """FP32 values already clamped to [-6, 6] and 16 random bits each (int64 in [0, 2^16)) -> unpacked E2M1 codes,
    rounded stochastically (docs/numerics.md, section 12): a = |q| between neighbouring magnitudes lo <= a < hi
    goes up exactly when r < t, t = (a - lo) * (2^16 / (hi - lo)), an exact FP32 value (a - lo is exact by
    Sterbenz's lemma, the factor a power of two); r < t <=> r < ceil(t) for an integer r. a = 6 stays 6. Sign as
    e2m1_encode; a NaN q gets NAN_CODE."""
    a = q.abs()
    idx = torch.zeros(q.shape, dtype=torch.int64, device=q.device)
    for g in _E2M1_GRID:
        idx += a >= g
    lo = e2m1_decode(idx.to(torch.uint8))
    factor = torch.where(a < 2.0, 2.0 ** 17, torch.where(a < 4.0, 2.0 ** 16, 2.0 ** 15))
    t = (a - lo) * factor
    nan = torch.isnan(q)
    up = bits < torch.ceil(torch.where(nan, 0.0, t)).to(torch.int64)
    mag = torch.where(nan, NAN_CODE, (idx + up.to(torch.int64)).to(torch.uint8))
    return mag | (torch.signbit(q).to(torch.uint8) << 3) * (~nan).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Unpacked E2M1 codes -> FP32 values (0x8 -> -0.0), built from bits (no table copied to the device):
    magnitudes 2..7 are 1, 1.5, 2, 3, 4, 6, whose FP32 bits are (m + 252) << 22; then 0.5 and 0."""
    c = codes.to(torch.int32)
    m = c & 7
    bits = torch.where(m > 1, (m + 252) << 22, torch.where(m == 1, 0x3F000000, 0).to(torch.int32))
    return torch.where(c >= 8, bits | -0x80000000, bits).to(torch.int32).view(torch.float32)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> float8_e4m3fn with saturation at 448 then round-to-nearest-even. NaN stays NaN."""
    return torch.clamp(x, max=E4M3_MAX).to(torch.float8_e4m3fn)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(R, C) unpacked codes -> (R, C/2) uint8, element 2j in the low nibble, 2j+1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """(R, C/2) packed uint8 -> (R, C) unpacked codes."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


MAP4_COUNT_ROWS = 64
MAP4_COUNT_WIDTH = 16
"""The layout of the running map-to-4 count the quantizers add to (quant.process_state.map4_count_buffer)."""

