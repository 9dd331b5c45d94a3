"""CPU training through torchtitan's trainer with the plugin (launcher, embedded data, converters): the recipes
train on tiny flavors with finite, falling losses. Subprocess runs via tests/helpers/training_harness.py."""

import math
from pathlib import Path

import pytest

from tests.helpers.training_harness import train

FAST_LR = ["--optimizer.lr", "1e-2"]
FALLING = {"deepseek_v3_debugmodel_nvfp4_four_over_six.toml": 12, "qwen3_moe_debug_nvfp4_four_over_six.toml": 10,
           "deepseek_v3_debugmodel_nvfp4_four_over_six_full.toml": 12}
_NO_FIRST_BF16 = [arg for kind in ("linear", "grouped_mm")
                  for arg in (f"--quantize.{kind}.four_over_six.bf16_first_layers", "0")]
ON_TINY = {name: _NO_FIRST_BF16 for name in ("qwen3_moe_debug_nvfp4_full.toml",
                                            "qwen3_moe_debug_nvfp4_four_over_six_full.toml")}
ON_TINY["rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six.toml"] = ["--parallelism.expert_parallel_degree", "1"]
"""Overrides for the tiny flavor in one process: Qwen3's has 2 layers, which the full recipes' bf16 window (first
and last layer) would cover whole; the 30B recipe's expert parallelism is for 8 ranks."""
RECIPES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))  # tiny models over a dozen steps: a large step size shows learning


def _assert_falls(losses: dict[int, float], first: int, last: int, margin: float) -> None:
    values = [losses[s] for s in sorted(losses)]
    assert all(math.isfinite(v) for v in values), values
    head, tail = sum(values[:first]) / first, sum(values[-last:]) / last
    assert tail < head - margin, f"loss did not fall: first {values[:first]}, last {values[-last:]}"


@pytest.mark.parametrize("config, steps", sorted(FALLING.items()))
def test_four_over_six_recipe_trains_on_cpu(tmp_path, config, steps):
    losses = train(config, tmp_path, "--training.steps", str(steps), *FAST_LR)
    assert sorted(losses) == list(range(1, steps + 1))
    _assert_falls(losses, first=2, last=4, margin=0.3)


@pytest.mark.parametrize("config", [r for r in RECIPES if r not in FALLING])
def test_every_other_recipe_trains_two_steps_on_cpu(tmp_path, config):
    """The remaining recipes (bf16 twins, variants, the 30B recipe on the tiny flavor) run as written for 2 steps
    with 2 x 32 tokens: they parse, convert, train and give finite losses."""
    losses = train(config, tmp_path, "--training.steps", "2", "--training.seq_len", "32",
                   "--lr_scheduler.warmup_steps", "1", *ON_TINY.get(config, []))
    assert sorted(losses) == [1, 2] and all(map(math.isfinite, losses.values())), losses


def test_cached_weights_train_the_same_losses_with_gradient_accumulation(tmp_path):
    """Two micro-batches per step: with cache_weights each weight is quantized once per step and reused by the
    second micro-batch; the converters' post-optimizer hook drops the cache, so every step's losses equal the
    uncached run's bit for bit (a stale weight after a step would change them)."""
    args = ["--training.steps", "4", "--training.global_batch_size", "4", *FAST_LR]
    cache = [f"--quantize.{kind}.four_over_six.cache_weights" for kind in ("linear", "grouped_mm")]
    config = "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"
    plain = train(config, tmp_path / "plain", *args)
    cached = train(config, tmp_path / "cached", *args, *cache)
    assert sorted(plain) == [1, 2, 3, 4] and cached == plain


def test_stochastic_gradient_rounding_repeats_with_the_seed(tmp_path):
    """gradient_rounding = "stochastic" on the dense Linears: the same debug.seed repeats the losses bit for bit
    (the rounding seeds come from it and the step, not from torch's RNG state); against round-to-nearest with the
    same seed (same initial weights) step 1's forward is the same and step 2's loss differs."""
    config = "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"
    args = ["--training.steps", "2", "--debug.seed", "3"]
    stochastic = ["--quantize.linear.four_over_six.gradient_rounding", "stochastic"]
    first = train(config, tmp_path / "a", *args, *stochastic)
    again = train(config, tmp_path / "b", *args, *stochastic)
    nearest = train(config, tmp_path / "c", *args)
    assert sorted(first) == [1, 2] and first == again
    assert nearest[1] == first[1] and nearest[2] != first[2]
