"""`python -m titan_fp4six.rl` end to end on the CPU (tiny Qwen3 MoE flavor, a few GRPO steps): the step lines,
the metrics file, zero mismatch in consistent mode, and the GRPO math and task on their own."""

import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers.training_harness import CPU_ARGS, REPO
from titan_fp4six.rl import grpo
from titan_fp4six.rl.task import CopyTask, Vocabulary

EMBEDDED = REPO / "titan_fp4six" / "integration" / "embedded"
NVFP4, BF16 = "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml", "rl_grpo_qwen3_moe_debug_bf16.toml"


def test_grpo_runs_on_cpu(tmp_path):
    """The 4/6 recipe in consistent mode with a KL term: every step logs, the mismatch is exactly zero, and packed
    re-scoring (rl.rescoring) trains the same steps as padded re-scoring: step 1's forward quantities bit for bit
    (same weights, the same logprobs), gradients and later steps to FP32 reduction noise (the backward's
    weight-gradient sums run over another token layout)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]), CUDA_VISIBLE_DEVICES="")
    runs = {}
    for rescoring in ("padded", "packed"):
        cmd = [sys.executable, "-m", "titan_fp4six.rl", "--job.config_file", str(REPO / "configs" / NVFP4),
               "--job.dump_folder", str(tmp_path / rescoring), *CPU_ARGS, "--training.steps", "3",
               "--rl.prompts_per_step", "2", "--rl.group_size", "4", "--rl.consistent", "--rl.kl_coef", "0.1",
               "--rl.rescoring", rescoring]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-6000:]
        assert (proc.stdout + proc.stderr).count("mismatch max:") == 3
        runs[rescoring] = [json.loads(line) for line in
                           (tmp_path / rescoring / "rl_metrics.jsonl").read_text().splitlines()]
    steps = runs["padded"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["gen_tps"] > 0 and s["train_tps"] > 0 and 0 <= s["reward"] <= 1 and s["response_tokens"] > 0
        assert s["mismatch_max"] == 0.0 and s["mismatch_kl"] == 0.0 and "kl_ref" in s and s["consistent"]
    for key in ("loss", "reward", "kl_ref", "entropy"):
        assert runs["packed"][0][key] == steps[0][key], key
    for key in ("loss", "grad_norm", "kl_ref", "entropy"):
        assert [s[key] for s in runs["packed"]] == pytest.approx([s[key] for s in steps], rel=1e-4, abs=1e-9), key


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    """Prompts, sampling and the KL reference are checkpointed: steps 3 and 4 resumed from step 2's checkpoint are
    bitwise the uninterrupted run's (they replayed step 1's prompts against a resumed reference before)."""
    import shutil

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]), CUDA_VISIBLE_DEVICES="")
    common = [sys.executable, "-m", "titan_fp4six.rl", "--job.config_file", str(REPO / "configs" / NVFP4), *CPU_ARGS,
              "--training.steps", "4", "--rl.prompts_per_step", "2", "--rl.group_size", "2", "--rl.kl_coef", "0.1",
              "--checkpoint.enable", "--checkpoint.interval", "2", "--checkpoint.folder", "checkpoint"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    proc = subprocess.run([*common, "--job.dump_folder", str(whole)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    shutil.copytree(whole / "checkpoint" / "step-2", resumed / "checkpoint" / "step-2")
    proc = subprocess.run([*common, "--job.dump_folder", str(resumed)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    a = [json.loads(line) for line in (whole / "rl_metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (resumed / "rl_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in b] == [3, 4]
    for key in ("loss", "reward", "kl_ref", "grad_norm", "response_tokens"):
        assert [m[key] for m in b] == [m[key] for m in a[2:]], key


@pytest.mark.parametrize("args, match", [
    (["--rl.temperature", "0"], r"rl.temperature=0.0; it must be > 0 .*every advantage is 0"),
    (["--rl.temperature", "-1"], r"rl.temperature=-1.0; it must be > 0"),
    (["--rl.temperature", "1e-40"], r"rl.temperature=1e-40; use rl.temperature >= 0.001"),
    (["--rl.seed", "-1"], r"rl.seed=-1; it must be an integer in \[0, 2\*\*63\)"),
    (["--rl.seed", "100000000000000000000"], r"rl.seed=100000000000000000000; it must be an integer"),
    (["--rl.top_p", "1.5"], r"rl.top_p=1.5; it must be in \(0, 1\]"),
    (["--rl.group_size", "1"], r"rl.group_size=1; it must be an integer >= 2"),
    (["--rl.task_length", "0"], r"rl.task_length=0; it must be an integer >= 1"),
    (["--rl.clip_eps", "0"], r"rl.clip_eps=0.0 must be > 0"),
    (["--rl.generator", "sglang"], r"rl.generator='sglang'; valid: 'native', 'vllm'"),
    (["--rl.rescoring", "varlen"], r"rl.rescoring='varlen'; valid: 'padded', 'packed'"),
    (["--rl.generator", "vllm", "--rl.consistent"], r"rl.consistent=true with rl.generator='vllm': .* native generator"),
    (["--rl.alphabet="], r"rl.alphabet='': the copy task draws its prompts"),
    (["--rl.generator", "vllm", "--rl.temperature", "0.005"],
     r"rl.temperature=0.005 with rl.generator='vllm': vLLM samples at 0.01 instead .* rl.temperature >= 0.01"),
])
def test_rl_arguments_are_checked_when_the_config_loads(args, match, capsys):
    """top_p and temperature were refused only at the first rollout; temperature 0 trained on zero advantages."""
    from torchtitan.config.manager import ConfigManager

    with pytest.raises(SystemExit) as exit_info:
        ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / NVFP4), *args])
    assert exit_info.value.code == 2
    assert re.search(match, re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().err))


@pytest.mark.parametrize("args, match", [
    (["--rl.task_length", "70"], r"rl.task_length=70: .* take 143 positions, more than training.seq_len=64 .*"
                                 r"rl.task_length <= 30 or training.seq_len >= 143"),
    (["--rl.task_length", "31"], r"take 65 positions, more than training.seq_len=64"),
    (["--model.name", "deepseek_v3", "--model.flavor", "debugmodel"],
     r"titan_fp4six.rl supports model.name = 'qwen3' .*got model.name='deepseek_v3'"),
    (["--model.flavor", "debugmodel_nope"], r"model.flavor='debugmodel_nope' is not a flavor of model.name='qwen3'"),
])
def test_rl_jobs_the_trainer_cannot_run_are_refused_before_it_starts(monkeypatch, args, match):
    """They failed at step 1, after the rollouts: IndexError in the RoPE lookup, AttributeError n_kv_heads."""
    from torchtitan.config.manager import ConfigManager

    from titan_fp4six.rl.trainer import check_rl_job

    monkeypatch.setenv("WORLD_SIZE", "1")
    job = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / NVFP4), *args])
    with pytest.raises(ValueError, match=match):
        check_rl_job(job)
    check_rl_job(ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / NVFP4),
                                             "--rl.task_length", "30"]))  # 63 positions fit


def test_the_vllm_generator_without_vllm_names_the_set_up(monkeypatch):
    import importlib.util

    from torchtitan.config.manager import ConfigManager

    from titan_fp4six.rl.trainer import check_rl_job

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here (tests/test_vllm_generator.py runs it)")
    monkeypatch.setenv("WORLD_SIZE", "1")
    job = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / NVFP4), "--rl.generator", "vllm"])
    with pytest.raises(ValueError, match=r"rl.generator='vllm' needs vLLM .*scripts/setup_vllm.sh.*rl.generator='native'"):
        check_rl_job(job)


def test_the_rl_launcher_refuses_them_before_building_the_model(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "titan_fp4six.rl", "--job.config_file", str(REPO / "configs" / NVFP4),
           "--job.dump_folder", str(tmp_path), *CPU_ARGS, "--rl.task_length", "31"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ValueError: rl.task_length=31" in proc.stderr, proc.stderr[-3000:]
    assert "Building" not in proc.stderr + proc.stdout  # torchtitan's model build never started


def test_the_readmes_cpu_command_runs_two_steps(tmp_path):
    """The README's CPU RL command as written (2 torchrun processes; its dump folder moved to tmp_path), on the
    package's tiny flavor."""
    text = (REPO / "README.md").read_text()
    start = text.index("torchrun --nproc_per_node 2 -m titan_fp4six.rl")
    args = text[start:text.index("```", start)].replace("\\\n", " ").split()
    assert args[0] == "torchrun" and "--model.flavor" in args and "tiny" in args
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *args[1:], "--job.dump_folder", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # a rank's fatal error is printed long before torchrun's summary: keep those lines beside the tail
    fatal = [ln for ln in proc.stderr.splitlines() if any(k in ln for k in ("Fatal", "terminate called", "Error:"))]
    assert proc.returncode == 0, "\n".join(fatal[:20]) + "\n...\n" + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rl_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["ranks"] == 2 for r in rows)


