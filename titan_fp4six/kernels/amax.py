"""Triton amax reductions (per tensor, per row, per token group) that read x once and never sync with the host.

max |x| is exact, so only NaN needs care: the max is taken over the FP32 bit patterns of |x| as int32,
where every positive NaN lies above +Inf, so a NaN propagates and comes out as one of the input's own NaN
patterns (as torch.amax returns), never a canonical NaN of the hardware's choosing.
"""

import torch
import triton
import triton.language as tl

from .launch import FastLaunch, cdiv

TENSOR_BLOCK = 8192
ROW_BLOCK_ROWS = 16
ROW_BLOCK_COLS = 256


@triton.jit
def _abs_bits(x):
    return tl.abs(x.to(tl.float32)).to(tl.int32, bitcast=True)


@triton.jit(do_not_specialize=["n", "m", "x_programs"])
def _tensor_amax_kernel(x_ptr, y_ptr, out_ptr, n, m, x_programs, BLOCK: tl.constexpr):
    """max |x| into out[0] and max |y| into out[1] (FP32 bits, atomics over zeros): the first x_programs
    programs read x, the others y (one launch for both amaxes of a dense GEMM)."""
    pid = tl.program_id(0)
    if pid < x_programs:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        bits = _abs_bits(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
        tl.atomic_max(out_ptr, tl.max(bits, 0), sem="relaxed")
    else:
        offs = (pid - x_programs).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        bits = _abs_bits(tl.load(y_ptr + offs, mask=offs < m, other=0.0))
        tl.atomic_max(out_ptr + 1, tl.max(bits, 0), sem="relaxed")


@triton.jit
def _row_max_bits(x_ptr, rows, R, C, stride, BR: tl.constexpr, BC: tl.constexpr):
    """max |x| of each of the BR rows as FP32 bits (int32), 0 for rows at or past R."""
    row_off = rows.to(tl.int64)[:, None] * stride
    acc = tl.zeros([BR], tl.int32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        x = tl.load(x_ptr + row_off + cols[None, :], mask=(rows < R)[:, None] & (cols < C)[None, :], other=0.0)
        acc = tl.maximum(acc, tl.max(_abs_bits(x), 1))
    return acc


@triton.jit(do_not_specialize=["R"])  # C and stride specialized: vectorized loads for multiples of 16
def _row_amax_kernel(x_ptr, out_ptr, R, C, stride, BR: tl.constexpr, BC: tl.constexpr):
    """max |x| of each row into out (FP32 bits)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    tl.store(out_ptr + rows, _row_max_bits(x_ptr, rows, R, C, stride, BR, BC), mask=rows < R)


@triton.jit(do_not_specialize=["R", "E"])
def _token_groups_kernel(x_ptr, offs_ptr, group_ptr, empty_ptr, out_ptr, R, C, stride, E, BR: tl.constexpr,
                         BC: tl.constexpr, EP: tl.constexpr, PER_ROW: tl.constexpr):
    """A grouped GEMM's A (R, C) with inclusive group ends offs (E,), in one read: each row's group into group_ptr
    (int64: the number of ends at or below the row, as searchsorted(offs, row, right=True), so E for the rows at
    or past offs[-1], which are not tokens) and max |x| as FP32 bits into out: per row (PER_ROW; 0 for rows that
    are not tokens) or per group, by atomic max into zeros (rows that are not tokens never reach a group).
    Program 0 also flags the empty groups (bool, E,), whose weight gradients the backward zeroes. EP is E rounded
    up to a power of two."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    e = tl.arange(0, EP)
    ends = tl.load(offs_ptr + e, mask=e < E, other=2147483647)
    if tl.program_id(0) == 0:
        starts = tl.load(offs_ptr + e - 1, mask=(e > 0) & (e < E), other=0)
        tl.store(empty_ptr + e, ends == starts, mask=e < E)
    group = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), axis=1)
    tl.store(group_ptr + rows, group.to(tl.int64), mask=rows < R)
    acc = _row_max_bits(x_ptr, rows, R, C, stride, BR, BC)
    if PER_ROW:
        tl.store(out_ptr + rows, tl.where(group < E, acc, 0), mask=rows < R)
    else:
        tl.atomic_max(out_ptr + group, acc, mask=(rows < R) & (group < E), sem="relaxed")


_TENSOR_AMAX = FastLaunch(_tensor_amax_kernel)
_ROW_AMAX = FastLaunch(_row_amax_kernel)
_TOKEN_GROUPS = FastLaunch(_token_groups_kernel)


