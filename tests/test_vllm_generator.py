"""`[rl] generator = "vllm"` with real vLLM on the CPU (scripts/test.sh runs this file in .venv-vllm; elsewhere it
skips): the converted layers inside the engine against the trainer's, rollouts against the trainer's re-scoring,
and GRPO end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchtitan.models.qwen3 import Qwen3ModelArgs

from tests.helpers.rl_helpers import score, tiny_args, tiny_model
from titan_fp4six.modules import FourOverSixLinear
from titan_fp4six.modules.experts import _FourOverSixExperts
from titan_fp4six.ops import quantize_grouped_weight
from titan_fp4six.quant.process_state import MAP4_STATS
from titan_fp4six.rl import grpo
from titan_fp4six.rl.experts import is_quantized, rollout_recipe
from titan_fp4six.rl.forward import kernels

pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/setup_vllm.sh makes .venv-vllm)")
from titan_fp4six.rl.vllm_generator import VLLMGenerator, check_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8], [12], [13, 14, 15, 16, 17, 18]]


@pytest.fixture(scope="module")
def engine():
    import titan_fp4six.integration.cpu as cpu

    cpu.apply()  # the router's integer histc on the CPU, as the launcher does
    trainer = tiny_model("row", head_dim=32, linears=True)
    args = Qwen3ModelArgs(moe_enabled=True, **tiny_args(head_dim=32))
    gen = VLLMGenerator(lambda: tiny_model("row", seed=1, head_dim=32, linears=True), args, max_len=64,
                        max_seqs=len(PROMPTS), eos_id=1, dtype=torch.float32, seed=0)
    gen.load_weights(trainer)
    yield trainer, gen
    gen.shutdown()


def _rollout(gen, seed=0, temperature=1.0):
    seeds = torch.randint(0, 2 ** 31 - 1, (len(PROMPTS),), generator=torch.Generator().manual_seed(seed)).tolist()
    return gen.generate(PROMPTS, max_new_tokens=8, stop_ids=(1,), pad_id=1, temperature=temperature, seeds=seeds)


def test_converted_layers_inside_vllm_give_the_trainers_outputs_bitwise(engine):
    trainer, gen = engine
    inside = dict(gen.model.titan.named_modules())
    calls = []
    converted = [n for n, m in inside.items() if isinstance(m, (FourOverSixLinear, _FourOverSixExperts))]
    assert any(".attention.wq" in n for n in converted) and any(n.endswith("moe.experts") for n in converted)
    hooks = [inside[n].register_forward_hook(lambda m, a, o, n=n: calls.append((n, a, o))) for n in converted]
    try:
        _rollout(gen)
    finally:
        for h in hooks:
            h.remove()
    theirs = dict(trainer.named_modules())
    assert {n for n, _, _ in calls} == set(converted)
    with torch.inference_mode(), MAP4_STATS.paused():  # as the engine runs them
        for name, args, out in calls:
            assert torch.equal(theirs[name](*args), out), name


def test_rollouts_are_the_sampling_policys_and_close_to_the_trainers_scores(engine):
    trainer, gen = engine
    ro = _rollout(gen)
    again = _rollout(gen)
    assert torch.equal(ro.tokens, again.tokens) and torch.equal(ro.logprobs, again.logprobs)  # seeded per request
    assert ro.tokens.shape == ro.logprobs.shape == ro.mask.shape == (len(PROMPTS), 8)
    lengths = ro.mask.sum(1)
    for i, n in enumerate(lengths.tolist()):  # the mask is a prefix; a stop token, if any, is its last token
        assert ro.mask[i, :n].all() and not ro.mask[i, n:].any()
        assert (ro.tokens[i, :n - 1] != 1).all() and (n == 8 or ro.tokens[i, n - 1] == 1)
        assert (ro.logprobs[i, n:] == 0).all() and (ro.logprobs[i, :n] < 0).all()
    responses = [ro.tokens[i][ro.mask[i]].tolist() for i in range(len(PROMPTS))]
    trainer_lp = torch.zeros_like(ro.logprobs)
    for i, lp in enumerate(score(trainer, PROMPTS, responses, kernels(False))):
        trainer_lp[i, :len(lp)] = lp
    m = grpo.mismatch(trainer_lp, ro.logprobs, ro.mask)
    # same weights and, row-scaled, the same quantization whatever the batch (the test above); FP32 attention,
    # norms and log-softmax in other kernels and another batch layout: a few FP32 ulps of a logit
    assert m["mismatch_max"] < 1e-4 and m["mismatch_kl"] < 1e-8, m


def test_the_weights_follow_the_trainer_after_a_step(engine):
    trainer, gen = engine
    before = _rollout(gen, temperature=0.5)
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(1.5)
    try:
        gen.load_weights(trainer)
        after = _rollout(gen, temperature=0.5)
        assert not torch.equal(before.logprobs, after.logprobs)
        # the engine serves the experts as the trainer's weights quantize, never quantizing its own
        assert gen.model.expert_cache.refreshes == 0
        for name, experts in gen.model.titan.named_modules():
            if is_quantized(experts):
                served = gen.model.expert_cache.quantized(experts, [])
                for w, qw in zip(("w1", "w2", "w3"), served):
                    want = quantize_grouped_weight(trainer.get_submodule(name).get_parameter(w).transpose(-2, -1),
                                                   recipe=rollout_recipe(experts.recipe))
                    assert torch.equal(qw.codes, want.codes) and torch.equal(qw.amax, want.amax), (name, w)
    finally:
        with torch.no_grad():
            for p in trainer.parameters():
                p.div_(1.5)
        gen.load_weights(trainer)


def test_a_flavor_whose_head_dim_vllm_cannot_run_is_refused_before_building():
    with pytest.raises(ValueError, match=r"model.flavor='x' has head_dim=16, which vLLM's CPU attention"):
        check_engine(Qwen3ModelArgs(head_dim=16), "x", cpu=True)


def test_the_refused_temperatures_are_the_ones_vllm_raises():
    """rl/job_config.py keeps vLLM's floor without importing vLLM: it must follow vLLM's."""
    from vllm import SamplingParams

    from titan_fp4six.rl.job_config import VLLM_MIN_TEMPERATURE

    assert SamplingParams(temperature=VLLM_MIN_TEMPERATURE).temperature == VLLM_MIN_TEMPERATURE
    assert SamplingParams(temperature=VLLM_MIN_TEMPERATURE / 2).temperature == VLLM_MIN_TEMPERATURE


def test_grpo_with_the_vllm_generator_runs_the_readmes_cpu_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "titan_fp4six.rl", "--job.config_file",
           "configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml", "--model.flavor", "tiny",
           "--training.mixed_precision_param", "float32", "--training.steps", "2", "--rl.prompts_per_step", "4",
           "--rl.group_size", "4", "--metrics.log_freq", "1", "--job.dump_folder", str(tmp_path),
           "--rl.generator", "vllm"]
    run = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "rl_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["generator"] == "vllm" for r in rows)
    assert all(r["mismatch_max"] < 1e-4 and r["response_tokens"] > 0 for r in rows), rows
    assert "vllm generator" in run.stdout and "Process group destroyed" in run.stdout


def test_vllm_engines_on_two_ranks_sample_as_one_process(tmp_path):
    """torchrun, 2 gloo ranks, FSDP2 trainer, one in-process vLLM engine per rank fed by the packed weight sync,
    against one process from the same initial weights: step 1's rollouts (same weights, prompts and per-request
    seeds; each engine sees half the requests) have the same tokens and logprobs within 1e-5 (vLLM's CPU kernels
    batch differently), and both runs' trainers re-score them within 1e-4."""
    from tests.helpers import rl_ranks

    seed = rl_ranks.seed_checkpoint(tmp_path / "seed")
    args = ["--rl.generator", "vllm", "--rl.prompts_per_step", "2", "--rl.group_size", "4", "--training.steps", "2",
            *rl_ranks.from_seed(seed)]
    rl_ranks.run(1, tmp_path / "one", *args, timeout=600)
    rl_ranks.run(2, tmp_path / "two", *args, timeout=600)
    one, two = rl_ranks.rollouts(tmp_path / "one"), rl_ranks.rollouts(tmp_path / "two")
    assert sorted(one) == sorted(two)
    for key, r in one.items():
        if key[0] == 1:
            assert r["response"] == two[key]["response"], key
            assert r["logprobs"] == pytest.approx(two[key]["logprobs"], abs=1e-5), key
    rows = rl_ranks.metrics(tmp_path / "two")
    assert all(r["ranks"] == 2 and r["mismatch_max"] < 1e-4 and r["sync_packed_bytes"] > 0 for r in rows), rows
