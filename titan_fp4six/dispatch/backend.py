"""Where a quantizer call runs: a Triton kernel or the pure-PyTorch reference. Both give the same bytes.

The choice is the recipe knob `quantizer` (QUANTIZERS): "auto" takes the kernel where it applies (a CUDA input
in a layout the kernel reads) and the reference elsewhere, "triton" demands the kernel (an error where it
cannot run), "reference" always runs the reference. The environment variable QUANTIZER_ENV, when set,
overrides the knob for the whole process (for A/B runs without editing a recipe). This module is the only
place that imports titan_fp4six.kernels; it does so lazily, so CPU-only code never loads Triton.
"""

import functools
import logging
import os

import torch

QUANTIZERS = ("auto", "triton", "reference")
QUANTIZER_ENV = "TITAN_FP4SIX_QUANTIZER"

_log = logging.getLogger(__name__)


def quantizer_choice(quantizer: str) -> str:
    """The knob value in force: QUANTIZER_ENV when set (checked), else `quantizer`."""
    override = os.environ.get(QUANTIZER_ENV)
    if override is None:
        return quantizer
    if override not in QUANTIZERS:
        raise ValueError(f"{QUANTIZER_ENV}={override!r} is not supported; valid values: {', '.join(QUANTIZERS)}")
    return override


@functools.cache
def _kernel_module(name: str):
    """The kernels module `name`, or the ImportError that says why not (cached either way)."""
    try:
        if name == "quantize":
            from ..kernels import quantize as module
        elif name == "decode":
            from ..kernels import decode as module
        elif name == "epilogue":
            from ..kernels import epilogue as module
        else:
            from ..kernels import amax as module
    except ImportError as exc:
        return exc
    return module


def kernels_for(x: torch.Tensor, quantizer: str, name: str, *more: torch.Tensor, check: str = "eligible"):
    """The kernels module `name` ("quantize", "amax", "decode", "epilogue") to run on x (and `more` inputs), or
    None for the reference. `check` names the module's predicate that must accept the inputs.

    Never called while torch.compile traces: the public entry points are custom ops there (library.py).
    """
    choice = quantizer_choice(quantizer)
    if choice == "reference":
        return None
    strict = choice == "triton"
    if x.device.type != "cuda":
        if strict:
            raise ValueError(f"quantizer='triton' needs CUDA tensors, got x on {x.device}; use quantizer='auto' "
                             "or 'reference'")
        return None
    module = _kernel_module(name)
    if isinstance(module, ImportError):
        if strict:
            raise RuntimeError(f"quantizer='triton': the Triton kernels cannot be imported ({module})")
        _log.debug("%s: reference path (Triton kernels unavailable: %s)", name, module)
        return None
    if not getattr(module, check)(x, *more):
        if strict:
            raise ValueError(f"quantizer='triton': the {name} kernel does not take x {x.dtype} {tuple(x.shape)} "
                             f"strides {x.stride()}; use quantizer='auto' to fall back to the reference")
        _log.debug("%s: reference path (x %s %s strides %s not taken by the kernel)", name, x.dtype, tuple(x.shape),
                   x.stride())
        return None
    return module
