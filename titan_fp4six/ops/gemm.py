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
import os

import torch

from ..numerics.reference import global_decode_factor
from . import blackwell
from .operands import Operand

log = logging.getLogger(__name__)

EMULATE_ENV = "TITAN_FP4SIX_EMULATE"


def fp4_gemms(device: torch.device, gemm: str) -> bool:
    """Whether the real NVFP4 GEMMs run (recipe knob `gemm`; EMULATE_ENV=1 forces emulation everywhere)."""
    if gemm == "emulated" or os.environ.get(EMULATE_ENV) == "1":
        return False
    if gemm == "fp4":
        blackwell.require(device)
        return True
    return blackwell.available(device)


def decode_on(device: torch.device, gemm: str) -> bool:
    """Whether the quantizers should also produce the bf16 decode (fused) for an emulated GEMM."""
    return not fp4_gemms(device, gemm)


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


def _combined(a_factor: torch.Tensor, b_factor: torch.Tensor) -> torch.Tensor:
    """amax_a/(6B) * amax_b/(6B), per row of the output when a_factor is per row."""
    return (a_factor[:, None] if a_factor.dim() else a_factor) * b_factor


def row_split(amax_rows: torch.Tensor, scale_bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fl(1/(6B)) as a 0-d tensor, the raw amaxes): the two parts of the per-row factors amax_r * fl(1/(6B))
    that the Blackwell row-scaled GEMMs apply separately."""
    return global_decode_factor(amax_rows.new_ones(()), scale_bound), amax_rows


def gemm_nt(a: Operand, a_factor: torch.Tensor, b: Operand, b_factor: torch.Tensor, out_dtype, gemm: str,
            a_row_split: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """a (M, K) x b (N, K)^T -> (M, N) in out_dtype; a_factor () or (M,), b_factor (); a_row_split =
    row_split(...) of a per-row a_factor (the Blackwell kernel's form of it; the emulation uses a_factor)."""
    fp4 = out_dtype == torch.bfloat16 and fp4_gemms(a.codes.device, gemm)
    if fp4 and a_factor.dim() == 0:
        return blackwell.scaled_mm_nt(a, a_factor, b, b_factor, out_dtype)
    if fp4 and a_row_split is not None:
        return blackwell.scaled_mm_nt_row_scaled(a, *a_row_split, b, b_factor, out_dtype)
    acc = mm_f32(a.block_scaled(), b.block_scaled().t())
    return (acc * _combined(a_factor, b_factor)).to(out_dtype)


def grouped_gemm_nt(a: Operand, a_factor_rows: torch.Tensor, a_factor_groups: torch.Tensor | None, w: Operand,
                    w_factor: torch.Tensor, offs: torch.Tensor, group_of_row: torch.Tensor, out_dtype,
                    gemm: str, a_row_split: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """A (M, K) grouped by offs x expert weights w (E*N, K) -> (M, N); rows past offs[-1] are zeros.

    a_factor_rows (M,) is every row's activation factor; a_factor_groups (E,) the same per group when the
    activations are per-group scaled (None when row-scaled, which passes a_row_split = row_split(...) for
    Blackwell instead); w_factor (E,) per expert.
    """
    experts = w_factor.numel()
    valid = group_of_row < experts
    fp4 = out_dtype == torch.bfloat16 and fp4_gemms(a.codes.device, gemm)
    if fp4 and a_factor_groups is not None:
        out = blackwell.scaled_grouped_mm_nt(a, a_factor_groups, w, w_factor, offs, experts, out_dtype)
        return torch.where(valid[:, None], out, 0)
    if fp4 and a_row_split is not None:
        out = blackwell.scaled_grouped_mm_nt_row_scaled(a, *a_row_split, w, w_factor, offs, experts, out_dtype)
        return torch.where(valid[:, None], out, 0)
    w_dec = w.block_scaled().view(experts, -1, w.codes.shape[1] * 2)
    prod = torch._grouped_mm(a.block_scaled(), w_dec.transpose(-2, -1), offs=offs)  # bf16: the extra rounding
    w_rows = torch.cat([w_factor, w_factor.new_zeros(1)])[group_of_row]
    scaled = prod.float() * (a_factor_rows * w_rows)[:, None]
    return torch.where(valid[:, None], scaled, 0).to(out_dtype)  # _grouped_mm leaves tail rows uninitialized