def test_recipes_parse_and_differ_only_in_the_converter():
    from torchtitan.config.manager import ConfigManager

    nvfp4, bf16 = (ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / name)])
                   for name in (NVFP4, BF16))
    assert nvfp4.model.converters == ["quantize.grouped_mm.four_over_six"] and bf16.model.converters == []
    knobs = nvfp4.quantize.grouped_mm.four_over_six
    assert (knobs.activation_scaling, knobs.err_mode, knobs.scale_bound, knobs.weight_block, knobs.backward) == (
        "row", "mse", 256, "1x16", "high_precision")
    assert nvfp4.rl == bf16.rl and not nvfp4.rl.consistent and nvfp4.training.steps == bf16.training.steps


def test_group_advantages_and_clipped_loss():
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="group_size"):
        grpo.group_advantages(torch.ones(3), 2)
    rollout = torch.log(torch.tensor([[0.5, 0.5]]))
    mask = torch.tensor([[True, False]])
    logprobs = rollout.clone().requires_grad_(True)
    loss, stats = grpo.policy_loss(logprobs, rollout, torch.tensor([1.0]), mask, clip_eps=0.2)
    loss.backward()
    assert logprobs.grad[0, 0] < 0 and logprobs.grad[0, 1] == 0  # raise a positive-advantage token; mask holds
    far = (rollout + 1.0).requires_grad_(True)  # ratio e > 1 + eps: clipped, no gradient
    grpo.policy_loss(far, rollout, torch.tensor([1.0]), mask, clip_eps=0.2)[0].backward()
    assert far.grad.abs().sum() == 0
    stats = grpo.mismatch(rollout + torch.tensor([[0.25, 9.0]]), rollout, mask)
    assert stats["mismatch_max"] == 0.25 and stats["mismatch_mean"] == 0.25 and stats["mismatch_kl"] > 0


