"""Triton kernels bitwise equal to the reference quantizers (titan_fp4six.numerics.reference).

They import only the formats of the numerics layer; titan_fp4six.quant.primitives decides when they run. Import the
submodules (`quantize`, `amax`) explicitly: importing them imports Triton.
"""
