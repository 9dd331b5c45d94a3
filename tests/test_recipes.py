"""Every recipe in configs/ converts exactly the modules it says: each is parsed as torchtitan parses it, its
model built on the meta device and run through its converters, and the set of four-over-six module names (and
their knobs) compared with the list written here."""

from dataclasses import replace
from pathlib import Path

import pytest

from titan_fp4six.integration.dry_run import build_and_convert
from titan_fp4six.quant.recipe import FourOverSixRecipe

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

RL_BASE = FourOverSixRecipe(err_mode="mse", scale_bound=256, weight_block="1x16", activation_scaling="row",
                            backward="high_precision")
ALL_LINEARS = FourOverSixRecipe(err_mode="mse", scale_bound=256, weight_block="16x16", activation_scaling="tensor",
                                backward="auto")
NVFP4_ALL_LINEARS = replace(ALL_LINEARS, scale_bound=448, scope="none")
FULL = FourOverSixRecipe(err_mode="mse", scale_bound=256, weight_block="16x16", activation_scaling="tensor",
                         backward="quantized", gradient_rounding="stochastic", wgrad_rht=True)
NVFP4_FULL = replace(FULL, scale_bound=448, scope="none")


def _experts(layers):
    return {f"layers.{i}.moe.experts" for i in layers}


def _deepseek_linears(layers):
    """Every dense Linear of the DeepSeek-V3 debugmodel's layers except router.gate (q_lora_rank 0: plain wq)."""
    names = set()
    for i in layers:
        names |= {f"layers.{i}.attention.{n}" for n in ("wq", "wkv_a", "wkv_b", "wo")}
        ffn = ["feed_forward"] if i == 0 else ["moe.shared_experts"]
        names |= {f"layers.{i}.{f}.{w}" for f in ffn for w in ("w1", "w2", "w3")}
    return names


def _qwen3_linears(layers):
    """The attention Linears of the Qwen3 MoE debugmodel's layers (no shared experts)."""
    return {f"layers.{i}.attention.{n}" for i in layers for n in ("wq", "wk", "wv", "wo")}


def _full(recipe, linears, experts):
    """A full recipe: every Linear and routed experts of the middle layers, one recipe for both kinds."""
    return {**{n: recipe for n in linears}, **{n: recipe for n in experts}}


EXPECTED = {
    "deepseek_v3_debugmodel_nvfp4_four_over_six.toml": {n: RL_BASE for n in _experts(range(1, 6))},
    "deepseek_v3_debugmodel_nvfp4_four_over_six_dequantized.toml":
        {n: replace(RL_BASE, backward="dequantized") for n in _experts(range(1, 5))},
    "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml":
        {**{n: ALL_LINEARS.resolve(grouped=True) for n in _experts(range(1, 6))},  # modules hold resolved recipes
         **{n: ALL_LINEARS.resolve(grouped=False) for n in _deepseek_linears(range(6))}},
    "qwen3_moe_debug_nvfp4_four_over_six.toml": {n: RL_BASE for n in _experts(range(8))},
    "qwen3_30b_a3b_nvfp4_four_over_six.toml": {n: RL_BASE for n in _experts(range(48))},
    "deepseek_v3_debugmodel_nvfp4_all_linears.toml":
        {**{n: NVFP4_ALL_LINEARS.resolve(grouped=True) for n in _experts(range(1, 6))},
         **{n: NVFP4_ALL_LINEARS.resolve(grouped=False) for n in _deepseek_linears(range(6))}},
    "qwen3_moe_debug_nvfp4.toml": {n: replace(RL_BASE, scale_bound=448, scope="none") for n in _experts(range(8))},
    "qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml":
        {**{n: ALL_LINEARS.resolve(grouped=True) for n in _experts(range(8))},
         **{n: ALL_LINEARS.resolve(grouped=False) for n in _qwen3_linears(range(8))}},
    "qwen3_moe_debug_nvfp4_all_linears.toml":
        {**{n: NVFP4_ALL_LINEARS.resolve(grouped=True) for n in _experts(range(8))},
         **{n: NVFP4_ALL_LINEARS.resolve(grouped=False) for n in _qwen3_linears(range(8))}},
    "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml": {n: RL_BASE for n in _experts(range(8))},
    "rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six.toml": {n: RL_BASE for n in _experts(range(48))},
    "deepseek_v3_debugmodel_nvfp4_four_over_six_full.toml":
        _full(FULL, _deepseek_linears(range(1, 5)), _experts(range(1, 5))),
    "deepseek_v3_debugmodel_nvfp4_full.toml": _full(NVFP4_FULL, _deepseek_linears(range(1, 5)), _experts(range(1, 5))),
    "qwen3_moe_debug_nvfp4_four_over_six_full.toml": _full(FULL, _qwen3_linears(range(1, 7)), _experts(range(1, 7))),
    "qwen3_moe_debug_nvfp4_full.toml": _full(NVFP4_FULL, _qwen3_linears(range(1, 7)), _experts(range(1, 7))),
    "rl_grpo_qwen3_moe_debug_bf16.toml": {},
    "deepseek_v3_debugmodel_bf16.toml": {},
    "qwen3_moe_debug_bf16.toml": {},
}


def test_every_recipe_is_listed():
    assert sorted(EXPECTED) == sorted(p.name for p in CONFIGS.glob("*.toml"))


@pytest.mark.parametrize("config", sorted(EXPECTED))
def test_recipe_converts_exactly_what_it_says(config):
    _, _, model = build_and_convert(["--job.config_file", str(CONFIGS / config)])
    converted = {fqn: mod.recipe for fqn, mod in model.named_modules()
                 if isinstance(getattr(mod, "recipe", None), FourOverSixRecipe)}
    assert set(converted) == set(EXPECTED[config])
    assert converted == EXPECTED[config]
