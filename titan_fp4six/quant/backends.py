"""Where the quantizers and GEMMs run, chosen once per recipe and device: resolve_backends.

The quantizer implementation (QUANTIZERS: a Triton kernel or the pure-PyTorch reference, same bytes) and the
GEMM implementation (GEMMS: real NVFP4 GEMMs on Blackwell or the emulation) are recipe knobs; the environment
variables QUANTIZER_ENV and EMULATE_ENV override them for the whole process (A/B runs without editing a
recipe). resolve_backends (through environment_overrides) is the package's only environment read;
backends_for stores its answer per knobs and device, so the per-call path reads no environment and re-checks
no knob. This module is the only place that imports titan_fp4six.kernels; it does so lazily (kernels()), so
CPU-only code never loads Triton. Which kernel runs on which input is primitives.pick's choice.
"""

import functools
import logging
import os
from types import ModuleType
from typing import NamedTuple

import torch
import torch.nn.functional as F

QUANTIZERS = ("auto", "triton", "reference")
GEMMS = ("auto", "emulated", "fp4")
QUANTIZER_ENV = "TITAN_FP4SIX_QUANTIZER"
EMULATE_ENV = "TITAN_FP4SIX_EMULATE"
EMULATE_VALUES = ("1", "0", "")

_log = logging.getLogger(__name__)


class Backends(NamedTuple):
    """Resolved implementations for one device. quantizer: 'reference', 'auto' (CUDA: the kernel wherever it
    takes the input's layout, else the reference) or 'triton' (CUDA: the kernel, an error for a layout it does
    not take); fp4: whether the real NVFP4 GEMMs run (else the emulation, fed the quantizers' bf16 decode)."""

    quantizer: str
    fp4: bool


@functools.cache
def _capability_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def fp4_available(device: torch.device) -> bool:
    """True on a compute-capability-10 GPU with torch's NVFP4 scaled GEMMs. Gated strictly on major == 10:
    NVFP4 scaled_grouped_mm on Hopper launches a Blackwell kernel that corrupts the CUDA context."""
    if device.type != "cuda":
        return False
    return _capability_major(device) == 10 and hasattr(F, "scaled_mm") and hasattr(F, "scaled_grouped_mm")


def require_fp4(device: torch.device) -> None:
    """Raise unless the real NVFP4 GEMMs can run on `device` (the recipe asked for gemm='fp4')."""
    if not fp4_available(device):
        what = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise ValueError(f"gemm='fp4' needs a Blackwell GPU (compute capability 10.x) and torch's NVFP4 "
                         f"scaled_mm / scaled_grouped_mm; {what} has none: use gemm='auto' or 'emulated'")


def environment_overrides() -> tuple[str | None, bool]:
    """(QUANTIZER_ENV's quantizer or None, whether EMULATE_ENV=1 forces emulated GEMMs), checked: a bad value is
    an error, never ignored ("true" once silently ran the real kernels). The package's only environment read
    (the launchers call it at start-up to fail early)."""
    quantizer = os.environ.get(QUANTIZER_ENV)
    if quantizer is not None and quantizer not in QUANTIZERS:
        raise ValueError(f"{QUANTIZER_ENV}={quantizer!r} is not supported; valid values: {', '.join(QUANTIZERS)}")
    emulate = os.environ.get(EMULATE_ENV, "")
    if emulate not in EMULATE_VALUES:
        raise ValueError(f"{EMULATE_ENV}={emulate!r} is not supported; valid values: '1' (emulate every GEMM), '0' "
                         "or unset (the recipe's gemm knob decides)")
    return quantizer, emulate == "1"


def resolve_backends(quantizer: str, gemm: str, device: torch.device) -> Backends:
    """The implementations the knobs `quantizer` and `gemm` name on `device`, after the environment overrides;
    an implementation the knob requires but the device lacks is an error here, not at a later call."""
    override, emulate = environment_overrides()
    quantizer = override or quantizer
    if quantizer != "reference":
        quantizer = _kernels_or_reference(quantizer == "triton", device)
    if emulate or gemm == "emulated":
        return Backends(quantizer, False)
    if gemm == "fp4":
        require_fp4(device)
        return Backends(quantizer, True)
    return Backends(quantizer, fp4_available(device))


def _kernels_or_reference(strict: bool, device: torch.device) -> str:
    """'triton' (strict) or 'auto' where the kernels can run on `device`, else 'reference' (an error if strict)."""
    if device.type != "cuda":
        if strict:
            raise ValueError(f"quantizer='triton' needs CUDA tensors, got x on {device}; use quantizer='auto' or "
                             "'reference'")
        return "reference"
    loaded = kernels()
    if isinstance(loaded, ImportError):
        if strict:
            raise RuntimeError(f"quantizer='triton': the Triton kernels cannot be imported ({loaded})")
        _log.debug("reference path (Triton kernels unavailable: %s)", loaded)
        return "reference"
    return "triton" if strict else "auto"


backends_for = functools.cache(resolve_backends)
"""resolve_backends, stored per (quantizer, gemm, device): what every call after a device's first reads."""


class Kernels(NamedTuple):
    """The kernel modules (titan_fp4six.kernels), which a primitives.Primitive row reads its kernel from."""

    quantize: ModuleType
    amax: ModuleType
    decode: ModuleType
    epilogue: ModuleType
    hadamard: ModuleType


@functools.cache
def kernels() -> Kernels | ImportError:
    """The kernel modules, imported on the first call, or the ImportError that says why not (cached either way)."""
    try:
        from ..kernels import amax, decode, epilogue, hadamard, quantize
    except ImportError as exc:
        return exc
    return Kernels(quantize, amax, decode, epilogue, hadamard)
