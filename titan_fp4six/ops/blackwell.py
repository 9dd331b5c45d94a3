"""Real NVFP4 GEMMs on Blackwell (compute capability 10.x) through torch.nn.functional.scaled_mm /
scaled_grouped_mm: packed float4_e2m1fn_x2 operands, E4M3 block scales in cuBLAS's swizzled 128x4 layout,
and the FP32 global decode factors as the second scaling level (the kernel multiplies the FP32 accumulator
by their product, as the emulation does).

Row-scaled activations (a factor amax_r * fl(1/(6B)) per row) have no per-row slot in these kernels: the
constant fl(1/(6B)) goes in the activation's global-scale slot (in every group's slot for the grouped GEMM),
and the kernel's bf16 output is multiplied by the raw per-row amaxes in FP32 and rounded to bf16 again. That is
one extra bf16 rounding compared with the emulation, which applies the whole factor to the FP32 accumulator.

Per-tensor (per-group) and row-scaled activations both run here (row-scaled: the constant 1/(6B) in the
kernel's global-scale slot, the raw per-row amaxes applied to the bf16 output, one extra bf16 rounding). Where
they run (the recipe knob `gemm`, TITAN_FP4SIX_EMULATE, compute capability 10.x) is decided once per device by
quant.backends.resolve_backends.
"""

import torch
import torch.nn.functional as F

from ..quant.operands import Operand

