"""Routed experts of an exported checkpoint: vLLM's fused w13 (gate and up rows of each expert) and w2 with
their block scales and per-expert global factors (w13's one per half); the forward sorts the (token, expert)
pairs by expert and runs the package's experts forward (modules/experts.py: token groups padded to GROUP_ALIGN
rows as in training, SiLU(x W1^T) * (x W3^T), then W2) on the package's grouped op, then combines a token's
pairs with its router scores as torchtitan's MoE does (an FP32 bmm)."""

import functools

import torch
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from ..modules.experts import GROUP_ALIGN, experts_forward_padded, gated
from ..numerics.formats import BLOCK_SIZE
from ..ops import FourOverSixRecipe, QuantizedWeight, loaded_weight_grouped_mms
from ..ops.checkpoint import amax_for_factor
from ..ops.checks import blockable
from .loaded import check_finite, dummy_load, incomplete, not_quantized, recording


class FourOverSixMoEMethod(FusedMoEMethodBase):
    def __init__(self, recipe: FourOverSixRecipe, moe_config):
        super().__init__(moe_config)
        self.recipe = recipe

    def create_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype, **extra_weight_attrs):
        inter = intermediate_size_per_partition
        if not blockable(hidden_size, inter):
            raise ValueError(f"four_over_six: experts of hidden size {hidden_size} and intermediate size {inter}: "
                             f"NVFP4 needs multiples of {BLOCK_SIZE}")
        if not self.moe.is_act_and_mul:
            raise ValueError("four_over_six: routed experts without a gated activation (w1 and w3) are not supported")

        layer.loaded_shards = {}  # parameter name -> {(local expert, "w1"/"w2"/"w3"): the loaded tensor's shape}
        layer.check_loaded = not dummy_load()

        def add(name, shape, dtype, kind):  # scales and factors NaN until loaded: an unloaded expert decodes to NaN
            data = torch.empty(shape, dtype=dtype)
            param = torch.nn.Parameter(data if dtype == torch.uint8 else data.fill_(torch.nan), requires_grad=False)
            layer.register_parameter(name, param)

            def record(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
                local = layer._map_global_expert_id_to_local_expert_id(expert_id)
                experts = range(shape[0]) if loaded_weight.dim() == 3 else [local] if local >= 0 else []
                for e in experts:  # a 3-D tensor: every expert at once
                    layer.loaded_shards.setdefault(name, {})[e, shard_id] = tuple(loaded_weight.shape[-2:])

            def checked(param, loaded_weight, weight_name, shard_id, *args, **kwargs):
                want, tp = "", layer.moe_config.moe_parallel_config.tp_size
                if len(shape) == 3:  # an expert's tensor in the checkpoint, as process_weights_after_loading checks
                    rows, cols = shape[1:]
                    want = f" of shape {(rows // 2 * tp, cols) if shard_id != 'w2' else (rows, cols * tp)}"
                expert = kwargs.get("expert_id", args[0] if args else None)
                module = f"{layer.layer_name}'s expert {expert} ({shard_id})"
                wrong = not_quantized(layer.layer_name, name, module, want, loaded_weight)
                if wrong is not None:
                    raise wrong
                return loader(param, loaded_weight, weight_name, shard_id, *args, **kwargs)
            loader = recording(extra_weight_attrs["weight_loader"], record)
            set_weight_attrs(param, {**extra_weight_attrs, "quant_method": kind.value,
                                     "weight_loader": functools.wraps(loader)(checked)})
        block, tensor = FusedMoeWeightScaleSupported.BLOCK, FusedMoeWeightScaleSupported.TENSOR
        for name, rows, cols in (("w13", 2 * inter, hidden_size), ("w2", hidden_size, inter)):
            add(f"{name}_weight", (num_experts, rows, cols // 2), torch.uint8, block)
            add(f"{name}_weight_scale", (num_experts, rows, cols // BLOCK_SIZE), torch.float8_e4m3fn, block)
        add("w13_weight_scale_2", (num_experts, 2), torch.float32, tensor)
        add("w2_weight_scale_2", (num_experts,), torch.float32, tensor)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Every local expert's w1, w3 and w2 loaded into every quantized parameter, whole (vLLM's MoE loader copies
        a short tensor into part of an expert silently); scales and factors finite. Under tensor parallelism the
        loader gets the whole checkpoint tensor and narrows it, so the expected shape is the rank's slice with its
        sharded dimension (rows of w1/w3, columns of w2) times the TP size; expert parallelism: only this rank's
        experts are expected (the loader returns False for the others, which are not recorded)."""
        prefix, tp = layer.layer_name, layer.moe_config.moe_parallel_config.tp_size
        for name, param in layer.named_parameters(recurse=False):
            if not layer.check_loaded or not name.startswith(("w13_weight", "w2_weight")):
                continue
            loaded = layer.loaded_shards.get(name, {})
            for e in range(param.shape[0]):
                for shard in (("w1", "w3") if name.startswith("w13") else ("w2",)):
                    if (e, shard) not in loaded:
                        raise incomplete(prefix, name, f"no {shard} of local expert {e}")
                    if param.dim() == 3:
                        rows, cols = param.shape[1:]
                        want = (rows // 2 * tp, cols) if shard != "w2" else (rows, cols * tp)
                        if loaded[e, shard] != want:
                            raise incomplete(prefix, name, f"{shard} of local expert {e} has shape "
                                             f"{loaded[e, shard]}, expected {want}")
        check_finite(layer, prefix, ("w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2",
                                     "w2_weight_scale_2"))

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None  # no vLLM kernel runs these experts

    def _weights(self, layer) -> dict[str, QuantizedWeight]:
        """The experts' (w1, w3, w2) as loaded QuantizedWeights: codes (E*N, K/2), amax (E,)."""
        bound = self.recipe.scale_bound
        experts, rows = layer.w13_weight.shape[:2]
        half = rows // 2
        amax13 = amax_for_factor(layer.w13_weight_scale_2, bound)

        def stacked(t, part):
            return t[:, part].reshape(experts * half, t.shape[-1])
        w1 = QuantizedWeight.loaded(stacked(layer.w13_weight, slice(0, half)),
                                    stacked(layer.w13_weight_scale, slice(0, half)), amax13[:, 0].contiguous())
        w3 = QuantizedWeight.loaded(stacked(layer.w13_weight, slice(half, rows)),
                                    stacked(layer.w13_weight_scale, slice(half, rows)), amax13[:, 1].contiguous())
        w2 = QuantizedWeight.loaded(layer.w2_weight.reshape(-1, layer.w2_weight.shape[-1]),
                                    layer.w2_weight_scale.reshape(-1, layer.w2_weight_scale.shape[-1]),
                                    amax_for_factor(layer.w2_weight_scale_2, bound))
        return {"w1": w1, "w3": w3, "w2": w2}

    def routed_outputs(self, layer, x: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each (token, expert) pair's expert output, in the pairs' stable expert order; that order as indices
        into topk_ids.flatten())."""
        experts = layer.w13_weight.shape[0]
        flat = topk_ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=experts)
        weights = self._weights(layer)

        def mms(names, A, offs):
            return loaded_weight_grouped_mms(A, offs, [weights[n] for n in names], recipe=self.recipe)
        rows = x.index_select(0, order // topk_ids.shape[1])
        return experts_forward_padded(rows, counts, gated(mms), GROUP_ALIGN), order

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts,
              shared_experts_input) -> torch.Tensor:
        if shared_experts is not None:
            raise ValueError("four_over_six: routed experts with shared experts are not supported")
        out, order = self.routed_outputs(layer, x, topk_ids)
        tokens, k = topk_ids.shape
        unsorted = torch.zeros_like(out).index_copy_(0, order, out).view(tokens, k, -1)
        # torchtitan's combine (score_before_experts=False): one (1 x k) @ (k x dim) FP32 product per token
        return torch.bmm(topk_weights.float().view(tokens, 1, k), unsorted.float()).to(x.dtype).squeeze(1)
