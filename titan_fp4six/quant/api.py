"""Public quantize / decode / amax entry points: check the arguments, then run (docs/numerics.md).

The quantizers are library.py's ops: eager calls run the kernel or the reference directly; while
torch.compile traces they are custom ops, so compiled code returns the eager bytes.
"""

from dataclasses import dataclass

import torch

from ..numerics.formats import BLOCK_SIZE, STANDARD_BOUND
from ..numerics.validation import (SCALE_BOUNDS, check_amax_covers, check_choice, check_codes,
                                   check_quantize_args, check_tile_uniform)
from . import amax as _amax
from . import library
from .backends import QUANTIZERS
from .library import resolved_quantizer
from .quantize import run_decode_block_scaled, run_dequantize


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


def _check(x, amax, block, err_mode, scale_bound, quantizer, validate_amax, choose=True) -> bool:
    """Check the arguments; returns the ops' check_amax: eager, validate_amax (the run functions check, the
    Triton quantizer inside its own read of x); while torch.compile traces False, the values cannot be read
    there and the amax check, unless validate_amax is False, runs here as graph ops."""
    tracing = torch.compiler.is_compiling()
    check_choice("quantizer", quantizer, QUANTIZERS)
    for name, flag in (("choose", choose), ("validate_amax", validate_amax)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=not tracing)
    if tracing and block == "16x16" and amax.dim() == 1 and x.shape[0]:  # the checks that read values, as graph ops
        check_tile_uniform(amax)
    if tracing and validate_amax:
        check_amax_covers(x, amax)
    return validate_amax and not tracing


def four_over_six_quantize(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16", err_mode: str = "mse",
                           scale_bound: int = 256, quantizer: str = "auto", choose: bool = True,
                           validate_amax: bool = True) -> NVFP4Blocks:
    """Four-over-six NVFP4 quantization of a 2-D tensor with a per-tensor or per-row FP32 amax.

    choose=False keeps the map-to-6 candidate in every block (with scale_bound=448: plain NVFP4, computed
    with the four-over-six scale association; docs/numerics.md). validate_amax: check amax >= 0 and |x| <= amax
    (numerics.validation.check_amax_covers; on CUDA a device assert, which the Triton quantizer makes in its own
    read of x); False skips it (a smaller amax saturates)."""
    check_amax = _check(x, amax, block, err_mode, scale_bound, quantizer, validate_amax, choose)
    return NVFP4Blocks(*library.four_over_six_op(x, amax, block, err_mode, scale_bound, quantizer, choose, check_amax))


def four_over_six_quantize_decode(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16",
                                  err_mode: str = "mse", scale_bound: int = 256, quantizer: str = "auto",
                                  choose: bool = True, validate_amax: bool = True) -> tuple[torch.Tensor, NVFP4Blocks]:
    """Quantize and return (exact bf16 block-scaled decode, NVFP4Blocks): what the emulated GEMMs consume.

    On eligible CUDA inputs one Triton kernel does both, reading x once; otherwise the reference composition.
    """
    check_amax = _check(x, amax, block, err_mode, scale_bound, quantizer, validate_amax, choose)
    dec, codes, scales, map4 = library.four_over_six_decode_op(x, amax, block, err_mode, scale_bound, quantizer, choose,
                                                               check_amax)
    return dec, NVFP4Blocks(codes, scales, map4)


def nvfp4_quantize(x: torch.Tensor, amax: torch.Tensor, *, quantizer: str = "auto",
                   validate_amax: bool = True) -> NVFP4Blocks:
    """Standard NVFP4 quantization (scale bound 448, 1x16 blocks, no candidate choice); validate_amax as in
    four_over_six_quantize."""
    check_amax = _check(x, amax, "1x16", "mse", STANDARD_BOUND, quantizer, validate_amax)
    return NVFP4Blocks(*library.nvfp4_op(x, amax, quantizer, check_amax))


def _check_blocks(codes: torch.Tensor, scales: torch.Tensor) -> None:
    check_codes(codes)
    rows, half = codes.shape
    if (not isinstance(scales, torch.Tensor) or scales.dtype != torch.float8_e4m3fn
            or scales.shape != (rows, half * 2 // BLOCK_SIZE)):
        got = f"{scales.dtype} {tuple(scales.shape)}" if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise TypeError(f"scales must be float8_e4m3fn of shape ({rows}, {half * 2 // BLOCK_SIZE}), got {got}")


def decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """e2m1_value * f32(block scale) without the global factor; exact in bf16 (at most 6 significant bits)."""
    _check_blocks(codes, scales)
    return run_decode_block_scaled(codes, scales, resolved_quantizer("auto", codes.device), dtype)


def nvfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, *, scale_bound: int,
                     dtype=torch.float32) -> torch.Tensor:
    """value = e2m1_value(code) * ((f32(sf) * amax) * fl(1/(6B))), in the requested dtype."""
    check_choice("scale_bound", scale_bound, SCALE_BOUNDS)
    _check_blocks(codes, scales)
    rows = codes.shape[0]
    if not isinstance(amax, torch.Tensor) or amax.dtype != torch.float32 or amax.shape not in ((), (rows,)):
        got = f"{amax.dtype} {tuple(amax.shape)}" if isinstance(amax, torch.Tensor) else type(amax).__name__
        raise TypeError(f"amax must be float32 of shape () or ({rows},), got {got}")
    return run_dequantize(codes, scales, amax, scale_bound, dtype, resolved_quantizer("auto", codes.device))


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor as an FP32 scalar tensor (NaN propagates). One read of x on CUDA."""
    return _amax.run_tensor_amax(x, resolved_quantizer("auto", x.device))


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of a 2-D tensor as an FP32 vector of length R. One read of x on CUDA."""
    if x.dim() != 2:
        raise ValueError(f"row_amax needs a 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    return _amax.run_row_amax(x, resolved_quantizer("auto", x.device))


def group_amax(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """max |x| over the rows of each token group (FP32, length E); rows past offs[-1] are never read into a
    group, empty groups get 0. `offs` holds inclusive group ends (length E, int32, non-decreasing, at most the rows:
    checked on the CPU, as the grouped GEMM checks them)."""
    if x.dim() != 2:
        raise ValueError(f"group_amax needs a 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    if (not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1 or not offs.numel()
            or offs.device != x.device):
        got = (f"{offs.dtype} {tuple(offs.shape)} on {offs.device}" if isinstance(offs, torch.Tensor)
               else type(offs).__name__)
        raise TypeError(f"offs must be a non-empty 1-D int32 tensor of inclusive group ends on x's device "
                        f"({x.device}), got {got}")
    _amax.check_offs_values(offs, x.shape[0], "x")
    return _amax.run_token_groups(x, offs, False, resolved_quantizer("auto", x.device))[0]
