"""`torchrun --nproc_per_node 2 -m titan_fp4six.rl` on the CPU (gloo): the trainer sharded by torchtitan's FSDP2, a
whole native engine on each rank filled by the packed weight sync, against one process from the same initial
weights, global batch and seeds.

Consistent mode (batch-invariant kernels, FP32) with a KL term, so a rollout depends only on its prompt, its seed
and the weights: step 1's rollouts (tokens and logprobs) are bitwise the one-process run's, and so are step 2's
tokens. Losses, entropies and gradient norms differ by reduction order only (two ranks' sums added, FSDP2's
reduce-scatter of the gradients, whose sum then feeds AdamW): measured <= 8.3e-8 relative for the losses and
<= 8.7e-7 for the gradient norms over 3 steps, asserted <= 1e-5; a wrong normalization (a rank's tokens instead of
the global count) doubles the loss, a group split across ranks changes its advantages.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.helpers import rl_ranks
from tests.helpers.training_harness import REPO

COMMON = ["--rl.prompts_per_step", "2", "--rl.group_size", "4", "--rl.consistent", "--rl.kl_coef", "0.1"]


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    return rl_ranks.seed_checkpoint(tmp_path_factory.mktemp("seed"))


def test_two_ranks_train_as_one_process(seed, tmp_path):
    args = [*COMMON, "--training.steps", "3", *rl_ranks.from_seed(seed)]
    rl_ranks.run(1, tmp_path / "one", *args)
    rl_ranks.run(2, tmp_path / "two", *args)
    one, two = rl_ranks.rollouts(tmp_path / "one"), rl_ranks.rollouts(tmp_path / "two")
    assert sorted(one) == sorted(two) and len(one) == 3 * 8
    assert {r["row"] // 4 for k, r in two.items() if k[0] == 1} == {0, 1}
    for (step, row), r in one.items():
        assert r["prompt"] == two[step, row]["prompt"], (step, row)
        if step <= 2:
            assert r["response"] == two[step, row]["response"], (step, row)
        if step == 1:
            assert r["logprobs"] == two[step, row]["logprobs"], (step, row)
    a, b = rl_ranks.metrics(tmp_path / "one"), rl_ranks.metrics(tmp_path / "two")
    assert [m["ranks"] for m in a] == [1] * 3 and [m["ranks"] for m in b] == [2] * 3
    for x, y in zip(a, b):
        assert x["mismatch_max"] == y["mismatch_max"] == 0.0
        assert x["response_tokens"] == y["response_tokens"] and x["reward"] == y["reward"]
        for key in ("loss", "entropy", "kl_ref", "grad_norm"):
            assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-9), (x["step"], key)
    assert all(m["sync_packed_bytes"] > 0 and m["sync_s"] > 0 for m in b)


def test_expert_parallel_trains_as_one_process(seed, tmp_path):
    """The fast kernels with the experts sharded by expert parallelism (EP 2 inside FSDP2 2; torchtitan's all-to-all
    dispatch runs inside the experts' call during re-scoring): step 1's rollouts have the one-process run's tokens
    (whole engines, the same weights and seeds), and the losses agree to reduction order (measured 4.2e-8
    relative)."""
    args = ["--rl.prompts_per_step", "2", "--rl.group_size", "4", "--training.steps", "2", *rl_ranks.from_seed(seed)]
    rl_ranks.run(1, tmp_path / "one", *args)
    rl_ranks.run(2, tmp_path / "ep", *args, "--parallelism.expert_parallel_degree", "2")
    one, ep = rl_ranks.rollouts(tmp_path / "one"), rl_ranks.rollouts(tmp_path / "ep")
    assert [one[k]["response"] for k in sorted(one) if k[0] == 1] == [ep[k]["response"] for k in sorted(one)
                                                                          if k[0] == 1]
    for x, y in zip(rl_ranks.metrics(tmp_path / "one"), rl_ranks.metrics(tmp_path / "ep")):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5), x["step"]


def test_a_resumed_two_rank_run_equals_the_uninterrupted_one(seed, tmp_path):
    """Prompt and sampling streams, the KL reference (sharded like the policy) and the sharded optimizer come back
    from a step-2 checkpoint: steps 3 and 4 are bitwise the uninterrupted run's, metrics and rollouts, and the
    resumed metrics file holds each step once."""
    args = [*COMMON, "--training.steps", "4", "--checkpoint.enable", "--checkpoint.interval", "2",
            "--checkpoint.folder", "checkpoint", "--checkpoint.initial_load_path", str(seed)]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    rl_ranks.run(2, whole, *args)
    shutil.copytree(whole / "checkpoint" / "step-2", resumed / "checkpoint" / "step-2")
    (resumed / "rl_metrics.jsonl").write_text("".join(
        line for line in (whole / "rl_metrics.jsonl").read_text().splitlines(keepends=True)))  # steps 1-4 there
    rl_ranks.run(2, resumed, *args)
    a, b = rl_ranks.metrics(whole), rl_ranks.metrics(resumed)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for key in ("loss", "reward", "kl_ref", "grad_norm", "response_tokens", "entropy"):
        assert [m[key] for m in b[2:]] == [m[key] for m in a[2:]], key
    ra, rb = rl_ranks.rollouts(whole), rl_ranks.rollouts(resumed)
    assert {k: v for k, v in ra.items() if k[0] > 2} == rb


def _rank_pid(dump, rank: int) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if b"titan_fp4six.rl" in cmd and str(dump).encode() in cmd and f"\0RANK={rank}\0".encode() in b"\0" + env:
            if b"torch.distributed.run" not in cmd:
                return int(pid)
    return None


def test_a_killed_rank_ends_the_run_and_leaves_the_last_checkpoint(seed, tmp_path):
    """SIGKILL one rank after step 2's checkpoint: torchrun ends the other, exits non-zero, nothing hangs; the
    last whole checkpoint resumes."""
    dump = tmp_path / "run"
    args = [*COMMON, "--training.steps", "1000", "--checkpoint.enable", "--checkpoint.interval", "2",
            "--checkpoint.folder", "checkpoint", "--checkpoint.initial_load_path", str(seed)]
    proc = subprocess.Popen(rl_ranks.command(2, dump, *args), cwd=REPO, env={**os.environ, **rl_ranks.ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (dump / "checkpoint" / "step-2" / ".metadata").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no step-2 checkpoint"
            time.sleep(0.5)
        pid = _rank_pid(dump, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err[-3000:]
    steps = sorted(int(p.name.split("-")[1]) for p in (dump / "checkpoint").glob("step-*")
                   if (p / ".metadata").exists())
    last = steps[-1]
    (dump / "rl_metrics.jsonl").unlink(missing_ok=True)
    rl_ranks.run(2, dump, *args[:-6], "--training.steps", str(last + 1), "--checkpoint.enable",
                 "--checkpoint.interval", "1000", "--checkpoint.folder", "checkpoint")
    assert [m["step"] for m in rl_ranks.metrics(dump)] == [last + 1]


def test_a_second_run_into_a_busy_dump_folder_is_refused(tmp_path):
    """The RL launcher locks job.dump_folder as the training launcher does (integration/dump_lock.py)."""
    from titan_fp4six.integration.dump_lock import lock_dump_folder

    lock_dump_folder(tmp_path / "busy")  # this process holds it, as a running job would
    proc = subprocess.run(rl_ranks.command(1, tmp_path / "busy", *COMMON, "--training.steps", "1"), cwd=REPO,
                          env={**os.environ, **rl_ranks.ENV}, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "is in use by another run" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "busy" / "rl_metrics.jsonl").exists()


def test_a_non_finite_step_stops_every_rank(tmp_path):
    """A learning rate that overflows the weights: the reduced loss and grad norm are the same on every rank, so
    both ranks raise at the same step, before its checkpoint, and the run exits non-zero (no rank left waiting)."""
    proc = subprocess.run(rl_ranks.command(2, tmp_path / "run", *COMMON, "--training.steps", "4", "--optimizer.lr",
                                           "1e30", "--lr_scheduler.warmup_steps", "0"),
                          cwd=REPO, env={**os.environ, **rl_ranks.ENV}, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    stops = {line.split("]")[0] for line in out.splitlines() if "FloatingPointError: step" in line}
    assert stops == {"[rank0", "[rank1"}, out[-3000:]


@pytest.mark.parametrize("world, args, match", [
    (2, ["--rl.prompts_per_step", "3"], r"rl.prompts_per_step=3 does not split over 2 ranks"),
    (2, ["--parallelism.tensor_parallel_degree", "2"], r"parallelism.tensor_parallel_degree=2: .*FSDP2"),
    (2, ["--parallelism.expert_parallel_degree", "3"], r"expert_parallel_degree=3 must divide the 2 ranks"),
    (6, ["--rl.prompts_per_step", "6", "--parallelism.expert_parallel_degree", "3"],
     r"expert_parallel_degree=3 must divide the routed experts of model.flavor='tiny' \(8\)"),
    (2, ["--parallelism.expert_parallel_degree", "2", "--rl.consistent"], r"rl.consistent=true with .*expert_par"),
    (2, ["--rl.consistent", "--training.mixed_precision_param", "bfloat16"],
     r"rl.consistent=true on 2 ranks needs training.mixed_precision_param"),
])
def test_layouts_the_trainer_cannot_run_are_refused_at_start(monkeypatch, world, args, match):
    from torchtitan.config.manager import ConfigManager

    from titan_fp4six.rl.trainer import check_rl_job

    monkeypatch.setenv("WORLD_SIZE", str(world))
    job = ConfigManager().parse_args(["--job.config_file", rl_ranks.RECIPE, "--model.flavor", "tiny",
                                      "--parallelism.data_parallel_shard_degree", "-1", *args])
    with pytest.raises(ValueError, match=match):
        check_rl_job(job)


def test_an_engine_kv_cache_too_small_for_one_sequence_is_refused_at_start(monkeypatch):
    from torchtitan.config.manager import ConfigManager

    from titan_fp4six.rl.trainer import check_rl_job

    monkeypatch.setenv("WORLD_SIZE", "1")
    job = ConfigManager().parse_args(["--job.config_file", rl_ranks.RECIPE, "--model.flavor", "tiny",
                                      "--rl.generator", "vllm", "--rl.engine_kv_cache_gib", "1e-6"])
    with pytest.raises(ValueError, match=r"rl.engine_kv_cache_gib=1e-06 holds less than one whole sequence of "
                                         r"model.flavor='tiny' \(9 positions"):
        check_rl_job(job, engine=False)


@pytest.mark.parametrize("args, match", [
    (["--rl.rollouts_file", "rollouts.jsonl"], r"rl.rollouts_file='rollouts.jsonl' must contain '\{rank\}'"),
    (["--rl.engine_kv_cache_gib", "1"], r"rl.engine_kv_cache_gib=1.0 sizes the vLLM engine's KV cache"),
    (["--rl.generator", "vllm", "--rl.engine_kv_cache_gib", "-1"], r"rl.engine_kv_cache_gib=-1.0; it must be >= 0"),
    (["--rl.weight_sync", "fp8"], r"rl.weight_sync='fp8'; valid: 'packed', 'bf16'"),
])
def test_rl_knobs_are_checked_when_the_config_loads(args, match, capsys):
    import re

    from torchtitan.config.manager import ConfigManager

    with pytest.raises(SystemExit):
        ConfigManager().parse_args(["--job.config_file", rl_ranks.RECIPE, *args])
    assert re.search(match, re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().err))
