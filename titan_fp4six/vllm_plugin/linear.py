"""Linear layers of an exported checkpoint: per logical partition (q, k, v of a fused qkv_proj) its own codes
rows, block scales and global factor, each partition the package's dense op on the layer's input, exactly as
the trainer ran wq, wk and wv."""

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, register_weight_loader_v2_supported_method
from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter

from ..numerics.formats import BLOCK_SIZE
from ..ops import FourOverSixRecipe, QuantizedWeight, loaded_weight_mm
from ..ops.checkpoint import amax_for_factor
from ..ops.checks import blockable


@register_weight_loader_v2_supported_method
class FourOverSixLinearMethod(LinearMethodBase):
    def __init__(self, recipe: FourOverSixRecipe):
        self.recipe = recipe

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        if not blockable(input_size_per_partition, *output_partition_sizes):
            raise ValueError(f"four_over_six: a layer of input {input_size_per_partition} and outputs "
                             f"{output_partition_sizes}: NVFP4 needs multiples of {BLOCK_SIZE}")
        loader = extra_weight_attrs["weight_loader"]
        rows = sum(output_partition_sizes)

        def blocked(name, columns, dtype):
            layer.register_parameter(name, ModelWeightParameter(data=torch.empty(rows, columns, dtype=dtype),
                                                                input_dim=1, output_dim=0, weight_loader=loader))
        blocked("weight", input_size_per_partition // 2, torch.uint8)
        blocked("weight_scale", input_size_per_partition // BLOCK_SIZE, torch.float8_e4m3fn)
        layer.register_parameter("weight_scale_2", PerTensorScaleParameter(
            data=torch.full((len(output_partition_sizes),), torch.nan, dtype=torch.float32), weight_loader=loader))
        layer.partition_sizes = list(output_partition_sizes)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])
        amaxes = amax_for_factor(layer.weight_scale_2, self.recipe.scale_bound)
        outs, start = [], 0
        for i, n in enumerate(layer.partition_sizes):
            weight = QuantizedWeight.loaded(layer.weight[start:start + n], layer.weight_scale[start:start + n],
                                            amaxes[i])
            outs.append(loaded_weight_mm(x2d, weight, recipe=self.recipe))
            start += n
        out = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)).view(*x.shape[:-1], start)
        return out if bias is None else out + bias.to(out.dtype)
