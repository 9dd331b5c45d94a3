"""Benchmark flavor: Qwen3-30B-A3B's layer shapes with few layers, so end-to-end training fits one H200.

Why: throughput of the four-over-six recipes must be measured on the real MoE shapes (dim 2048, 128 experts,
top-8, expert hidden 768, 32/4 heads, vocab 151936) rather than on the debug models, whose GEMMs are too small
to say anything about speed. A run that uses it names this module in ``--experimental.custom_import
titan_fp4six.integration.flavors``: importing it adds ``BENCH_FLAVOR`` to torchtitan's Qwen3 flavors (nothing
else imports it, so no other run sees the flavor).
With 4 layers the model has about 3.1e9 parameters (2.4e9 in routed experts): fp32 weights, gradients and
AdamW state take about 50 GB, which leaves room for activations at 8k tokens per step on a 141 GB H200.
"""

import dataclasses

from torchtitan.models.qwen3 import qwen3_args

BASE_FLAVOR = "30B-A3B"
BENCH_FLAVOR = "30B-A3B-4layers"
BENCH_LAYERS = 4


def register() -> None:
    """Add BENCH_FLAVOR to torchtitan's Qwen3 flavor table (idempotent)."""
    if BENCH_FLAVOR in qwen3_args:
        return
    base = qwen3_args[BASE_FLAVOR]
    # a fresh MoEArgs too: update_from_config mutates moe_args in place, which must not reach the 48-layer flavor
    qwen3_args[BENCH_FLAVOR] = dataclasses.replace(base, n_layers=BENCH_LAYERS, max_seq_len=4096,
                                                   moe_args=dataclasses.replace(base.moe_args))


register()
