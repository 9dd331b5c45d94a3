"""Public quantize / dequantize entry points: validate, then run the numerics of ../spec numerics.md."""

from dataclasses import dataclass

import torch

from . import reference
from .dispatch import fast_path
from .formats import BLOCK_SIZE, E2M1_MAX, e2m1_decode, fp32_const, unpack_codes
from .validation import SCALE_BOUNDS, check_choice, check_codes, check_quantize_args


@dataclass(frozen=True)
class NVFP4Blocks:
    """Quantized tensor in the plain NVFP4 layout; unpacks as `codes, scales`.

    codes: uint8 (R, C/2), two E2M1 codes per byte (even element in the low nibble).
    scales: float8_e4m3fn (R, C/16), one per 1x16 block (16x16 tiles repeat theirs over the tile's rows).
    map4: bool (R, C/16), which blocks stored the map-to-4 candidate (None for standard NVFP4). It is
    bookkeeping for metrics only: decoding never needs it.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    map4: torch.Tensor | None = None

    def __iter__(self):
        return iter((self.codes, self.scales))


def four_over_six_quantize(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16", err_mode: str = "mse",
                           scale_bound: int = 256, validate_amax: bool = True) -> NVFP4Blocks:
    """Four-over-six NVFP4 quantization of a 2-D tensor with a per-tensor or per-row FP32 amax.

    validate_amax: check 0 <= max |x| <= amax (one more read of x; an asynchronous assert on CUDA); callers
    that computed amax from x themselves (the GEMM ops) pass False."""
    check_quantize_args(x, amax, block, err_mode, scale_bound, against_data=validate_amax)
    kernels = fast_path(x, "quantize")
    impl = kernels.four_over_six_quantize if kernels else reference.four_over_six_reference
    return NVFP4Blocks(*impl(x, amax, block, err_mode, scale_bound))


def nvfp4_quantize(x: torch.Tensor, amax: torch.Tensor, *, validate_amax: bool = True) -> NVFP4Blocks:
    """Standard NVFP4 quantization (scale bound 448, 1x16 blocks, no candidate choice); validate_amax as in
    four_over_six_quantize."""
    check_quantize_args(x, amax, "1x16", "mse", 448, against_data=validate_amax)
    kernels = fast_path(x, "quantize")
    return NVFP4Blocks(*(kernels.nvfp4_quantize if kernels else reference.nvfp4_reference)(x, amax))


def decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """e2m1_value * f32(block scale), without the global factor. At most 6 significant bits within bf16's
    range, so exact in bf16: the operand of the emulated GEMMs (the global factor is applied afterwards)."""
    check_codes(codes)
    rows, half = codes.shape
    values = e2m1_decode(unpack_codes(codes)).view(rows, half * 2 // BLOCK_SIZE, BLOCK_SIZE)
    return (values * scales.float()[..., None]).view(rows, half * 2).to(dtype)


def four_over_six_quantize_decode(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16",
                                  err_mode: str = "mse", scale_bound: int = 256, validate_amax: bool = True):
    """Quantize and return (exact bf16 block-scaled decode, NVFP4Blocks): what the emulated GEMMs consume.

    On eligible CUDA inputs one Triton kernel does both, reading x once; otherwise the reference composition.
    validate_amax as in four_over_six_quantize.
    """
    check_quantize_args(x, amax, block, err_mode, scale_bound, against_data=validate_amax)
    kernels = fast_path(x, "quantize")
    if kernels:
        dec, codes, scales, map4 = kernels.four_over_six_quantize_decode(x, amax, block, err_mode, scale_bound)
        return dec, NVFP4Blocks(codes, scales, map4)
    codes, scales, map4 = reference.four_over_six_reference(x, amax, block, err_mode, scale_bound)
    return decode_block_scaled(codes, scales), NVFP4Blocks(codes, scales, map4)


def global_decode_factor(amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """amax * fl(1/(6B)): the factor between block-scaled values and real values (spec, Dequantize)."""
    inv_six_b = fp32_const(1.0, amax.device) / fp32_const(E2M1_MAX * scale_bound, amax.device)
    return amax * inv_six_b


def nvfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, *, scale_bound: int,
                     dtype=torch.float32) -> torch.Tensor:
    """value = e2m1_value(code) * ((f32(sf) * amax) * fl(1/(6B))), in the requested dtype."""
    check_choice("scale_bound", scale_bound, SCALE_BOUNDS)
    check_codes(codes)
    rows, half = codes.shape
    if scales.dtype != torch.float8_e4m3fn or scales.shape != (rows, half * 2 // BLOCK_SIZE):
        raise TypeError(f"scales must be float8_e4m3fn of shape ({rows}, {half * 2 // BLOCK_SIZE}), "
                        f"got {scales.dtype} {tuple(scales.shape)}")
    if amax.dtype != torch.float32 or amax.shape not in ((), (rows,)):
        raise TypeError(f"amax must be float32 of shape () or ({rows},), got {amax.dtype} {tuple(amax.shape)}")
    amax_r = amax if amax.dim() == 0 else amax[:, None]
    scale = global_decode_factor(scales.float() * amax_r, scale_bound)
    values = e2m1_decode(unpack_codes(codes)).view(rows, half * 2 // BLOCK_SIZE, BLOCK_SIZE)
    return (values * scale[..., None]).view(rows, half * 2).to(dtype)
