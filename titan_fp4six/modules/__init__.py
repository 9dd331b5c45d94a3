"""Modules over the four-over-six ops: FourOverSixLinear, the routed-experts subclass factory, and (in
`torchao_config`, imported on first use because it imports torchao) the torchao quantize_ config."""

from .experts import GROUP_ALIGN, check_pad_multiple, convert_experts, four_over_six_experts_class
from .linear import FourOverSixLinear
from .weight_cache import WeightCache, invalidate_weight_caches

__all__ = ["FourOverSixLinear", "GROUP_ALIGN", "WeightCache", "check_pad_multiple", "convert_experts",
           "four_over_six_experts_class", "invalidate_weight_caches"]
