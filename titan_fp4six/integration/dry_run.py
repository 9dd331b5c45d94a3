"""Dry run of a recipe too large for this project's hardware: parse it, build the model on the meta device,
convert it, and print what is quantized and the memory a training run needs.

Why: configs/qwen3_30b_a3b_nvfp4_four_over_six.toml cannot be trained here; this checks everything short of
allocating it. The tool is ``python -m titan_fp4six.dry_run --job.config_file RECIPE [--gpu-memory-gib 141]
[--section.key value ...]`` (titan_fp4six/dry_run.py; ``--rl`` for a GRPO layout, rl/dry_run.py); this module
builds, summarizes and reports. The memory model is stated in ``estimate_memory``; it is an estimate for
planning, not a measurement.
"""

from titan_fp4six.integration.version import require

require("0.2", "python -m titan_fp4six.dry_run")  # before the torchtitan 0.2 imports below

import dataclasses
import math
import sys

import torch
from torch import nn
from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
from torchtitan.protocols import train_spec as train_spec_module
from torchtitan.protocols.model_converter import build_model_converters
from torchtitan.tools import utils

from ..quant.recipe import FourOverSixRecipe
from . import job_config as _job_config  # noqa: F401  (registers the converters, the dataset and the flavors)
from .checks import check_job_config

GIB = 1024**3


@dataclasses.dataclass
class Summary:
    total_params: int
    quantized: dict[str, tuple[int, FourOverSixRecipe]]  # fqn -> (params, recipe)
    bf16_linear_params: int  # Linear / experts weights left unconverted
    flops_per_token: int
    largest_layer_params: int


def build_and_convert(args: list[str]):
    """The job config and its model on the meta device, converted by the recipe's converters."""
    config = ConfigManager().parse_args(args)
    check_job_config(config)
    spec = train_spec_module.get_train_spec(config.model.name)
    model_args = spec.model_args[config.model.flavor]
    model_args.update_from_config(config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = spec.model_cls(model_args)
    build_model_converters(config, None).convert(model)
    return config, model_args, model


def summarize(model: nn.Module, model_args, seq_len: int) -> Summary:
    quantized, bf16_weights = {}, 0
    for fqn, mod in model.named_modules():
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        if isinstance(getattr(mod, "recipe", None), FourOverSixRecipe):
            quantized[fqn] = (own, mod.recipe)
        elif isinstance(mod, nn.Linear) or {"w1", "w2", "w3"} <= set(dict(mod.named_parameters(recurse=False))):
            bf16_weights += own
    layers = getattr(model, "layers", None)
    largest = max((sum(p.numel() for p in layer.parameters()) for layer in layers.values()), default=0) \
        if layers is not None else 0
    total, flops = model_args.get_nparams_and_flops(model, seq_len)
    return Summary(total, quantized, bf16_weights, int(flops), largest)


def estimate_memory(s: Summary, config, model_args, gpus: int, tokens: int | None = None) -> dict[str, float]:
    """Per-GPU bytes for FSDP over `gpus` ranks with AdamW (fp32 params, grads and two moments: 16 B/param,
    sharded), two gathered bf16 layers (FSDP prefetch), activations by the recipe's activation_checkpoint.mode
    (full: one bf16 layer input kept per layer, plus a working set of ~34 bf16 hidden-size tensors and the
    routed-expert intermediates for the layer being recomputed; none, and selective as its upper bound: every
    layer's working set kept), and fp32 logits with their gradient; `tokens` per rank and step (default
    training.local_batch_size x seq_len)."""
    t = config.training
    tokens = t.local_batch_size * t.seq_len if tokens is None else tokens
    dim = model_args.dim
    moe = getattr(model_args, "moe_args", None)
    top_k = getattr(moe, "top_k", 1) if getattr(model_args, "moe_enabled", moe is not None) else 1
    hidden = getattr(model_args, "moe_inter_dim", 0) or getattr(model_args, "hidden_dim", 4 * dim)
    n_layers = model_args.n_layers
    working_set = 2 * tokens * (dim * 34 + 4 * top_k * hidden)
    mode = config.activation_checkpoint.mode
    activations = 2 * tokens * dim * n_layers + working_set if mode == "full" else n_layers * working_set
    return {
        "params+grads+AdamW (sharded)": 16 * s.total_params / gpus,
        "gathered bf16 layers": 2 * 2 * s.largest_layer_params,
        f"activations (AC {mode})": activations,
        "logits fp32 + grad": 2 * 4 * tokens * model_args.vocab_size,
    }


def report(args: list[str], gpu_memory_gib: float) -> int:
    """Build and convert the recipe of `args` (the torchtitan CLI) and print what is quantized and the memory per
    GPU for FSDP over 1 to 64 GPUs of `gpu_memory_gib`, with the fewest that fit; 0."""
    config, model_args, model = build_and_convert(args)
    s = summarize(model, model_args, config.training.seq_len)
    q_params = sum(n for n, _ in s.quantized.values())
    recipes = sorted({str(r) for _, r in s.quantized.values()})
    print(f"recipe {config.job.config_file}: {config.model.name} {config.model.flavor}, "
          f"converters {config.model.converters}")
    print(f"parameters: {s.total_params:,} total; {q_params:,} ({q_params / s.total_params:.1%}) in {len(s.quantized)} "
          f"four-over-six modules; {s.bf16_linear_params:,} Linear/expert weights left in bf16")
    print(f"recipes: {'; '.join(recipes) or 'none'}")
    kinds: dict[str, int] = {}
    for fqn in s.quantized:
        key = ".".join("N" if part.isdigit() else part for part in fqn.split("."))
        kinds[key] = kinds.get(key, 0) + 1
    for key, count in sorted(kinds.items()):
        print(f"  quantized {key}: {count} modules")
    print(f"training FLOPs per token: {s.flops_per_token:.3e} (seq_len {config.training.seq_len})")
    print(f"memory per GPU, FSDP over N GPUs, local_batch_size {config.training.local_batch_size} x seq_len "
          f"{config.training.seq_len} (estimate; see estimate_memory):")
    fits = None
    for gpus in (1, 2, 4, 8, 16, 32, 64):
        parts = estimate_memory(s, config, model_args, gpus)
        total = sum(parts.values()) / GIB
        detail = ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items())
        print(f"  N={gpus:2}: {total:7.1f} GiB  ({detail})")
        if fits is None and total <= 0.9 * gpu_memory_gib:
            fits = gpus
    need = f"{fits} GPUs" if fits else "more than 64 GPUs (or smaller local_batch_size / seq_len)"
    print(f"hardware: at least {need} with {gpu_memory_gib:g} GiB each (estimate within 90% of memory); "
          f"native NVFP4 GEMMs need Blackwell (SM100), other GPUs run them emulated in bf16")
    print(f"min GPUs: {fits if fits else math.inf}")
    return 0


if __name__ == "__main__":
    sys.exit("python -m titan_fp4six.integration.dry_run is now python -m titan_fp4six.dry_run (the same arguments)")
