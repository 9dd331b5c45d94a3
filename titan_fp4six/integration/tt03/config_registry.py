"""Registry functions of the plugin's recipes for torchtitan 0.3:
`python -m titan_fp4six.train --module titan_fp4six.integration.tt03 --config <recipe>` (or `torchtitan.train`
with the same arguments on a GPU), then CLI overrides such as `--training.steps 20` or
`--quantize.grouped_mm.four_over_six.scale_bound 448`.

Each function reads the recipe's TOML in configs/ (the recipes' one home, shared with the 0.2 integration) and
builds the equivalent torchtitan 0.3 config, so both versions train the same model, data, schedule, seed and knobs.
Module names that 0.3 renamed are translated in the fqn lists (`output` -> `lm_head`, routed `experts` ->
`routed_experts`); a TOML key with no 0.3 counterpart is an error naming it.
"""

import tomllib
from pathlib import Path

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import ParallelismConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models import deepseek_v3, qwen3
from torchtitan.models.common.config_utils import decoder_vocab_size

from .. import data
from ..sections import FAMILY
from .trainer import FourOverSixTrainer, ModelSection, QuantizedGroupedMM, QuantizedLinear, Quantize, Training
from .converters import FourOverSixGroupedExpertsConverter, FourOverSixLinearConverter

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
MODELS = {"deepseek_v3": deepseek_v3.model_registry, "qwen3": qwen3.model_registry}
RENAMED = {"output": "lm_head", "experts": "routed_experts"}  # 0.2 module name -> 0.3's

data.register()


def _take(table: dict, section: str, keys: tuple[str, ...]) -> dict:
    """The keys of a TOML table that 0.3 takes as they are; any other key is an error naming it."""
    extra = sorted(set(table) - set(keys))
    if extra:
        raise ValueError(f"[{section}] {extra} have no torchtitan 0.3 counterpart in this registry; translated "
                         f"keys: {', '.join(keys)}")
    return dict(table)


def _renamed(fqn: str) -> str:
    """A 0.2 fqn entry in 0.3's module names, part by part (`layers.1.moe.experts` -> `layers.1.moe.routed_experts`)."""
    return ".".join(RENAMED.get(part, part) for part in fqn.split("."))


def _section(cls, table: dict, section: str):
    fqn_keys = ("fqns", "filter_fqns")
    knobs = {k: [_renamed(fqn) for fqn in v] if k in fqn_keys and type(v) is list else v for k, v in table.items()}
    return cls(**knobs)


def from_recipe(name: str) -> FourOverSixTrainer.Config:
    """The torchtitan 0.3 config of configs/<name>.toml."""
    path = CONFIGS / f"{name}.toml"
    with open(path, "rb") as f:
        toml = tomllib.load(f)
    job, model, opt = toml.pop("job", {}), toml.pop("model"), toml.pop("optimizer")
    training = toml.pop("training")
    _take(job, "job", ("dump_folder", "description", "custom_config_module"))
    if opt.pop("name") != "AdamW":
        raise ValueError(f"{path}: [optimizer] name must be AdamW for the 0.3 registry")
    spec = MODELS[model["name"]](model["flavor"])
    quantize = toml.pop("quantize", {})
    linear = quantize.get("linear", {}).get(FAMILY)
    grouped = quantize.get("grouped_mm", {}).get(FAMILY)
    activation = toml.pop("activation_checkpoint")
    if activation != {"mode": "none"}:
        raise ValueError(f"{path}: [activation_checkpoint] {activation} is not translated (mode = 'none' is)")
    config = FourOverSixTrainer.Config(
        model_spec=spec,
        hf_assets_path=model["hf_assets_path"],
        dump_folder=job.get("dump_folder", "./outputs"),
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))),
        metrics=MetricsProcessor.Config(**_take(toml.pop("metrics", {}), "metrics", ("log_freq",))),
        dataloader=HuggingFaceTextDataLoader.Config(dataset=training.pop("dataset")),
        optimizer=default_adamw(**_take(opt, "optimizer", ("lr", "eps"))),
        lr_scheduler=LRSchedulersContainer.Config(**toml.pop("lr_scheduler")),
        training=Training(**training),
        parallelism=ParallelismConfig(**toml.pop("parallelism")),
        checkpoint=CheckpointManager.Config(**toml.pop("checkpoint")),
        activation_checkpoint=None,
        debug=DebugConfig(**toml.pop("debug")),
        model=ModelSection(converters=list(model.get("converters", []))),
        quantize=Quantize(
            linear=QuantizedLinear(four_over_six=_section(FourOverSixLinearConverter.Config, linear or {}, "linear")),
            grouped_mm=QuantizedGroupedMM(four_over_six=_section(FourOverSixGroupedExpertsConverter.Config,
                                                                 grouped or {}, "grouped_mm"))))
    _take(model, "model", ("name", "flavor", "hf_assets_path", "converters"))
    if toml:
        raise ValueError(f"{path}: sections {sorted(toml)} are not translated to torchtitan 0.3")
    return config


def deepseek_v3_debugmodel_nvfp4_four_over_six() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_four_over_six")


def deepseek_v3_debugmodel_nvfp4_four_over_six_dequantized() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_four_over_six_dequantized")


def deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears")


def deepseek_v3_debugmodel_nvfp4_all_linears() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_all_linears")


def deepseek_v3_debugmodel_bf16() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_bf16")


def qwen3_moe_debug_nvfp4_four_over_six() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4_four_over_six")


def qwen3_moe_debug_nvfp4() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4")


def qwen3_moe_debug_nvfp4_four_over_six_all_linears() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4_four_over_six_all_linears")


def qwen3_moe_debug_nvfp4_all_linears() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4_all_linears")


def qwen3_moe_debug_bf16() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_bf16")


def deepseek_v3_debugmodel_nvfp4_full() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_full")


def deepseek_v3_debugmodel_nvfp4_four_over_six_full() -> FourOverSixTrainer.Config:
    return from_recipe("deepseek_v3_debugmodel_nvfp4_four_over_six_full")


def qwen3_moe_debug_nvfp4_full() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4_full")


def qwen3_moe_debug_nvfp4_four_over_six_full() -> FourOverSixTrainer.Config:
    return from_recipe("qwen3_moe_debug_nvfp4_four_over_six_full")
