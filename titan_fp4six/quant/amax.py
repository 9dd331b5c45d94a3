"""FP32 amax per tensor, per row and per token group (real rows only), all without a host sync.

max |x| is exact, so the Triton reductions and the reference agree bit for bit (NaN included); which one runs is
primitives.pick's choice.
"""

import torch

from ..numerics.reference import row_amax_reference, tensor_amax_reference
from .primitives import Primitive, pick


def check_offs_values(offs: torch.Tensor, rows: int, name: str = "A") -> None:
    """Value checks of offs, shared by the grouped GEMMs and the public group_amax; they read the values, so they run
    where that costs no device sync (CPU)."""
    if offs.device.type != "cpu" or offs.numel() == 0:
        return
    if bool((offs[0] < 0) | (torch.diff(offs) < 0).any()):
        raise ValueError(f"offs must be non-negative and non-decreasing (inclusive group ends), got {offs.tolist()}")
    if int(offs[-1]) > rows:
        raise ValueError(f"offs[-1]={int(offs[-1])} exceeds the {rows} rows of {name}")


def _dense_amaxes_reference(x: torch.Tensor, w: torch.Tensor, row_scaled: bool) -> torch.Tensor:
    x_amax = row_amax_reference(x) if row_scaled else tensor_amax_reference(x).view(1)
    return torch.cat((x_amax, tensor_amax_reference(w).view(1)))


def _token_groups_reference(x: torch.Tensor, offs: torch.Tensor,
                            per_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    group = group_index(offs, x.shape[0])
    empty = torch.cat((offs[:1], offs.diff())) == 0
    rows = row_amax_reference(x)
    if per_row:
        return torch.where(group < offs.numel(), rows, 0.0), group, empty
    # Rows that are not tokens land in the extra bucket E, which is dropped: garbage or NaN there never leaks.
    buckets = torch.zeros(offs.numel() + 1, dtype=torch.float32, device=x.device)
    return buckets.scatter_reduce(0, group, rows, reduce="amax", include_self=True)[:-1], group, empty


def token_groups_amax_reference(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """max |x| per token group (E,) of x's rows by inclusive group ends offs (rows at or past offs[-1] dropped)."""
    return _token_groups_reference(x, offs, False)[0]


def _rows_taken(x: torch.Tensor) -> bool:
    return x.numel() > 0 and x.stride(-1) == 1


# Exact reductions: where a kernel skips a layout the reference gives the same values (strict=False).
TENSOR_AMAX = Primitive("tensor amax", tensor_amax_reference, lambda k: k.amax.tensor_amax, lambda k: k.amax.eligible,
                        takes=lambda x: x.numel() > 0 and x.is_contiguous(), strict=False)
DENSE_AMAXES = Primitive("dense amaxes", _dense_amaxes_reference, lambda k: k.amax.dense_amaxes,
                         lambda k: k.amax.eligible, takes=lambda x, w: x.is_contiguous() and w.is_contiguous(),
                         strict=False)
ROW_AMAX = Primitive("row amax", row_amax_reference, lambda k: k.amax.row_amax, lambda k: k.amax.eligible,
                     takes=_rows_taken, strict=False)
TOKEN_GROUPS = Primitive("token groups", _token_groups_reference, lambda k: k.amax.token_groups,
                         lambda k: k.amax.eligible, takes=_rows_taken, strict=False)


def run_tensor_amax(x: torch.Tensor, quantizer: str) -> torch.Tensor:
    """max |x| over the whole tensor as an FP32 scalar tensor (NaN propagates, 0 when empty)."""
    return pick(TENSOR_AMAX, quantizer, x)(x)


def run_dense_amaxes(x: torch.Tensor, w: torch.Tensor, row_scaled: bool, quantizer: str) -> torch.Tensor:
    """A dense GEMM's amaxes in one FP32 vector: max |x| (one, or one per row when row_scaled) then max |w|;
    per-tensor, one kernel launch computes both."""
    return pick(DENSE_AMAXES, quantizer, x, w)(x, w, row_scaled)


def run_row_amax(x: torch.Tensor, quantizer: str) -> torch.Tensor:
    """max |x| of each row of a 2-D tensor as an FP32 vector of length R."""
    return pick(ROW_AMAX, quantizer, x)(x)


def run_expert_amax(w: torch.Tensor, experts: int, quantizer: str) -> torch.Tensor:
    """Per-expert max |w| (E,) of expert weights flattened to (E*N, K): the max of each expert's row amaxes (one
    read of the weights, no |w| copy)."""
    return run_row_amax(w, quantizer).view(experts, -1).amax(dim=1)


def run_token_groups(x: torch.Tensor, offs: torch.Tensor, per_row: bool,
                     quantizer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A grouped GEMM's A by token group: (max |x| per row (R,), 0 for the rows at or past offs[-1], which are
    not tokens: whatever they hold, NaN included, never reaches an amax; or with per_row=False per group (E,),
    0 for empty groups; each row's group (group_index); which groups are empty (bool (E,))). One launch on
    CUDA. offs: inclusive group ends (int32, non-decreasing, non-empty)."""
    offs = offs.contiguous()  # the kernel reads it as one vector (a no-op for the ops' offs)
    return pick(TOKEN_GROUPS, quantizer, x)(x, offs, per_row)


def group_index(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Group id of every row given inclusive group ends `offs`; rows at or past offs[-1] get len(offs)."""
    positions = torch.arange(rows, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, positions, right=True)


def run_column_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each column of a 2-D tensor (C,) (0 with no rows): the per-row amax of x^T, which the quantized
    backward's row-scaled x^T takes (a PyTorch reduction, exact and NaN-propagating on every device)."""
    return row_amax_reference(x.t())


def run_group_column_amax(x: torch.Tensor, group_of_row: torch.Tensor, n_groups: int) -> torch.Tensor:
    """max |x| per token group and column (G, C) of a grouped GEMM's A (rows by group_index; rows at and past
    offs[-1], group n_groups, are dropped; 0 for empty groups). NaN propagates: flagged on its own, since a
    scatter's amax need not propagate it on every device."""
    ax = x.abs().float()
    index = group_of_row[:, None].expand_as(ax)
    buckets = ax.new_zeros(n_groups + 1, x.shape[1])
    amax = buckets.scatter_reduce(0, index, ax, reduce="amax", include_self=True)
    nan = buckets.scatter_reduce(0, index, ax.isnan().float(), reduce="amax", include_self=True)
    return torch.where(nan > 0, float("nan"), amax)[:-1]