SCALE_TILE_ROWS, SCALE_TILE_COLS = 128, 4


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Plain (..., R, C) E4M3 block scales -> cuBLAS's block-scaling layout (SWIZZLE_32_4_4), zero-padded to
    (..., round_up(R, 128), round_up(C, 4)) and flattened per leading index.

    The padded matrix is cut into 128x4 tiles stored row-tile-major; inside a tile, element (r, c) sits at
    offset (r % 32) * 16 + (r // 32) * 4 + c.
    """
    *lead, rows, cols = scales.shape
    rows_p, cols_p = _round_up(rows, SCALE_TILE_ROWS), _round_up(cols, SCALE_TILE_COLS)
    raw = torch.nn.functional.pad(scales.view(torch.uint8), (0, cols_p - cols, 0, rows_p - rows))
    tiles = raw.view(*lead, rows_p // 128, 4, 32, cols_p // 4, 4)  # (.., row tile, r//32, r%32, col tile, c)
    n = len(lead)
    perm = (*range(n), n, n + 3, n + 2, n + 1, n + 4)  # -> (.., row tile, col tile, r%32, r//32, c)
    return tiles.permute(perm).reshape(*lead, rows_p * cols_p).view(torch.float8_e4m3fn)


def _fp4(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float4_e2m1fn_x2)


def _two_level(scales: torch.Tensor, factor: torch.Tensor) -> dict:
    return dict(scales=[scales, factor], recipe=[F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise],
                swizzle=[F.SwizzleType.SWIZZLE_32_4_4, F.SwizzleType.NO_SWIZZLE])


def dense_args(a: Operand, a_factor: torch.Tensor, b: Operand, b_factor: torch.Tensor, out_dtype) -> dict:
    """Keyword arguments of F.scaled_mm for a (M, K) x b (N, K)^T with per-tensor global factors."""
    sa, sb = _two_level(swizzle_scales(a.scales), a_factor), _two_level(swizzle_scales(b.scales), b_factor)
    return dict(mat_a=_fp4(a.codes), mat_b=_fp4(b.codes).t(), scale_a=sa["scales"], scale_recipe_a=sa["recipe"],
                swizzle_a=sa["swizzle"], scale_b=sb["scales"], scale_recipe_b=sb["recipe"], swizzle_b=sb["swizzle"],
                output_dtype=out_dtype)


def scaled_mm_nt(a: Operand, a_factor, b: Operand, b_factor, out_dtype) -> torch.Tensor:
    return F.scaled_mm(**dense_args(a, a_factor, b, b_factor, out_dtype))


def _scale_rows(out: torch.Tensor, row_amax: torch.Tensor) -> torch.Tensor:
    """The kernel's bf16 output times each row's raw amax (FP32 product, rounded to the output dtype)."""
    return (out.float() * row_amax[:, None]).to(out.dtype)


def scaled_mm_nt_row_scaled(a: Operand, a_const, a_row_amax, b: Operand, b_factor, out_dtype) -> torch.Tensor:
    """a x b^T for row-scaled a (factor a_row_amax * a_const per row): a_const in the global-scale slot."""
    return _scale_rows(scaled_mm_nt(a, a_const, b, b_factor, out_dtype), a_row_amax)


def group_padded_rows(offs: torch.Tensor, rows: int) -> tuple[torch.Tensor, int]:
    """Destination row of every activation row when each token group's scales start on a 128-row boundary
    (the per-group layout of grouped block-scaled GEMMs). Rows past offs[-1] go to one spare tile at the end,
    which the caller drops. Returns (dest (rows,) int64, padded row count without the spare tile)."""
    offs64 = offs.long()
    counts = torch.diff(offs64, prepend=offs64.new_zeros(1))
    padded = (counts + SCALE_TILE_ROWS - 1) // SCALE_TILE_ROWS * SCALE_TILE_ROWS
    padded_starts = torch.cumsum(padded, 0) - padded
    total = _round_up(rows, SCALE_TILE_ROWS) + offs.numel() * SCALE_TILE_ROWS  # bound on sum(padded), no sync
    gidx = torch.searchsorted(offs64, torch.arange(rows, device=offs.device), right=True)
    valid = gidx < offs.numel()
    g = gidx.clamp(max=offs.numel() - 1)
    dest = padded_starts[g] + torch.arange(rows, device=offs.device) - (offs64[g] - counts[g])
    return torch.where(valid, dest, torch.full_like(dest, total)), total


def grouped_args(a: Operand, a_factor: torch.Tensor, w: Operand, w_factor: torch.Tensor, offs: torch.Tensor,
                 experts: int, out_dtype) -> dict:
    """Keyword arguments of F.scaled_grouped_mm for A (M, K) rows grouped by `offs` against expert weights
    w (E*N, K) (one operand, row-blocked along K), with per-group and per-expert global factors (E,)."""
    rows, half_k = a.codes.shape
    dest, total = group_padded_rows(offs, rows)
    placed = a.scales.view(torch.uint8).new_zeros(total + SCALE_TILE_ROWS, a.scales.shape[1])
    placed = placed.index_copy(0, dest, a.scales.view(torch.uint8)).view(torch.float8_e4m3fn)
    cols_p = _round_up(a.scales.shape[1], SCALE_TILE_COLS)
    a_sw = swizzle_scales(placed)[: total * cols_p].view(total, cols_p)
    n = w.codes.shape[0] // experts
    w_sw = swizzle_scales(w.scales.view(experts, n, -1))
    sa, sb = _two_level(a_sw, a_factor), _two_level(w_sw, w_factor)
    mat_b = _fp4(w.codes.view(experts, n, half_k)).transpose(-2, -1)
    return dict(mat_a=_fp4(a.codes), mat_b=mat_b, scale_a=sa["scales"], scale_recipe_a=sa["recipe"],
                swizzle_a=sa["swizzle"], scale_b=sb["scales"], scale_recipe_b=sb["recipe"], swizzle_b=sb["swizzle"],
                offs=offs, output_dtype=out_dtype)


def scaled_grouped_mm_nt(a, a_factor, w, w_factor, offs, experts, out_dtype) -> torch.Tensor:
    return F.scaled_grouped_mm(**grouped_args(a, a_factor, w, w_factor, offs, experts, out_dtype))


def scaled_grouped_mm_nt_row_scaled(a, a_const, a_row_amax, w, w_factor, offs, experts, out_dtype) -> torch.Tensor:
    """Grouped GEMM for row-scaled A: one scaled_grouped_mm with a_const in every group's global-scale slot."""
    out = scaled_grouped_mm_nt(a, a_const.expand(experts).contiguous(), w, w_factor, offs, experts, out_dtype)
    return _scale_rows(out, a_row_amax)

