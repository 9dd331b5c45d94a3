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
from .loaded import QUANTIZED, REEXPORT, check_finite, dummy_load, incomplete, not_quantized, recording

_SHARDS = {"q": 0, "k": 1, "v": 2}  # QKVParallelLinear's shard ids; merged layers count 0, 1, ...


def _tp_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_world_size()


@register_weight_loader_v2_supported_method
class FourOverSixLinearMethod(LinearMethodBase):
    def __init__(self, recipe: FourOverSixRecipe, modules: list[str] | None = None):
        self.recipe = recipe
        self.modules = modules
        """The checkpoint modules this layer loads, in partition order (q_proj, k_proj, v_proj of a qkv_proj)."""

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        if not blockable(input_size_per_partition, *output_partition_sizes):
            raise ValueError(f"four_over_six: a layer of input {input_size_per_partition} and outputs "
                             f"{output_partition_sizes}: NVFP4 needs multiples of {BLOCK_SIZE}")
        rows = sum(output_partition_sizes)
        layer.loaded_shards = {}  # parameter name -> the shard ids its loader took (None: the whole fused tensor)
        layer.check_loaded = not dummy_load()

        def expected(name, shard):
            """(the checkpoint module of this shard, the shape its tensor must have (None for a factor, or under
            tensor parallelism, where vLLM's loader checks the rank's slice), that expectation in words)."""
            index = _SHARDS.get(shard, shard)
            whole = index is None or self.modules is None or len(self.modules) != len(output_partition_sizes)
            module = layer.prefix if whole else self.modules[index]
            if name == "weight_scale_2":
                return module, None, ", one per partition"
            cols = input_size // (2 if name == "weight" else BLOCK_SIZE)
            if _tp_size() != 1:
                return module, None, f" of {cols} columns"
            shape = (rows if index is None else output_partition_sizes[index], cols)
            return module, shape, f" of shape {shape}"

        def loader_of(name):
            def load(param, loaded_weight, *shard, **kw):  # RowParallelLinear's loader takes no shard id
                loaded_shard_id = shard[0] if shard else kw.get("loaded_shard_id")
                module, shape, want = expected(name, loaded_shard_id)
                wrong = not_quantized(layer.prefix, name, module, want, loaded_weight)
                if wrong is None and shape is not None and tuple(loaded_weight.shape) != shape:
                    wrong = ValueError(f"four_over_six: {layer.prefix}.{name}: the checkpoint's {name} of {module} "
                                       f"has shape {tuple(loaded_weight.shape)}, expected {shape} (a "
                                       f"{shape[0]}x{input_size} weight's {QUANTIZED[name][1]}); {REEXPORT}")
                if wrong is not None:
                    raise wrong
                try:
                    return extra_weight_attrs["weight_loader"](param, loaded_weight, *shard, **kw)
                except (AssertionError, RuntimeError) as e:  # vLLM's shape assertion or narrow, naming nothing
                    raise ValueError(f"four_over_six: {layer.prefix}.{name}: the checkpoint's tensor of {module} "
                                     f"(shard {loaded_shard_id!r}) of shape {tuple(loaded_weight.shape)} does not "
                                     f"fit the layer's {tuple(param.shape)} (partitions "
                                     f"{list(output_partition_sizes)}; {type(e).__name__}: {e}); {REEXPORT}") from e

            def record(param, loaded_weight, loaded_shard_id=None):
                layer.loaded_shards.setdefault(name, set()).add(loaded_shard_id)
            return recording(load, record)

        def blocked(name, columns, dtype):  # scales NaN until loaded (codes: any byte is a code, hence the record)
            data = torch.empty(rows, columns, dtype=dtype)
            layer.register_parameter(name, ModelWeightParameter(
                data=data if dtype == torch.uint8 else data.fill_(torch.nan), input_dim=1, output_dim=0,
                weight_loader=loader_of(name)))
        blocked("weight", input_size_per_partition // 2, torch.uint8)
        blocked("weight_scale", input_size_per_partition // BLOCK_SIZE, torch.float8_e4m3fn)
        layer.register_parameter("weight_scale_2", PerTensorScaleParameter(
            data=torch.full((len(output_partition_sizes),), torch.nan, dtype=torch.float32),
            weight_loader=loader_of("weight_scale_2")))
        layer.partition_sizes = list(output_partition_sizes)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Every partition of every quantized parameter loaded, scales and factors finite. Shard ids (q/k/v, the
        merged 0, 1, ..., or None for a whole tensor) are what each TP rank loads alike, so the record holds under
        tensor parallelism too; a tensor of another dtype or shape is refused in the loader (named above)."""
        parts = len(layer.partition_sizes)
        if layer.check_loaded:
            for name in ("weight", "weight_scale", "weight_scale_2"):
                ids = layer.loaded_shards.get(name, set())
                if None not in ids and len(ids) < parts:
                    raise incomplete(layer.prefix, name, f"loaded {len(ids)} of its {parts} partitions"
                                     + (f": {sorted(map(str, ids))}" if ids else ""))
        check_finite(layer, layer.prefix, ("weight_scale", "weight_scale_2"))

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
