"""Argument checks shared by every quantizer implementation, with errors that say what would be valid."""

import torch

from .formats import BLOCK_SIZE, INPUT_DTYPES, SEED_LIMIT

BLOCKS = ("1x16", "16x16")
ERR_MODES = ("mae", "mse")
SCALE_BOUNDS = (256, 448)


def check_choice(name: str, value, valid) -> None:
    """value must be one of `valid` with the same type: 448.0 == 448 and True == 1 in Python, but a float or a
    bool reaching the kernels as an int knob fails there, so equal values of another type are refused here."""
    if type(value) not in {type(v) for v in valid} or value not in valid:
        kinds = "/".join(sorted({type(v).__name__ for v in valid}))
        raise ValueError(f"{name}={value!r} is not supported; valid values: {', '.join(map(repr, valid))} "
                         f"(type {kinds}; got {type(value).__name__})")


def check_seed(seed) -> None:
    """The Philox seed of a stochastically rounded quantization (docs/numerics.md section 12): an int in
    [0, 2^63)."""
    if not (type(seed) is int and 0 <= seed < SEED_LIMIT):
        raise ValueError(f"a spec with rounding='stochastic' needs a seed, an int in [0, 2^63); got {seed!r}")


def check_float_tensor(t, name: str) -> None:
    """A tensor of one of the quantizers' input dtypes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; valid: bfloat16, float16, float32")


def check_input(x: torch.Tensor, name: str = "x") -> None:
    check_float_tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, cols), got shape {tuple(x.shape)}")
    if x.shape[1] % BLOCK_SIZE:
        raise ValueError(f"{name} has {x.shape[1]} columns; NVFP4 needs a multiple of {BLOCK_SIZE}")


def check_codes(codes) -> None:
    """Packed codes: 2-D uint8 (R, C/2) of a C that is a multiple of 16, so a width that is a multiple of 8."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.dim() != 2:
        got = f"{codes.dtype} {tuple(codes.shape)}" if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise TypeError(f"codes must be 2-D uint8 (R, C/2), got {got}")
    if codes.shape[1] % (BLOCK_SIZE // 2):
        raise ValueError(f"codes has shape {tuple(codes.shape)}; packed codes are (R, C/2) with C a multiple of "
                         f"{BLOCK_SIZE}, so the width must be a multiple of {BLOCK_SIZE // 2}")


def check_amax(amax: torch.Tensor, x: torch.Tensor, block: str, read_values: bool = True) -> None:
    """amax is an FP32 scalar (per-tensor) or an FP32 vector of length R (row-scaled) on x's device;
    read_values=False skips the one check that reads amax's values (fake tensors under tracing have none)."""
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be an FP32 torch.Tensor, got {type(amax).__name__}")
    if amax.dtype != torch.float32:
        raise TypeError(f"amax.dtype={amax.dtype}; amax must be float32")
    if amax.device != x.device:
        raise ValueError(f"amax is on {amax.device} but x is on {x.device}; put both on one device")
    rows = x.shape[0]
    if amax.dim() == 0:
        return
    if amax.shape != (rows,):
        raise ValueError(
            f"amax has shape {tuple(amax.shape)}; valid: () for per-tensor or ({rows},) for one amax per row")
    if block == "16x16" and rows and read_values:
        check_tile_uniform(amax)


_TILE_UNIFORM_MSG = ("row-scaled amax with block='16x16' must be equal over every 16-row tile (e.g. one amax per "
                     "expert, N a multiple of 16); use block='1x16' for per-row amax")


def check_rows_for_block(x: torch.Tensor, block: str) -> None:
    if block == "16x16" and x.shape[0] % BLOCK_SIZE:
        raise ValueError(f"block='16x16' needs rows that are a multiple of {BLOCK_SIZE}, got {x.shape[0]} rows")


def check_tile_uniform(amax: torch.Tensor) -> None:
    """Raise unless a row amax (R,) is bitwise constant over each 16-row tile (a NaN tile counts as uniform): the
    16x16 kernels read a tile row's first amax for the whole tile.

    On CUDA, and while torch.compile traces, an asynchronous device assert: a host-side check would synchronize
    on every grouped forward with 16x16 expert weights, and a Python branch on a value would break the graph."""
    bits = amax.view(torch.int32).view(-1, BLOCK_SIZE)
    uniform = (bits == bits[:, :1]).all()
    if amax.is_cuda or torch.compiler.is_compiling():
        torch._assert_async(uniform, _TILE_UNIFORM_MSG)
    elif not uniform:
        raise ValueError(_TILE_UNIFORM_MSG)


NEGATIVE_AMAX_MSG = ("amax must be >= 0 (a negative amax stores negative E4M3 scales); pass tensor_amax(x) or "
                     "row_amax(x)")
SMALL_AMAX_MSG = ("amax is below max |x| of the data (per row for a row amax): larger values would saturate "
                  "silently; pass tensor_amax(x) / row_amax(x) or a larger amax")


def check_amax_covers(x: torch.Tensor, amax: torch.Tensor) -> None:
    """The public quantizers' amax check: raise unless amax >= 0 and every |x| <= amax (its row's amax for a row
    amax). NaN elements and a NaN amax pass (NaN propagates through the quantizers); a NaN elsewhere does not
    excuse a finite value above amax, which would saturate. On CUDA, and while torch.compile traces, asynchronous
    device asserts (no host sync; a Python branch on a value would break the graph). The Triton quantizer checks
    the same rule per block in its own read of x (kernels/quantize.py, CHECK_AMAX)."""
    bound = amax if amax.dim() == 0 else amax[:, None]
    negative, below = (amax < 0).any(), (x.abs() > bound).any()
    if amax.is_cuda or torch.compiler.is_compiling():
        torch._assert_async(~negative, NEGATIVE_AMAX_MSG)
        torch._assert_async(~below, SMALL_AMAX_MSG)
    elif negative:
        raise ValueError(NEGATIVE_AMAX_MSG)
    elif below:
        raise ValueError(SMALL_AMAX_MSG)


def check_quantize_args(x, amax, block: str, err_mode: str, scale_bound: int, read_values: bool = True) -> None:
    check_choice("block", block, BLOCKS)
    check_choice("err_mode", err_mode, ERR_MODES)
    check_choice("scale_bound", scale_bound, SCALE_BOUNDS)
    check_input(x)
    check_rows_for_block(x, block)
    check_amax(amax, x, block, read_values)
