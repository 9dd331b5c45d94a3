"""The NVFP4 GEMMs behind the ops: real FP4 kernels on Blackwell, the spec's emulation everywhere else.

Emulation (docs/numerics.md, section 8): each operand decoded with its block scales only (e2m1 * E4M3 scale
is exact in bf16), a GEMM of those bf16 values with FP32 accumulation, then the FP32 product multiplied by
amax_a/(6B) * amax_b/(6B) (that product first) and cast to the output dtype.

The grouped GEMM goes through torch._grouped_mm, whose bf16 output is rounded to bf16 before the global
factors are applied: one extra bf16 rounding of the product (relative error <= 2^-9) compared with the
dense path and with the Blackwell kernel, which applies the factors to the FP32 accumulator.
"""

import functools
import logging

import torch

from ..numerics.reference import global_decode_factor
from ..quant.backends import Backends
from ..quant.epilogue import GROUPED_SCALE_CAST, GROUPED_WGRAD_SCALE_CAST, SCALE_CAST
from ..quant.operands import Operand
from ..quant.primitives import pick
from . import blackwell

log = logging.getLogger(__name__)

@functools.cache
def _cuda_mm_out_fp32(device: torch.device) -> bool:
    try:
        probe = torch.zeros(16, 16, dtype=torch.bfloat16, device=device)
        torch.mm(probe, probe, out_dtype=torch.float32)
        return True
    except (RuntimeError, TypeError) as err:  # numerically equivalent fallback below
        log.debug("torch.mm(out_dtype=float32) unavailable on %s (%s); using an FP32 GEMM of the exact values",
                  device, err)
        return False


def mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """FP32-accumulated product of two exactly-bf16 matrices, returned in FP32 (no bf16 rounding of the result).

    On CUDA a bf16 GEMM with FP32 output; elsewhere an FP32 GEMM of the same (exactly representable) values.
    """
    if a.is_cuda and _cuda_mm_out_fp32(a.device):
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


def row_split(amax_rows: torch.Tensor, scale_bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fl(1/(6B)) as a 0-d tensor, the raw amaxes): the two parts of the per-row factors amax_r * fl(1/(6B))
    that the Blackwell row-scaled GEMMs apply separately."""
    return global_decode_factor(amax_rows.new_ones(()), scale_bound), amax_rows


def gemm_nt(a: Operand, a_amax: torch.Tensor, a_bound: int, b: Operand, b_amax: torch.Tensor, b_bound: int,
            out_dtype, backends: Backends) -> torch.Tensor:
    """a (M, K) x b (N, K)^T -> (M, N) in out_dtype, with the global decode factors amax/(6B) of each side:
    a_amax () or (M,) (row-scaled), b_amax (); `backends` choose the kernels."""
    if out_dtype == torch.bfloat16 and backends.fp4:
        b_factor = global_decode_factor(b_amax, b_bound)
        if a_amax.dim() == 0:
            return blackwell.scaled_mm_nt(a, global_decode_factor(a_amax, a_bound), b, b_factor, out_dtype)
        return blackwell.scaled_mm_nt_row_scaled(a, *row_split(a_amax, a_bound), b, b_factor, out_dtype)
    acc = mm_f32(a.block_scaled(backends.quantizer), b.block_scaled(backends.quantizer).t())
    return pick(SCALE_CAST, backends.quantizer, acc)(acc, a_amax, a_bound, b_amax, b_bound, out_dtype)


def grouped_gemm_nt(a: Operand, a_amax: torch.Tensor, a_per_group: bool, w: Operand, w_amax: torch.Tensor,
                    offs: torch.Tensor, group_of_row: torch.Tensor, scale_bound: int, out_dtype,
                    backends: Backends, w_bound: int | None = None) -> torch.Tensor:
    """A (M, K) grouped by offs x expert weights w (E*N, K) -> (M, N); rows past offs[-1] are zeros.

    a_amax is per row (M,) (row-scaled) or per group (E,) (a_per_group), w_amax (E,) per expert; every factor
    is amax/(6B) with B = scale_bound (both operands', or w_bound for the weights' where given). The emulation
    takes w's decode as (E*N, K) or as an (E, N, K) view (the quantized backward's transposed weight tiles).
    """
    experts = w_amax.numel()
    w_bound = w_bound or scale_bound
    if out_dtype == torch.bfloat16 and backends.fp4:
        w_factor = global_decode_factor(w_amax, w_bound)
        if a_per_group:
            out = blackwell.scaled_grouped_mm_nt(a, global_decode_factor(a_amax, scale_bound), w, w_factor,
                                                 offs, experts, out_dtype)
        else:
            out = blackwell.scaled_grouped_mm_nt_row_scaled(a, *row_split(a_amax, scale_bound), w, w_factor,
                                                            offs, experts, out_dtype)
        return torch.where((group_of_row < experts)[:, None], out, 0)
    w_dec = w.block_scaled(backends.quantizer)
    w_dec = w_dec.view(experts, -1, w_dec.shape[-1])
    # bf16 output: the extra rounding
    prod = torch._grouped_mm(a.block_scaled(backends.quantizer), w_dec.transpose(-2, -1), offs=offs)
    epilogue = pick(GROUPED_SCALE_CAST, backends.quantizer, prod)  # _grouped_mm leaves tail rows uninitialized: 0
    return epilogue(prod, a_amax, a_per_group, w_amax, group_of_row, scale_bound, out_dtype, w_bound)


def grouped_wgrad_nt(a: Operand, a_amax: torch.Tensor, a_bound: int, b: Operand, b_amax: torch.Tensor, b_bound: int,
                     token_offs: torch.Tensor, empty_groups: torch.Tensor, out_dtype,
                     backends: Backends) -> torch.Tensor:
    """The grouped weight gradient: a (R, P) x b (C, P)^T per token group -> (E, R, C) in out_dtype, the
    contraction over each group's tokens: columns token_offs[e-1]:token_offs[e] of both operands (groups padded
    to 16-token blocks, zero columns). Factors amax/(6B): a_amax (E,) per group, b_amax (E,) per group or (E, C)
    per group and row of b; empty groups' gradients are zeros.

    Always emulated, on Blackwell too: the FP4 kernels' grouped form here (scaled_grouped_mm) groups the rows of
    A, not the contraction dimension, so this product is the emulation's on every device (docs/ops.md): the
    decodes' product in bf16 (torch._grouped_mm, FP32 accumulation, the grouped GEMMs' extra bf16 rounding),
    then the factors."""
    prod = torch._grouped_mm(a.block_scaled(backends.quantizer), b.block_scaled(backends.quantizer).t(),
                             offs=token_offs)
    epilogue = pick(GROUPED_WGRAD_SCALE_CAST, backends.quantizer, prod)
    return epilogue(prod, a_amax, a_bound, b_amax, b_bound, empty_groups, out_dtype)