def eligible(*xs: torch.Tensor) -> bool:
    """CUDA floating tensors the kernels take: contiguous (tensor amax) or 2-D with unit column stride (rows)."""
    return all(x.is_cuda and x.dtype in (torch.float32, torch.bfloat16, torch.float16) for x in xs)


def _tensor_amax_into(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
    """max |x| (and max |y|) as FP32 bits into the zeros of int32 out[0] (and out[1]); contiguous CUDA tensors."""
    n, m = x.numel(), (0 if y is None else y.numel())
    x_programs = cdiv(n, TENSOR_BLOCK)
    programs = x_programs + cdiv(m, TENSOR_BLOCK)
    if programs:
        flat = x.reshape(-1)
        _TENSOR_AMAX((programs, ), _TENSOR_AMAX.Args(
            x_ptr=flat, y_ptr=flat if y is None else y.reshape(-1), out_ptr=out, n=n, m=m, x_programs=x_programs,
            BLOCK=TENSOR_BLOCK), num_warps=8)


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over a contiguous CUDA tensor as an FP32 scalar tensor (0 for an empty tensor)."""
    out = torch.zeros((), dtype=torch.int32, device=x.device)
    _tensor_amax_into(out, x)
    return out.view(torch.float32)


def _row_amax_into(out: torch.Tensor, x: torch.Tensor) -> None:
    """max |x| of each of the R rows of x as FP32 bits into int32 out[:R]; every row is stored (no fill)."""
    rows, cols = x.shape
    _ROW_AMAX((cdiv(rows, ROW_BLOCK_ROWS), ), _ROW_AMAX.Args(
        x_ptr=x, out_ptr=out, R=rows, C=cols, stride=x.stride(0), BR=ROW_BLOCK_ROWS, BC=ROW_BLOCK_COLS), num_warps=4)


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of a 2-D CUDA tensor with unit column stride, as an FP32 vector."""
    rows, cols = x.shape
    if not (rows and cols):
        return torch.zeros(rows, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, dtype=torch.int32, device=x.device)
    _row_amax_into(out, x)
    return out.view(torch.float32)


def token_groups(x: torch.Tensor, offs: torch.Tensor,
                 per_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max |x| as FP32: per row (R,), 0 for rows at or past offs[-1], or per group (E,), 0 for empty groups;
    each row's group, int64 (R,), E at or past offs[-1]; which groups are empty, bool (E,)) of a grouped GEMM's
    A: a 2-D CUDA tensor with unit column stride; offs its inclusive group ends, int32 (E,), E >= 1,
    non-decreasing. One launch (after a fill of the per-group amaxes)."""
    rows, cols = x.shape
    experts = offs.numel()
    group = torch.empty(rows, dtype=torch.int64, device=x.device)
    empty = torch.empty(experts, dtype=torch.bool, device=x.device)
    if per_row:
        out = torch.empty(rows, dtype=torch.int32, device=x.device)
    else:
        out = torch.zeros(experts, dtype=torch.int32, device=x.device)
    _TOKEN_GROUPS((max(cdiv(rows, ROW_BLOCK_ROWS), 1), ), _TOKEN_GROUPS.Args(
        x_ptr=x, offs_ptr=offs, group_ptr=group, empty_ptr=empty, out_ptr=out, R=rows, C=cols, stride=x.stride(0),
        E=experts, BR=ROW_BLOCK_ROWS, BC=ROW_BLOCK_COLS, EP=1 << (experts - 1).bit_length(), PER_ROW=per_row),
        num_warps=4)
    return out.view(torch.float32), group, empty


def dense_amaxes(x: torch.Tensor, w: torch.Tensor, row_scaled: bool) -> torch.Tensor:
    """A dense GEMM's amaxes as one FP32 vector: max |x| (per row if row_scaled) then max |w|; contiguous CUDA
    x (M, K) and w. Per-tensor: both from one launch into one zero-filled buffer."""
    rows = x.shape[0] if row_scaled else 1
    out = torch.zeros(rows + 1, dtype=torch.int32, device=x.device)
    if not row_scaled:
        _tensor_amax_into(out, x, w)
    else:
        if rows:  # K is a positive multiple of 16 in every dense GEMM
            _row_amax_into(out, x)
        _tensor_amax_into(out[rows:], w)
    return out.view(torch.float32)
