"""Triton amax reductions (per tensor, per row) that read x once and never sync with the host.

max |x| is exact, so only NaN needs care: the max is taken over the FP32 bit patterns of |x| as int32,
where every positive NaN lies above +Inf, so a NaN propagates and comes out as one of the input's own NaN
patterns (as torch.amax returns), never a canonical NaN of the hardware's choosing.
"""

import torch
import triton
import triton.language as tl

from .launch import FastLaunch

TENSOR_BLOCK = 8192
ROW_BLOCK_ROWS = 16
ROW_BLOCK_COLS = 256


@triton.jit
def _abs_bits(x):
    return tl.abs(x.to(tl.float32)).to(tl.int32, bitcast=True)


@triton.jit(do_not_specialize=["n"])
def _tensor_amax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = _abs_bits(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
    tl.atomic_max(out_ptr, tl.max(bits, 0))


@triton.jit(do_not_specialize=["R"])  # C and stride specialized: vectorized loads when multiples of 16
def _row_amax_kernel(x_ptr, out_ptr, R, C, stride, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_off = rows.to(tl.int64)[:, None] * stride
    acc = tl.zeros([BR], tl.int32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        x = tl.load(x_ptr + row_off + cols[None, :], mask=(rows < R)[:, None] & (cols < C)[None, :], other=0.0)
        acc = tl.maximum(acc, tl.max(_abs_bits(x), 1))
    tl.store(out_ptr + rows, acc, mask=rows < R)


_TENSOR_AMAX = FastLaunch(_tensor_amax_kernel)
_ROW_AMAX = FastLaunch(_row_amax_kernel)


def eligible(x: torch.Tensor) -> bool:
    """CUDA floating tensors the kernels take: contiguous (tensor amax) or 2-D with unit column stride (rows)."""
    return x.is_cuda and x.dtype in (torch.float32, torch.bfloat16, torch.float16)


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over a contiguous CUDA tensor as an FP32 scalar tensor (0 for an empty tensor)."""
    out = torch.zeros((), dtype=torch.int32, device=x.device)
    n = x.numel()
    if n:
        _TENSOR_AMAX((triton.cdiv(n, TENSOR_BLOCK), ), x.reshape(-1), out, n, TENSOR_BLOCK, num_warps=8)
    return out.view(torch.float32)


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of a 2-D CUDA tensor with unit column stride, as an FP32 vector."""
    rows, cols = x.shape
    if not (rows and cols):
        return torch.zeros(rows, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, dtype=torch.int32, device=x.device)  # every row is stored: no fill launch
    _ROW_AMAX((triton.cdiv(rows, ROW_BLOCK_ROWS), ), x, out, rows, cols, x.stride(0), ROW_BLOCK_ROWS, ROW_BLOCK_COLS,
              num_warps=4)
    return out.view(torch.float32)