def test_entropy_bonus_flattens_the_policy():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)
    logprobs = torch.log_softmax(logits, -1)
    picked = logprobs[..., 0]
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = grpo.policy_loss(picked, picked.detach(), torch.tensor([0.0]), mask, clip_eps=0.2,
                                   entropy_coef=0.1, entropies=grpo.entropy(logprobs))
    loss.backward()
    p = logprobs.detach().exp()
    assert stats["entropy"] == pytest.approx(float(-(p * p.log()).sum()))
    assert logits.grad[0, 0, 0] > 0 > logits.grad[0, 0, 2]  # descent lowers the likeliest logit, raises the least
    with pytest.raises(ValueError, match="entropy_coef"):
        grpo.policy_loss(picked, picked.detach(), torch.tensor([0.0]), mask, clip_eps=0.2, entropy_coef=0.1)


def test_copy_task_rewards():
    vocab = Vocabulary.from_tokenizer(EMBEDDED, "0123")
    task = CopyTask(vocab, 2)
    (example,) = task.examples(1, random.Random(0))
    prompt = example.tokens
    assert prompt[0] == vocab.bos and prompt[-1] == vocab.separator and len(prompt) == 4
    target = prompt[1:3]
    assert task.reward(example, [*target, vocab.eos]) == 1.0
    assert task.reward(example, [vocab.eos]) == 0.0
    other = next(s for s in vocab.symbols if s != target[0])
    assert task.reward(example, [other, target[1]]) == 0.5  # no credit for a wrong symbol
    assert task.reward(example, [target[1], target[0]]) == (target[0] == target[1])
    with pytest.raises(ValueError, match="rl.alphabet"):
        Vocabulary.from_tokenizer(EMBEDDED, "0=")


def test_a_resume_drops_the_replayed_steps_and_a_half_written_line(tmp_path):
    from titan_fp4six.rl.trainer import RLTrainer

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "lo')
    RLTrainer._keep_lines_before(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
