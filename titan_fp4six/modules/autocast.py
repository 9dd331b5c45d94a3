"""AMP semantics for the four-over-six ops.

torchtitan trains single-device and DDP runs under `torch.autocast` (bf16). Autocast does not know the custom
ops, so it would pass fp32 operands through and then recast the GEMMs *inside* them, breaking the emulation's
exact FP32 accumulation. Instead the modules do what autocast does for nn.Linear: cast the floating operands
to the autocast dtype, then run the op with autocast off. Without autocast this is a no-op.
"""

import contextlib

import torch


def autocast_operands(*tensors: torch.Tensor | None) -> list:
    """The tensors, cast to the autocast dtype when autocast is on for their device (meta has no autocast)."""
    device = next(t for t in tensors if t is not None).device.type
    if device == "meta" or not torch.is_autocast_enabled(device):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]


def no_autocast(device: torch.device):
    return contextlib.nullcontext() if device.type == "meta" else torch.autocast(device.type, enabled=False)
