"""Four-over-six NVFP4 GEMMs with autograd: dense linear/mm and the MoE grouped GEMM (torchtitan-independent).

The recipe they take is quant.recipe's (re-exported here, the ops' argument type)."""

from ..quant.recipe import FourOverSixRecipe
from .dense import four_over_six_linear, four_over_six_mm, loaded_weight_mm, quantize_linear_weight
from .grouped import (assembled_grouped_weight, decode_grouped_activations, four_over_six_grouped_mm,
                      four_over_six_grouped_mms, loaded_weight_grouped_mm, loaded_weight_grouped_mms,
                      quantize_grouped_weight, quantize_grouped_weight_shard)
from .weights import QuantizedWeight

__all__ = ["FourOverSixRecipe", "QuantizedWeight", "assembled_grouped_weight", "decode_grouped_activations",
           "four_over_six_grouped_mm", "four_over_six_grouped_mms", "four_over_six_linear", "four_over_six_mm",
           "loaded_weight_grouped_mm", "loaded_weight_grouped_mms", "loaded_weight_mm",
           "quantize_grouped_weight", "quantize_grouped_weight_shard", "quantize_linear_weight"]
