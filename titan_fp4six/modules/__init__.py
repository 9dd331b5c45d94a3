"""Modules over the four-over-six ops: FourOverSixLinear and the routed-experts subclass factory."""

from .experts import GROUP_ALIGN, convert_experts, four_over_six_experts_class
from .linear import FourOverSixLinear

__all__ = ["FourOverSixLinear", "GROUP_ALIGN", "convert_experts", "four_over_six_experts_class"]
