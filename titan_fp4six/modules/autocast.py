"""AMP semantics for the four-over-six ops.

torchtitan trains single-device and DDP runs under `torch.autocast` (bf16). Autocast does not know the custom
ops, so it would pass fp32 operands through and then recast the GEMMs *inside* them, breaking the emulation's
exact FP32 accumulation. Instead the modules do what autocast does for nn.Linear: cast the floating operands
to the autocast dtype, then run the op with autocast off. Without autocast this is a no-op.
"""

import contextlib

import torch


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in on `device`, or None where it is off (meta has no autocast)."""
    if device.type == "meta" or not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def cast_operands(tensors, dtype: torch.dtype | None) -> list:
    """The tensors with the floating ones cast to `dtype` (None: all as given)."""
    return [t.to(dtype) if dtype is not None and t is not None and t.is_floating_point() else t for t in tensors]


def autocast_operands(*tensors: torch.Tensor | None) -> list:
    """The tensors, cast to the autocast dtype when autocast is on for their device."""
    return cast_operands(tensors, autocast_dtype(next(t for t in tensors if t is not None).device))


def no_autocast(device: torch.device):
    return contextlib.nullcontext() if device.type == "meta" else torch.autocast(device.type, enabled=False)
