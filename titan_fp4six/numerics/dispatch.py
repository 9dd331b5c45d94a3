"""Pick a Triton fast path for a CUDA input, else None so the caller runs the reference (same bytes).

The kernels module is imported lazily: numerics never imports Triton on CPU-only machines. Every fallback
is logged at debug level with its reason.
"""

import importlib
import logging

import torch

_log = logging.getLogger(__name__)


def fast_path(x: torch.Tensor, module: str):
    """titan_fp4six.kernels.<module> when its `eligible(x)` accepts x, else None.

    While torch.compile traces, None and no logging (Dynamo cannot trace either): the reference is traced as
    plain PyTorch. Compiled code that wants the kernels calls the custom ops in titan_fp4six.kernels.
    """
    if torch.compiler.is_compiling():
        return None
    if x.device.type != "cuda":
        _log.debug("%s: reference path (x on %s, the kernels need CUDA)", module, x.device)
        return None
    try:
        kernels = importlib.import_module(f"titan_fp4six.kernels.{module}")
    except ImportError as exc:
        _log.debug("%s: reference path (Triton kernels unavailable: %s)", module, exc)
        return None
    if not kernels.eligible(x):
        _log.debug("%s: reference path (x %s %s strides %s not taken by the kernel)", module, x.dtype,
                   tuple(x.shape), x.stride())
        return None
    return kernels
