"""Modules over the four-over-six ops: FourOverSixLinear, the routed-experts subclass factory, and the torchao
quantize_ config that installs FourOverSixLinear."""

from .experts import GROUP_ALIGN, convert_experts, four_over_six_experts_class
from .linear import FourOverSixLinear
from .torchao_config import FourOverSixTrainingConfig, quantizable_linear

__all__ = ["FourOverSixLinear", "FourOverSixTrainingConfig", "GROUP_ALIGN", "convert_experts",
           "four_over_six_experts_class", "quantizable_linear"]
