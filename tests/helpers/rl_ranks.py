"""Launching `titan_fp4six.rl` under torchrun on the CPU (gloo) for the multi-rank RL tests, and reading its files."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.training_harness import CPU_ARGS, REPO

RECIPE = str(REPO / "configs" / "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml")
ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "CUDA_VISIBLE_DEVICES": "",
       "OMP_NUM_THREADS": "1"}  # 2 single-threaded ranks share CI's 2 cores better than oversubscribed ones
ROLLOUTS = "rollouts/rank{rank}.jsonl"


def command(nproc: int, dump: Path, *args: str) -> list[str]:
    """torchrun with `nproc` local ranks (1: one process, no FSDP) on the RL recipe's tiny flavor."""
    parallel = ["--parallelism.data_parallel_shard_degree", str(nproc)] if nproc > 1 else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
            "titan_fp4six.rl", "--job.config_file", RECIPE, *CPU_ARGS, "--job.dump_folder", str(dump),
            "--rl.rollouts_file", ROLLOUTS, *parallel, *args]


def run(nproc: int, dump: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(nproc, dump, *args), cwd=REPO, env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


def seed_checkpoint(dump: Path, *args: str) -> Path:
    """Initial weights written by one process (DTensor-sharded initialization differs from one device's)."""
    run(1, dump, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", "seed", *args)
    return dump / "seed" / "step-0"


def from_seed(seed: Path) -> list[str]:
    return ["--checkpoint.enable", "--checkpoint.initial_load_path", str(seed), "--checkpoint.interval", str(10**9)]


def metrics(dump: Path) -> list[dict]:
    return [json.loads(line) for line in (dump / "rl_metrics.jsonl").read_text().splitlines()]


def rollouts(dump: Path) -> dict[tuple[int, int], dict]:
    """(step, global row) -> that rollout, from every rank's file."""
    out = {}
    for path in sorted((dump / "rollouts").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out[r["step"], r["row"]] = r
    return out
