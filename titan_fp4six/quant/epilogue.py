"""The emulated GEMMs' epilogues (product x global decode factors -> output dtype) as primitives: the Triton
kernels of kernels/epilogue.py or their references, the same bytes; ops/gemm.py picks and runs them.

SCALE_CAST: acc (M, N) FP32 * (amax_a/(6B_a) * amax_b/(6B_b)) cast to dtype, a_amax () or (M,), b_amax ().
GROUPED_SCALE_CAST: the grouped GEMM's bf16 product * (fa * fw) per row, zeros past offs[-1].
GROUPED_WGRAD_SCALE_CAST: the grouped weight gradient's product (E, R, N), one pass where PyTorch makes four
over an FP32 copy of the product.
ZERO_ROWS: the bf16 grouped backward's rows that are not data set to +0 in place (an exact fill: strict=False).
"""

from ..numerics.reference import (grouped_scale_cast_reference, grouped_wgrad_scale_cast_reference,
                                  scale_cast_reference, zero_rows_reference)
from .primitives import Primitive

SCALE_CAST = Primitive("epilogue", scale_cast_reference, lambda k: k.epilogue.scale_cast, lambda k: k.epilogue.eligible)
GROUPED_SCALE_CAST = Primitive("grouped epilogue", grouped_scale_cast_reference,
                               lambda k: k.epilogue.grouped_scale_cast, lambda k: k.epilogue.eligible)
GROUPED_WGRAD_SCALE_CAST = Primitive("grouped wgrad epilogue", grouped_wgrad_scale_cast_reference,
                                     lambda k: k.epilogue.grouped_wgrad_scale_cast, lambda k: k.epilogue.eligible)
ZERO_ROWS = Primitive("row zeroing", zero_rows_reference, lambda k: k.epilogue.zero_rows, lambda k: k.epilogue.eligible,
                      strict=False)
