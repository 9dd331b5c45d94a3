"""Triton epilogue of the emulated GEMMs: the FP32 (or bf16 grouped) product times the global decode factors,
cast to the output dtype, in one pass (PyTorch needed five small kernels for it: two factors, their product,
the multiply and the cast; the grouped form also a gather and a select). And the bf16 grouped backward's one
epilogue, zeroing the rows that are not data (zero_rows), which writes only those rows.

Bitwise equal to reference.scale_cast_reference / grouped_scale_cast_reference /
grouped_wgrad_scale_cast_reference: fa = amax_a * fl(1/(6B)) and
fb = amax_b * fl(1/(6B)) in FP32, their product first, then the product times it, one rounding at a time (no
FMA contraction), cast with round-to-nearest-even (NaN as PyTorch casts it).
"""

import torch
import triton
import triton.language as tl

from .bits import f32_reciprocal
from .decode import OUT_KIND, bf16_rne
from .launch import COMPILE_OPTIONS, FastLaunch, cdiv, check_grid_y

BLOCK_ROWS = 16
BLOCK_COLS = 256
WARPS = 4
A_TENSOR, A_ROW, A_GROUP = 0, 1, 2  # how the activation-side amax is laid out


# N is specialized (multiple of 16 or not): with it known, Triton can vectorize the row loads and stores; without,
# each element moves alone (`python -m scripts.bench kernels --only epilogue` times both).
@triton.jit(do_not_specialize=["M", "experts"])
def _scale_cast_kernel(acc_ptr, a_amax_ptr, b_amax_ptr, group_ptr, out_ptr, M, N, experts, A_MODE: tl.constexpr,
                       GROUPED: tl.constexpr, A_R6B: tl.constexpr, B_R6B: tl.constexpr, OUT: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr):
    """out[r, c] = acc[r, c] * (fa(r) * fb(r)); GROUPED: fb is row r's expert's, rows of no expert are +0."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    in_rows = rows < M
    keep = in_rows
    if GROUPED:
        group = tl.load(group_ptr + rows, mask=in_rows, other=0)
        keep = in_rows & (group < experts)
        fb = tl.load(b_amax_ptr + group, mask=keep, other=0.0) * B_R6B
    else:
        fb = tl.load(b_amax_ptr) * B_R6B
    if A_MODE == 0:
        fa = tl.load(a_amax_ptr) * A_R6B
    elif A_MODE == 1:
        fa = tl.load(a_amax_ptr + rows, mask=in_rows, other=0.0) * A_R6B
    else:
        fa = tl.load(a_amax_ptr + group, mask=keep, other=0.0) * A_R6B
    factor = tl.broadcast_to(fa * fb, (BM, ))[:, None]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    ok = in_rows[:, None] & (cols < N)[None, :]
    v = tl.load(acc_ptr + offs, mask=ok, other=0.0).to(tl.float32) * factor
    if GROUPED:
        v = tl.where(keep[:, None], v, 0.0)
    if OUT == 0:
        v = bf16_rne(v)
    elif OUT == 1:
        v = v.to(tl.float16)
    tl.store(out_ptr + offs, v, mask=ok)


_SCALE_CAST = FastLaunch(_scale_cast_kernel)


@triton.jit(do_not_specialize=["rows_per_group", "b_col_step"])
def _wgrad_scale_cast_kernel(prod_ptr, a_amax_ptr, b_amax_ptr, empty_ptr, out_ptr, rows_per_group, N, b_col_step,
                             A_R6B: tl.constexpr, B_R6B: tl.constexpr, OUT: tl.constexpr, BF16_BITS: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr):
    """The grouped wgrad's (E*R, N) product, group e owning rows eR..eR+R-1: out[r, c] = prod[r, c] * (fa(e) *
    fb(e, c)), fb(e, c) from b_amax (E,) or (E, N) (b_col_step 0 or 1), +0 for an
    empty group. BF16_BITS: prod is a bf16 product passed as int16, converted by its bits (exact, subnormals
    included, under Triton's interpreter too)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)  # the grid covers the rows exactly (BM divides R)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    in_cols = cols < N
    group = rows // rows_per_group
    keep = tl.load(empty_ptr + group).to(tl.int32) == 0
    fa = tl.load(a_amax_ptr + group) * A_R6B
    # per group: b_amax[e] (b_col_step 0); per group and column: b_amax[e * N + c] (b_col_step 1)
    fb = tl.load(b_amax_ptr + group.to(tl.int64)[:, None] * (1 + (N - 1) * b_col_step) + cols[None, :] * b_col_step,
                 mask=in_cols[None, :], other=0.0) * B_R6B
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    v = tl.load(prod_ptr + offs, mask=in_cols[None, :], other=0)
    if BF16_BITS:
        v = (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    v = v.to(tl.float32) * (fa[:, None] * fb)
    v = tl.where(keep[:, None], v, 0.0)
    if OUT == 0:
        v = bf16_rne(v)
    elif OUT == 1:
        v = v.to(tl.float16)
    tl.store(out_ptr + offs, v, mask=in_cols[None, :])


_WGRAD_SCALE_CAST = FastLaunch(_wgrad_scale_cast_kernel)


@triton.jit(do_not_specialize=["rows", "cols", "limit"])
def _zero_rows_kernel(x_ptr, flag_ptr, rows, cols, limit, BR: tl.constexpr, BC: tl.constexpr):
    """x[r, :] = +0 where flag[r] >= limit; a program none of whose rows is flagged reads BR flags and writes
    nothing."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    zap = (r < rows) & (tl.load(flag_ptr + r, mask=r < rows, other=0).to(tl.int64) >= limit)
    if tl.max(zap.to(tl.int32), axis=0) > 0:
        offs = r.to(tl.int64)[:, None] * cols + c[None, :]
        tl.store(x_ptr + offs, tl.zeros((BR, BC), x_ptr.dtype.element_ty), mask=zap[:, None] & (c < cols)[None, :])


_ZERO_ROWS = FastLaunch(_zero_rows_kernel)
ZERO_BLOCK_ROWS = 16
ZERO_BLOCK_COLS = 1024


def eligible(acc: torch.Tensor) -> bool:
    """Products the epilogue takes: contiguous CUDA (M, N) (or (E, R, N) for the grouped wgrad)."""
    return acc.is_cuda and acc.is_contiguous()


def _launch(acc, a_amax, a_mode, b_amax, group_of_row, a_bound, b_bound, dtype):
    m, n = acc.shape
    out = torch.empty(m, n, dtype=dtype, device=acc.device)
    grid = (cdiv(m, BLOCK_ROWS), cdiv(n, BLOCK_COLS))
    check_grid_y(grid, f"a product of shape {(m, n)}")
    if m and n:
        grouped = group_of_row is not None
        _SCALE_CAST(grid, _SCALE_CAST.Args(
            acc_ptr=acc, a_amax_ptr=a_amax, b_amax_ptr=b_amax, group_ptr=group_of_row if grouped else a_amax,
            out_ptr=out, M=m, N=n, experts=b_amax.numel() if grouped else 1, A_MODE=a_mode, GROUPED=grouped,
            A_R6B=f32_reciprocal(6.0 * a_bound), B_R6B=f32_reciprocal(6.0 * b_bound), OUT=OUT_KIND[dtype],
            BM=BLOCK_ROWS, BN=BLOCK_COLS), num_warps=WARPS, **COMPILE_OPTIONS)
    return out


def scale_cast(acc, a_amax, a_bound: int, b_amax, b_bound: int, dtype):
    """acc (M, N) FP32 * (amax_a/(6B_a) * amax_b/(6B_b)) in dtype; a_amax () or (M,), b_amax ()."""
    return _launch(acc, a_amax, A_ROW if a_amax.dim() else A_TENSOR, b_amax, None, a_bound, b_bound, dtype)


def grouped_scale_cast(prod, a_amax, a_per_group: bool, w_amax, group_of_row, scale_bound: int, dtype,
                       w_bound: int | None = None):
    """prod (M, N) * (fa * fw) per row in dtype, fw of the row's expert (w_amax (E,)), fa per row (a_amax (M,))
    or per group (a_amax (E,), a_per_group); rows whose group_of_row (integer, (M,)) is E or more are +0. B:
    scale_bound for both factors, w_bound for fw where given."""
    return _launch(prod, a_amax, A_GROUP if a_per_group else A_ROW, w_amax, group_of_row, scale_bound,
                   w_bound or scale_bound, dtype)


def grouped_wgrad_scale_cast(prod, a_amax, a_bound: int, b_amax, b_bound: int, empty_groups, dtype):
    """prod (E, R, N) * (fa(e) * fb) in dtype, fa = a_amax[e] * fl(1/(6B_a)), fb per group (b_amax (E,)) or per
    group and column (b_amax (E, N)) times fl(1/(6B_b)); empty groups' slices are +0."""
    experts, r, n = prod.shape
    out = torch.empty(experts, r, n, dtype=dtype, device=prod.device)
    rows_per_program = next(b for b in (BLOCK_ROWS, 8, 4, 2, 1) if r % b == 0)
    grid = (experts * r // rows_per_program, cdiv(n, BLOCK_COLS))
    check_grid_y(grid, f"a product of shape {tuple(prod.shape)}")
    if prod.numel():
        bf16 = prod.dtype == torch.bfloat16
        _WGRAD_SCALE_CAST(grid, _WGRAD_SCALE_CAST.Args(
            prod_ptr=prod.view(torch.int16) if bf16 else prod, a_amax_ptr=a_amax, b_amax_ptr=b_amax,
            empty_ptr=empty_groups, out_ptr=out, rows_per_group=r, N=n, b_col_step=int(b_amax.dim() == 2),
            A_R6B=f32_reciprocal(6.0 * a_bound), B_R6B=f32_reciprocal(6.0 * b_bound), OUT=OUT_KIND[dtype],
            BF16_BITS=bf16, BM=rows_per_program, BN=BLOCK_COLS), num_warps=WARPS, **COMPILE_OPTIONS)
    return out


def zero_rows(x, flag, limit: int):
    """x (R, ...) in place with the rows r where flag[r] >= limit (flag (R,) integer or bool) set to +0; returns x.
    The bf16 grouped backward's rows past offs[-1] (flag: the group of each row, limit E) and its empty groups'
    weight gradients (flag: empty_groups, limit 1): both are rare, so this reads the flags and writes only them,
    where masked_fill_ reads and writes all of x (its broadcast mask also keeps PyTorch off its vectorized path)."""
    rows = x.shape[0]
    cols = x.numel() // rows if rows else 0
    grid = (cdiv(rows, ZERO_BLOCK_ROWS), cdiv(cols, ZERO_BLOCK_COLS))
    check_grid_y(grid, f"a tensor of shape {tuple(x.shape)}")
    if x.numel():
        _ZERO_ROWS(grid, _ZERO_ROWS.Args(x_ptr=x, flag_ptr=flag, rows=rows, cols=cols, limit=limit,
                                         BR=ZERO_BLOCK_ROWS, BC=ZERO_BLOCK_COLS), num_warps=WARPS, **COMPILE_OPTIONS)
    return x
