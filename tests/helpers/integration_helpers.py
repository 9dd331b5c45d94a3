"""Shared helpers of the integration tests: job configs parsed the way torchtitan does, meta-device models."""

import copy

import torch
from torchtitan.config.manager import ConfigManager
from torchtitan.models.deepseek_v3 import DeepSeekV3Model, deepseekv3_args
from torchtitan.models.qwen3 import Qwen3Model, qwen3_args
from torchtitan.protocols.model_converter import build_model_converters

CONFIG_MODULE = "titan_fp4six.integration.job_config"
BOTH = "quantize.linear.four_over_six,quantize.grouped_mm.four_over_six"


def job_config(*args: str, converters: str = BOTH):
    """A merged JobConfig from CLI-style overrides, e.g. job_config("--compile.enable")."""
    return ConfigManager().parse_args(["--job.custom_config_module", CONFIG_MODULE, "--model.converters",
                                       converters, *args])


def build_model(name: str, job, device="meta", **arg_overrides):
    specs = {"deepseek_v3": (DeepSeekV3Model, deepseekv3_args, "debugmodel"),
             "qwen3": (Qwen3Model, qwen3_args, "debugmodel_moe")}
    cls, flavors, flavor = specs[name]
    args = copy.deepcopy(flavors[flavor])
    for key, value in arg_overrides.items():
        setattr(args, key, value)
    args.update_from_config(job)
    with torch.device(device):
        return cls(args), args


SMALL_DEEPSEEK = dict(vocab_size=512, dim=128, inter_dim=256, moe_inter_dim=64, n_layers=2, n_heads=4, kv_lora_rank=64,
                      qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
"""A DeepSeek-V3 debug model shrunk until the CPU reference quantizers take milliseconds (dims stay x16)."""


def convert(model, job):
    build_model_converters(job, None).convert(model)
    return model
