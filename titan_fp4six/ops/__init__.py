"""Four-over-six NVFP4 GEMMs with autograd: dense linear/mm and the MoE grouped GEMM (torchtitan-independent)."""

from .dense import four_over_six_linear, four_over_six_mm, loaded_weight_mm, quantize_linear_weight
from .grouped import (decode_grouped_activations, four_over_six_grouped_mm, loaded_weight_grouped_mm,
                      quantize_grouped_weight)
from .recipe import FourOverSixRecipe
from .rounding import GRADIENT_ROUNDING, set_rounding_seed
from .stats import MAP4_STATS, Map4Stats
from .weights import QuantizedWeight

__all__ = ["FourOverSixRecipe", "GRADIENT_ROUNDING", "MAP4_STATS", "Map4Stats", "QuantizedWeight",
           "decode_grouped_activations", "four_over_six_grouped_mm", "four_over_six_linear", "four_over_six_mm",
           "loaded_weight_grouped_mm", "loaded_weight_mm", "quantize_grouped_weight", "quantize_linear_weight",
           "set_rounding_seed"]
