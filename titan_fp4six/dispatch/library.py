"""The quantizers as torch.library custom ops (namespace "titan_fp4six"): what the public entry points call
while torch.compile traces.

torch.compile treats a custom op as one opaque call: the fake implementation gives Dynamo the output shapes,
and Inductor never sees, fuses or re-rounds the quantizer's arithmetic. The real implementation is the same
run function that eager calls use, so compiled code gets the eager bytes on CPU and CUDA alike.
"""

import torch

from ..numerics.formats import BLOCK_SIZE, STANDARD_BOUND
from ..numerics.validation import check_quantize_args
from .quantize import run_four_over_six, run_nvfp4

_Tensors2 = tuple[torch.Tensor, torch.Tensor]
_Tensors3 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_Tensors4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _empty_blocks(x: torch.Tensor) -> _Tensors2:
    rows, cols = x.shape
    return (x.new_empty((rows, cols // 2), dtype=torch.uint8),
            x.new_empty((rows, cols // BLOCK_SIZE), dtype=torch.float8_e4m3fn))


@torch.library.custom_op("titan_fp4six::four_over_six_quantize", mutates_args=())
def four_over_six_op(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                     quantizer: str, choose: bool) -> _Tensors3:
    return run_four_over_six(x, amax, block, err_mode, scale_bound, quantizer, False, choose)[:3]


@four_over_six_op.register_fake
def _(x, amax, block, err_mode, scale_bound, quantizer, choose):
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=False)
    codes, scales = _empty_blocks(x)
    return codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@torch.library.custom_op("titan_fp4six::four_over_six_quantize_decode", mutates_args=())
def four_over_six_decode_op(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                            quantizer: str, choose: bool) -> _Tensors4:
    codes, scales, map4, dec = run_four_over_six(x, amax, block, err_mode, scale_bound, quantizer, True, choose)
    return dec, codes, scales, map4


@four_over_six_decode_op.register_fake
def _(x, amax, block, err_mode, scale_bound, quantizer, choose):
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=False)
    codes, scales = _empty_blocks(x)
    return x.new_empty(x.shape, dtype=torch.bfloat16), codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@torch.library.custom_op("titan_fp4six::nvfp4_quantize", mutates_args=())
def nvfp4_op(x: torch.Tensor, amax: torch.Tensor, quantizer: str) -> _Tensors2:
    return run_nvfp4(x, amax, quantizer)[:2]


@nvfp4_op.register_fake
def _(x, amax, quantizer):
    check_quantize_args(x, amax, "1x16", "mse", STANDARD_BOUND, read_values=False)
    return _empty_blocks(x)
