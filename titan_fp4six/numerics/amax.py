"""FP32 amax helpers: per tensor, per row, and per token group (real rows only), all without a host sync."""

import torch

from .dispatch import fast_path


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor as an FP32 scalar tensor (NaN propagates). One read of x on CUDA.
    An empty x (zero tokens) has amax 0, like an empty row group (torch's amax refuses empty inputs)."""
    if not x.numel():
        return torch.zeros((), dtype=torch.float32, device=x.device)
    kernels = fast_path(x, "amax") if x.is_contiguous() else None
    return kernels.tensor_amax(x) if kernels else x.abs().amax().float()


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of a 2-D tensor as an FP32 vector of length R. One read of x on CUDA."""
    kernels = fast_path(x, "amax") if x.dim() == 2 and x.numel() and x.stride(-1) == 1 else None
    return kernels.row_amax(x) if kernels else x.abs().amax(dim=-1).float()


def group_index(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Group id of every row given inclusive group ends `offs`; rows at or past offs[-1] get len(offs)."""
    positions = torch.arange(rows, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, positions, right=True)


def group_amax(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """max |x| over the rows of each token group; rows past offs[-1] are never read into any group.

    `offs` holds inclusive group ends (length E, int32, non-decreasing). Empty groups get 0.
    Returns an FP32 vector of length E.
    """
    num_groups = offs.numel()
    per_row = row_amax(x)
    idx = group_index(offs, x.shape[0]).long()
    out = torch.zeros(num_groups + 1, dtype=torch.float32, device=x.device)
    # Tail rows land in the extra bucket num_groups, which is dropped: garbage or NaN there never leaks.
    out = out.scatter_reduce(0, idx, per_row, reduce="amax", include_self=True)
    return out[:num_groups]
