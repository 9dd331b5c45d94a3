"""`--experimental.custom_import parity_models` (tests/ on PYTHONPATH): the global-batch dataloader of
titan_fp4six.integration.parity plus CPU-sized flavors of the two debug models, for the 1-vs-2-process tests."""

import dataclasses

from torchtitan.models.deepseek_v3 import deepseekv3_args
from torchtitan.models.qwen3 import qwen3_args

import titan_fp4six.integration.parity  # noqa: F401  (same global batch at any DP degree)

TINY = "parity_tiny"


def _tiny(base, **fields):
    return dataclasses.replace(base, moe_args=dataclasses.replace(base.moe_args), **fields)


if TINY not in deepseekv3_args:
    # 2 layers (dense + MoE), 8 routed experts of hidden 64, top-3, 2 shared experts; every GEMM dim a multiple of 16
    deepseekv3_args[TINY] = _tiny(deepseekv3_args["debugmodel"], dim=128, inter_dim=256, moe_inter_dim=64, n_layers=2,
                                  n_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
if TINY not in qwen3_args:
    # 2 MoE layers, 8 routed experts of hidden 64, top-2, no shared experts
    base = qwen3_args["debugmodel_moe"]
    qwen3_args[TINY] = dataclasses.replace(base, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                                           hidden_dim=256, moe_inter_dim=64,
                                           moe_args=dataclasses.replace(base.moe_args, num_experts=8, top_k=2))
