"""The emulated GEMMs' epilogue (product x global decode factors -> output dtype): kernel or reference."""

import torch

from ..numerics.reference import grouped_scale_cast_reference, grouped_wgrad_scale_cast_reference, scale_cast_reference
from .backend import kernels_for


def run_scale_cast(acc: torch.Tensor, a_amax: torch.Tensor, a_bound: int, b_amax: torch.Tensor, b_bound: int,
                   dtype, quantizer: str) -> torch.Tensor:
    """acc (M, N) FP32 * (amax_a/(6B_a) * amax_b/(6B_b)) cast to dtype; a_amax () or (M,), b_amax ()."""
    kernels = kernels_for(acc, quantizer, "epilogue")
    if kernels is not None:
        return kernels.scale_cast(acc, a_amax, a_bound, b_amax, b_bound, dtype)
    return scale_cast_reference(acc, a_amax, a_bound, b_amax, b_bound, dtype)


def run_grouped_scale_cast(prod: torch.Tensor, a_amax: torch.Tensor, a_per_group: bool, w_amax: torch.Tensor,
                           group_of_row: torch.Tensor, scale_bound: int, dtype, quantizer: str,
                           w_bound: int | None = None):
    """prod (M, N) * (fa * fw) per row cast to dtype, zeros past offs[-1] (grouped_scale_cast_reference; w_bound:
    the weights' B where it differs from the activations')."""
    kernels = kernels_for(prod, quantizer, "epilogue")
    if kernels is not None:
        return kernels.grouped_scale_cast(prod, a_amax, a_per_group, w_amax, group_of_row, scale_bound, dtype,
                                          w_bound)
    return grouped_scale_cast_reference(prod, a_amax, a_per_group, w_amax, group_of_row, scale_bound, dtype, w_bound)


def run_grouped_wgrad_scale_cast(prod: torch.Tensor, a_amax: torch.Tensor, a_bound: int, b_amax: torch.Tensor,
                                 b_bound: int, empty_groups: torch.Tensor, dtype, quantizer: str) -> torch.Tensor:
    """The grouped weight-gradient GEMM's epilogue, prod (E, R, N) (grouped_wgrad_scale_cast_reference): one
    pass of the kernel where PyTorch makes four over an FP32 copy of the product."""
    kernels = kernels_for(prod, quantizer, "epilogue")
    if kernels is not None:
        return kernels.grouped_wgrad_scale_cast(prod, a_amax, a_bound, b_amax, b_bound, empty_groups, dtype)
    return grouped_wgrad_scale_cast_reference(prod, a_amax, a_bound, b_amax, b_bound, empty_groups, dtype)
