"""Model flavors the plugin adds to torchtitan's tables, and the launchers' check of `model.flavor`.

- TINY_FLAVOR ("tiny"), for DeepSeek-V3 and Qwen3 MoE: every GEMM dim a multiple of 16 and small enough that the
  CPU reference quantizers take seconds a step, where the debug flavors take minutes (a GRPO step of Qwen3's
  debugmodel_moe re-quantizes 302M routed-expert parameters). The README's CPU runs and the tests name it
  with ``--model.flavor tiny``.
- SMALL_FLAVOR ("small"), Qwen3 MoE: between tiny and debugmodel_moe (4 layers, dim 256, 16 experts, top-4, 14M
  parameters): large enough that NVFP4's blocks cut real rows (dim/16 = 16 blocks), small enough for vLLM on the
  CPU and for a device call to carry its checkpoint back. The rollout-distance study (docs/fidelity.md) trains it
  in bf16 on a GPU and evaluates it on the CPU.
- BENCH_FLAVOR: Qwen3-30B-A3B's layer shapes with few layers, so end-to-end training fits one H200. Throughput of
  the four-over-six recipes must be measured on the real MoE shapes (dim 2048, 128 experts, top-8, expert hidden
  768, 32/4 heads, vocab 151936) rather than on the debug models, whose GEMMs are too small to say anything about
  speed. With 4 layers the model has about 3.1e9 parameters (2.4e9 in routed experts): fp32 weights, gradients
  and AdamW state take about 50 GB, which leaves room for activations at 8k tokens per step on a 141 GB H200.

`register()` adds them (idempotent); the plugin's config module and both launchers call it, and
``--experimental.custom_import titan_fp4six.integration.flavors`` does it for a plain ``torchtitan.train`` run.
"""

import dataclasses

from torchtitan.models.deepseek_v3 import DeepSeekV3ModelArgs, deepseekv3_args
from torchtitan.models.moe import MoEArgs
from torchtitan.models.qwen3 import Qwen3ModelArgs, qwen3_args
from torchtitan.protocols.train_spec import get_train_spec

TINY_FLAVOR = "tiny"
SMALL_FLAVOR = "small"
BASE_FLAVOR = "30B-A3B"
BENCH_FLAVOR = "30B-A3B-4layers"
BENCH_LAYERS = 4


def register() -> None:
    """Add TINY_FLAVOR (DeepSeek-V3, Qwen3), SMALL_FLAVOR and BENCH_FLAVOR (Qwen3) to torchtitan's flavor tables
    (idempotent)."""
    if TINY_FLAVOR not in deepseekv3_args:
        deepseekv3_args[TINY_FLAVOR] = DeepSeekV3ModelArgs(
            vocab_size=2048, dim=64, inter_dim=128, moe_inter_dim=64, n_layers=3, n_dense_layers=1, n_heads=4,
            moe_args=MoEArgs(num_experts=4, num_shared_experts=1, top_k=2, score_func="softmax", route_norm=False,
                             score_before_experts=False),
            q_lora_rank=0, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, mscale=0.70)
    if TINY_FLAVOR not in qwen3_args:
        qwen3_args[TINY_FLAVOR] = Qwen3ModelArgs(
            vocab_size=2048, max_seq_len=256, head_dim=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm=True,
            hidden_dim=128, rope_theta=1000000, moe_enabled=True, moe_inter_dim=64,
            moe_args=MoEArgs(num_experts=8, num_shared_experts=0, top_k=2, score_func="softmax", route_norm=True,
                             route_scale=1.0, score_before_experts=False))
    if SMALL_FLAVOR not in qwen3_args:
        qwen3_args[SMALL_FLAVOR] = Qwen3ModelArgs(
            vocab_size=2048, max_seq_len=512, head_dim=32, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, qk_norm=True,
            hidden_dim=512, rope_theta=1000000, moe_enabled=True, moe_inter_dim=256,
            moe_args=MoEArgs(num_experts=16, num_shared_experts=0, top_k=4, score_func="softmax", route_norm=True,
                             route_scale=1.0, score_before_experts=False))
    if BENCH_FLAVOR not in qwen3_args:
        base = qwen3_args[BASE_FLAVOR]
        # a fresh MoEArgs too: update_from_config mutates moe_args in place, which must not reach the 48-layer flavor
        qwen3_args[BENCH_FLAVOR] = dataclasses.replace(base, n_layers=BENCH_LAYERS, max_seq_len=4096,
                                                       moe_args=dataclasses.replace(base.moe_args))


def check_flavor(job_config) -> None:
    """torchtitan's trainer looks model.flavor up with a bare KeyError: name the model's flavors first."""
    name, flavor = job_config.model.name, job_config.model.flavor
    flavors = get_train_spec(name).model_args
    if flavor not in flavors:
        raise ValueError(f"model.flavor={flavor!r} is not a flavor of model.name={name!r}; valid: "
                         f"{', '.join(flavors)}")


register()
