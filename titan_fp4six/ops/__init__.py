"""Four-over-six NVFP4 GEMMs with autograd: dense linear/mm and the MoE grouped GEMM (torchtitan-independent)."""

from .dense import four_over_six_linear, four_over_six_mm
from .grouped import four_over_six_grouped_mm
from .recipe import FourOverSixRecipe
from .stats import MAP4_STATS, Map4Stats

__all__ = ["FourOverSixRecipe", "MAP4_STATS", "Map4Stats", "four_over_six_grouped_mm", "four_over_six_linear",
           "four_over_six_mm"]
