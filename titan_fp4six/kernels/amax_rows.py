"""How the quantizer and the decode kernels read each row's global amax: per tensor, per row, per run of rows
(an expert's) or per token group (numerics.reference.amax_per_row is the rule), so one compiled kernel serves
every layout."""

from typing import NamedTuple

import torch
import triton
import triton.language as tl


@triton.jit
def load_row_amax(amax_ptr, group_ptr, rows, R, amax_div, n_groups, GROUPS: tl.constexpr, BY_GROUP: tl.constexpr):
    """(each row's global amax, whether the row is data), as numerics.reference.amax_per_row maps them:
    amax_ptr[row // amax_div] (amax_div consecutive rows share a value: 1 per row, R per tensor, N per expert)
    or, BY_GROUP, amax_ptr[the row's group]; with GROUPS, rows whose group (int64 at group_ptr) is n_groups or
    more are not data and get amax 0, as do rows at or past R."""
    if GROUPS:
        group = tl.load(group_ptr + rows, mask=rows < R, other=n_groups)
        data = group < n_groups
    else:
        data = rows < R
    if BY_GROUP:
        index = group
    else:
        index = rows // amax_div
    return tl.load(amax_ptr + index, mask=data, other=0.0), data


class AmaxLayout(NamedTuple):
    """load_row_amax's arguments for an amax of shape () or (G,) and optional RowGroups, as
    numerics.reference.amax_per_row reads them (group_ptr is any tensor when not `groups`)."""
    group_ptr: torch.Tensor
    amax_div: int
    n_groups: int
    groups: bool
    by_group: bool

    @staticmethod
    def of(amax: torch.Tensor, rows: int, groups=None) -> "AmaxLayout":
        if groups is not None:
            return AmaxLayout(groups.group_of_row, 1, groups.n_groups, True, groups.amax_by_group)
        return AmaxLayout(amax, max(rows, 1) if amax.dim() == 0 else rows // amax.numel(), 0, False, False)
