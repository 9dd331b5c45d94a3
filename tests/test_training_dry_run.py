"""The Qwen3-30B-A3B recipe's dry run (`python -m titan_fp4six.dry_run`): parse, build on the meta device, convert,
report quantized modules and memory; with --rl, the 30B GRPO recipe's per-rank trainer and engine."""

import re
from pathlib import Path

import pytest

from titan_fp4six import dry_run as tool
from titan_fp4six.integration import dry_run

RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "qwen3_30b_a3b_nvfp4_four_over_six.toml")


def test_qwen3_30b_a3b_dry_run_reports_experts_and_memory(capsys):
    config, model_args, model = dry_run.build_and_convert(["--job.config_file", RECIPE])
    s = dry_run.summarize(model, model_args, config.training.seq_len)
    assert sorted(s.quantized) == [f"layers.{i}.moe.experts" for i in sorted(range(48), key=str)]
    assert all(r.activation_scaling == "row" and r.weight_block == "1x16" and r.backward == "high_precision"
               for _, r in s.quantized.values())
    assert 30e9 < s.total_params < 31e9
    one, eight = (sum(dry_run.estimate_memory(s, config, model_args, n).values()) for n in (1, 8))
    assert one > 16 * s.total_params and eight < one / 4  # fp32 params, grads, AdamW moments, sharded by FSDP
    tool.main(["--job.config_file", RECIPE, "--gpu-memory-gib", "141"])
    out = capsys.readouterr().out
    assert "quantized layers.N.moe.experts: 48 modules" in out and "min GPUs: 8" in out
    assert "activations (AC full) 2.9" in out
    # without activation checkpointing every layer keeps its working set: more GPUs (it was reported as full AC)
    tool.main(["--job.config_file", RECIPE, "--gpu-memory-gib", "141", "--activation_checkpoint.mode", "none"])
    out = capsys.readouterr().out
    assert "activations (AC none)" in out and "min GPUs: 8" not in out and "min GPUs: 4" not in out


def test_the_30b_rl_recipe_passes_its_dry_run_with_vllm_rollouts_and_packed_rescoring(capsys):
    recipe = RECIPE.replace("qwen3_30b_a3b_nvfp4_four_over_six", "rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six")
    config, _, _ = dry_run.build_and_convert(["--job.config_file", recipe])
    assert (config.rl.generator, config.rl.rescoring, config.rl.consistent) == ("vllm", "packed", False)
    tool.main(["--job.config_file", recipe, "--gpu-memory-gib", "141"])
    out = capsys.readouterr().out
    assert "quantized layers.N.moe.experts: 48 modules" in out and "min GPUs: 4" in out
    # --rl: 8 Blackwell GPUs fit (no engine decode of the experts), 8 H200s are over the 90% margin (docs/rl.md)
    assert tool.main(["--rl", "--nproc", "8", "--fp4-gemms", "--job.config_file", recipe]) == 0
    out = capsys.readouterr().out
    assert "on 8 ranks" in out and "engine packed experts" in out and "per rank: 77.7 GiB" in out
    assert tool.main(["--rl", "--nproc", "8", "--job.config_file", recipe]) == 1
    assert "8 ranks need 131.7 GiB each, more than 90% of --gpu-memory-gib 141" in capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    ([], r"--job.config_file RECIPE.toml is required"),
    (["--job.config_file", RECIPE, "--gpu-memory-gib", "-5"], r"--gpu-memory-gib -5: the memory per GPU must be > 0"),
    (["--job.config_file", RECIPE, "--gpu-memory-gib", "0"], r"--gpu-memory-gib 0: the memory per GPU must be > 0"),
    (["--rl", "--job.config_file", RECIPE], r"--rl needs --nproc N >= 1"),
    (["--nproc", "8", "--job.config_file", RECIPE], r"--nproc and --fp4-gemms size a GRPO layout: add --rl"),
    (["--rl", "--nproc", "8", "--job.config_file", RECIPE], r"--rl: the recipe has no \[rl\] section"),
])
def test_dry_run_refuses_a_missing_recipe_and_no_memory(capsys, args, match):
    """Both used to exit 0: a summary of torchtitan's default llama3 job, or "min GPUs: inf"."""
    with pytest.raises(SystemExit) as exit_info:
        tool.main(args)
    assert exit_info.value.code == 2 and re.search(match, capsys.readouterr().err)


def test_dry_run_names_the_valid_flavors():
    with pytest.raises(ValueError, match=r"model.flavor='30B-A3B-nope' is not a flavor of model.name='qwen3'; "
                                         r"valid: .*30B-A3B.*tiny"):
        dry_run.build_and_convert(["--job.config_file", RECIPE, "--model.flavor", "30B-A3B-nope"])
