"""The bottom layer: NVFP4 formats, argument checks and the pure-PyTorch reference quantizers (the numerics
contract of docs/numerics.md made executable). No kernels, no choice of implementation, no torchtitan."""

from . import formats, reference, validation

__all__ = ["formats", "reference", "validation"]
