"""Fast paths for the numerics layer: Triton quantizer kernels (imported lazily, CUDA only) and the
torch.library custom ops that make the quantizers opaque, bit-exact calls under torch.compile."""

from .library import four_over_six_quantize, four_over_six_quantize_decode, nvfp4_quantize

__all__ = ["four_over_six_quantize", "four_over_six_quantize_decode", "nvfp4_quantize"]
