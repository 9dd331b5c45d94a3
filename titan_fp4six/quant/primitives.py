"""The quantization primitives' one choice between a Triton kernel and the pure-PyTorch reference: pick.

Each primitive is a table row next to its reference (quantize.py, amax.py, epilogue.py): the reference, the
kernel and the kernel module's predicate that says which inputs it takes (both read from backends.kernels(), the
lazily imported kernel modules, by a function of them: `lambda k: k.amax.row_amax`), the reference called with the
kernel's arguments and returning the same bytes. pick owns the rules every primitive shares: the reference
while torch.compile traces (a graph never looks a kernel up) or for quantizer='reference'; with 'auto' the
kernel where it takes the inputs; with 'triton' (strict) an error where it does not, except for primitives
whose reference is only a slower route to the same exact values (reductions over a layout the kernel skips).
"""

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from .backends import Kernels, kernels

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Primitive:
    """kernel(k)(*args) or reference(*args), the same bytes, k the kernel modules (backends.Kernels). eligible(k):
    the kernel module's predicate of the inputs pick is given; takes: an extra predicate the package adds (e.g.
    contiguous, non-empty); strict=False: inputs the kernel does not take run the reference even for
    quantizer='triton' (an exact reduction: the choice is speed only)."""

    name: str
    reference: Callable
    kernel: Callable[[Kernels], Callable]
    eligible: Callable[[Kernels], Callable[..., bool]]
    takes: Callable[..., bool] | None = None
    strict: bool = True


def pick(primitive: Primitive, quantizer: str, *inputs: torch.Tensor) -> Callable:
    """The function to run `primitive` on `inputs` with a quantizer resolved by backends.resolve_backends."""
    if quantizer == "reference" or torch.compiler.is_compiling():
        return primitive.reference
    k = kernels()
    if primitive.eligible(k)(*inputs) and (primitive.takes is None or primitive.takes(*inputs)):
        return primitive.kernel(k)
    x = inputs[0]
    if quantizer == "triton" and primitive.strict:
        raise ValueError(f"quantizer='triton': the {primitive.name} kernel does not take x {x.dtype} "
                         f"{tuple(x.shape)} strides {x.stride()}; use quantizer='auto' to fall back to the "
                         "reference")
    _log.debug("%s: reference path (x %s %s strides %s not taken by the kernel)", primitive.name, x.dtype,
               tuple(x.shape), x.stride())
    return primitive.reference
