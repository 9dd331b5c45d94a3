"""Triton decode of NVFP4 codes and E4M3 block scales: one read of codes and scales, one write of the values.

Bitwise equal to reference.decode_block_scaled_reference (e2m1 value * f32(scale), exact in bf16) and to
reference.dequantize_reference (value = e2m1 value * ((f32(scale) * amax) * fl(1/(6B))) in FP32, rescaled by
powers of two for amax >= 2^119 as reference.decode_scale, then
cast to the output dtype with round-to-nearest-even): the same FP32 operations in the same order, one at a
time (no FMA contraction). Launchers take validated, contiguous CUDA tensors (or run under the interpreter).
"""

import torch
import triton
import triton.language as tl

from ..numerics.formats import DECODE_BIG_AMAX, DECODE_RESCALE
from .amax_rows import AmaxLayout, load_row_amax
from .bits import SIGN_BIT, e2m1_value, f32_reciprocal
from .launch import COMPILE_OPTIONS, FastLaunch, cdiv, check_grid_y

# A program decodes 8 rows x 32 blocks (4096 values), two blocks per thread: 8-byte code loads, 32-byte stores.
BLOCK_ROWS = 8
BLOCK_BLOCKS = 32
WARPS = 4
OUT_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
TWO_TO_120 = tl.constexpr(2.0 ** 120)
BIG_AMAX = tl.constexpr(DECODE_BIG_AMAX)
RESCALE = tl.constexpr(DECODE_RESCALE)


@triton.jit
def e4m3_value(byte):
    """float8_e4m3fn byte (int32 0..255) -> its FP32 value, exactly as scales.float(): the byte's exponent and
    mantissa bits shifted by 20 land in FP32's fields with a bias 120 larger, so times 2^120 (exact, subnormals
    included: k * 2^-129 becomes k * 2^-9) is the magnitude; 0x7F and 0xFF are NaN; the sign is set by bits."""
    mag = (((byte & 0x7F) << 20).to(tl.float32, bitcast=True) * TWO_TO_120).to(tl.int32, bitcast=True)
    mag = tl.where((byte & 0x7F) == 0x7F, 0x7FC00000, mag)  # NaN
    return (mag | tl.where(byte >= 128, SIGN_BIT, 0)).to(tl.float32, bitcast=True)


@triton.jit
def bf16_rne(v):
    """FP32 -> bf16 rounded to nearest even, as PyTorch's .to(torch.bfloat16), in integer operations (Triton's
    interpreter truncates instead): add 0x7FFF plus the kept part's lowest bit, keep the high half. Infinities
    stay, overflow rounds to infinity, NaN stays NaN (quiet)."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    half = tl.where(v != v, (bits >> 16) | 0x40, rounded)
    return half.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit(do_not_specialize=["R", "NBLK", "amax_div", "n_groups"])
def _decode_kernel(codes_ptr, scales_ptr, amax_ptr, group_ptr, out_ptr, R, NBLK, amax_div, n_groups,
                   GLOBAL: tl.constexpr, GROUPS: tl.constexpr, BY_GROUP: tl.constexpr, R6B: tl.constexpr,
                   OUT: tl.constexpr, BR: tl.constexpr, NB: tl.constexpr):
    """Values of BR rows x NB blocks: e2m1 value * f32(scale), times the global factor when GLOBAL
    (scale = (f32(sf) * amax) * R6B, R6B = fl(1/(6B)), each row's amax by load_row_amax; rescaled by 2^-64 / 2^64
    around it where amax >= 2^119, as reference.decode_scale)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR))[:, None]
    blks = (tl.program_id(1) * NB + tl.arange(0, NB))[None, :]
    ok = (rows < R) & (blks < NBLK)
    rows64 = rows.to(tl.int64)
    scale = e4m3_value(tl.load(scales_ptr + rows64 * NBLK + blks, mask=ok, other=0).to(tl.int32))
    if GLOBAL:
        amax, _ = load_row_amax(amax_ptr, group_ptr, rows, R, amax_div, n_groups, GROUPS, BY_GROUP)
        big = amax >= BIG_AMAX  # reference.decode_scale: rescaled by powers of two where f32(sf) * amax may overflow
        scale = ((scale * (amax * tl.where(big, 1.0 / RESCALE, 1.0))) * R6B) * tl.where(big, RESCALE, 1.0)
    scale = scale[:, :, None]
    byte = (rows64 * (NBLK * 8) + blks * 8)[:, :, None] + tl.arange(0, 8)[None, None, :]
    codes = tl.load(codes_ptr + byte, mask=ok[:, :, None], other=0).to(tl.int32)
    low = e2m1_value(codes & 15) * scale  # element 2j: the byte's low nibble
    high = e2m1_value(codes >> 4) * scale
    values = tl.reshape(tl.join(low, high), [BR, NB, 16])
    if OUT == 0:
        values = bf16_rne(values)
    elif OUT == 1:
        values = values.to(tl.float16)
    out = (rows64 * (NBLK * 16) + blks * 16)[:, :, None] + tl.arange(0, 16)[None, None, :]
    tl.store(out_ptr + out, values, mask=ok[:, :, None])


_DECODE = FastLaunch(_decode_kernel)


def _decode(codes, scales, amax, scale_bound, dtype, groups=None):
    rows, half = codes.shape
    nblk = half // 8
    out = torch.empty(rows, half * 2, dtype=dtype, device=codes.device)
    grid = (cdiv(rows, BLOCK_ROWS), cdiv(nblk, BLOCK_BLOCKS))
    check_grid_y(grid, f"a codes tensor of shape {tuple(codes.shape)}")
    if rows and nblk:
        factor = amax is not None
        amax = amax if factor else scales  # no global factor: any tensor for the unused pointers
        layout = AmaxLayout.of(amax, rows, groups)
        _DECODE(grid, _DECODE.Args(
            codes_ptr=codes, scales_ptr=scales.view(torch.uint8), amax_ptr=amax, group_ptr=layout.group_ptr,
            out_ptr=out, R=rows, NBLK=nblk, amax_div=layout.amax_div, n_groups=layout.n_groups, GLOBAL=factor,
            GROUPS=layout.groups, BY_GROUP=layout.by_group, R6B=f32_reciprocal(6.0 * scale_bound),
            OUT=OUT_KIND[dtype], BR=BLOCK_ROWS, NB=BLOCK_BLOCKS), num_warps=WARPS, **COMPILE_OPTIONS)
    return out


def eligible(codes: torch.Tensor, scales: torch.Tensor) -> bool:
    """Inputs the decode kernels take (shapes and dtypes already validated): contiguous CUDA codes and scales."""
    return codes.is_cuda and scales.is_cuda and codes.is_contiguous() and scales.is_contiguous()


def decode_block_scaled(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 (R, C) e2m1 value * f32(block scale) of codes uint8 (R, C/2) and scales float8_e4m3fn (R, C/16);
    bitwise equal to reference.decode_block_scaled_reference (exact: at most 6 significant bits)."""
    return _decode(codes, scales, None, 256, torch.bfloat16)


def nvfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int,
                     dtype: torch.dtype = torch.float32, groups=None) -> torch.Tensor:
    """(R, C) values e2m1 * ((f32(sf) * amax) * fl(1/(6B))) in dtype (bf16, fp16 or fp32), amax FP32 of shape ()
    or (G,), or per group / row with RowGroups `groups` (reference.amax_per_row); bitwise equal to
    reference.dequantize_reference of the amax per row."""
    return _decode(codes, scales, amax, scale_bound, dtype, groups)
