"""The quantizers as torch.library custom ops (namespace "titan_fp4six"), for use under torch.compile.

torch.compile treats a custom op as one opaque call: its fake (meta) implementation gives Dynamo the output
shapes, and Inductor never sees, fuses or re-rounds the quantizer's arithmetic. The real implementation is
the public numerics entry point, which runs the Triton kernel on eligible CUDA inputs and the reference
otherwise, so compiled and eager calls return the same bytes.
"""

import torch

from ..numerics import quantize as nq
from ..numerics.formats import BLOCK_SIZE
from ..numerics.quantize import NVFP4Blocks
from ..numerics.validation import check_quantize_args

_Tensors2 = tuple[torch.Tensor, torch.Tensor]
_Tensors3 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_Tensors4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _check_static(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int) -> None:
    """The checks that need no data (the fake implementations cannot read values)."""
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=False)


def _empty_blocks(x: torch.Tensor) -> _Tensors2:
    rows, cols = x.shape
    return (x.new_empty((rows, cols // 2), dtype=torch.uint8),
            x.new_empty((rows, cols // BLOCK_SIZE), dtype=torch.float8_e4m3fn))


@torch.library.custom_op("titan_fp4six::four_over_six_quantize", mutates_args=())
def _four_over_six(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int) -> _Tensors3:
    out = nq.four_over_six_quantize(x, amax, block=block, err_mode=err_mode, scale_bound=scale_bound)
    return out.codes, out.scales, out.map4


@_four_over_six.register_fake
def _(x, amax, block, err_mode, scale_bound):
    _check_static(x, amax, block, err_mode, scale_bound)
    codes, scales = _empty_blocks(x)
    return codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@torch.library.custom_op("titan_fp4six::four_over_six_quantize_decode", mutates_args=())
def _four_over_six_decode(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str,
                          scale_bound: int) -> _Tensors4:
    dec, out = nq.four_over_six_quantize_decode(x, amax, block=block, err_mode=err_mode, scale_bound=scale_bound)
    return dec, out.codes, out.scales, out.map4


@_four_over_six_decode.register_fake
def _(x, amax, block, err_mode, scale_bound):
    _check_static(x, amax, block, err_mode, scale_bound)
    codes, scales = _empty_blocks(x)
    return x.new_empty(x.shape, dtype=torch.bfloat16), codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@torch.library.custom_op("titan_fp4six::nvfp4_quantize", mutates_args=())
def _nvfp4(x: torch.Tensor, amax: torch.Tensor) -> _Tensors2:
    out = nq.nvfp4_quantize(x, amax)
    return out.codes, out.scales


@_nvfp4.register_fake
def _(x, amax):
    _check_static(x, amax, "1x16", "mse", 448)
    return _empty_blocks(x)


def four_over_six_quantize(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16", err_mode: str = "mse",
                           scale_bound: int = 256) -> NVFP4Blocks:
    """numerics.four_over_six_quantize through the custom op (same bytes; opaque to torch.compile)."""
    return NVFP4Blocks(*torch.ops.titan_fp4six.four_over_six_quantize(x, amax, block, err_mode, scale_bound))


def four_over_six_quantize_decode(x: torch.Tensor, amax: torch.Tensor, *, block: str = "1x16", err_mode: str = "mse",
                                  scale_bound: int = 256) -> tuple[torch.Tensor, NVFP4Blocks]:
    """numerics.four_over_six_quantize_decode through the custom op: (bf16 block-scaled decode, blocks)."""
    dec, codes, scales, map4 = torch.ops.titan_fp4six.four_over_six_quantize_decode(x, amax, block, err_mode,
                                                                                    scale_bound)
    return dec, NVFP4Blocks(codes, scales, map4)


def nvfp4_quantize(x: torch.Tensor, amax: torch.Tensor) -> NVFP4Blocks:
    """numerics.nvfp4_quantize through the custom op."""
    return NVFP4Blocks(*torch.ops.titan_fp4six.nvfp4_quantize(x, amax))
