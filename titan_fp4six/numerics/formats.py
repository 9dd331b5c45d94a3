"""Bit-level building blocks of NVFP4: E2M1 codes, E4M3 scales, nibble packing and the FP32 constants.

Constants that the spec defines as "the FP32 value of 1/n" are computed as FP32 tensor divisions (correctly
rounded), never by letting a Python float be lowered to a multiply by an inexact reciprocal.
"""

import torch
from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, f32_to_f4_unpacked, pack_uint4

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max
STANDARD_BOUND = 448
"""Block-scale bound B of standard NVFP4 (E4M3's largest value): its scales use the whole E4M3 range."""
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NAN_CODE = 0x3
"""The one E2M1 code every NaN gets (torchao's code for a positive NaN): a NaN's sign bit depends on the
device's arithmetic, so the stored byte must not."""


def fp32_const(value: float, device) -> torch.Tensor:
    """An exactly representable FP32 constant on `device`, filled by a kernel (no blocking host-to-device copy)."""
    return torch.full((), value, dtype=torch.float32, device=device)


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """FP32 values already clamped to [-6, 6] -> unpacked E2M1 codes (uint8, bit 3 = IEEE sign).

    torchao's encoder rounds to nearest even on the E2M1 grid with exactly the spec's tie points
    (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4) and keeps the sign of -0.0; tests pin it.
    """
    return f32_to_f4_unpacked(q)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Unpacked E2M1 codes -> FP32 values."""
    return f4_unpacked_to_f32(codes)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> float8_e4m3fn with saturation at 448 then round-to-nearest-even. NaN stays NaN."""
    return torch.clamp(x, max=E4M3_MAX).to(torch.float8_e4m3fn)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(R, C) unpacked codes -> (R, C/2) uint8, element 2j in the low nibble, 2j+1 in the high nibble."""
    return pack_uint4(codes)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """(R, C/2) packed uint8 -> (R, C) unpacked codes."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
