"""Train one recipe on 1 and on N processes with the same global batch and the same initial weights; compare losses.

Why: a parallelism must not change what the quantizers see beyond what it has to (reduction order, per-rank
activation amaxes). Three things make the runs comparable step by step: a seed checkpoint written by one process
and loaded by both runs (DTensor-sharded initialization does not reproduce single-device initialization),
`scripts.parity` (every rank trains on its rows of the one-process global batch), and
local_batch_size = global / N.

  python scripts/parity_runs.py --nproc 2 --global-batch 8 --steps 20 --out /tmp/parity \\
      -- --job.config_file configs/qwen3_moe_debug_nvfp4_four_over_six.toml --parallelism.expert_parallel_degree 2

Arguments after `--` go to `titan_fp4six.train` in every run; `--parallel-args` are added to the N-process run
only (by default `--parallelism.data_parallel_shard_degree N`). Prints one line per step and how far apart the
final weights ended relative to how far they moved (||W_1 - W_N|| / ||W_1 - W_init||), and writes
`<out>/losses.json`. The CPU test tests/test_distributed_parity.py drives the same functions.
"""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

ROOT = Path(__file__).resolve().parents[1]
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-+0-9.eE]+|nan|inf)")
PARITY_IMPORT = "scripts.parity"


def launch(nproc: int, args: list[str], dump: Path, *, env: dict | None = None, timeout: float = 600) -> str:
    """Run `titan_fp4six.train` under torchrun with `nproc` local processes, in the repository root (the recipes'
    paths are relative to it); return rank 0's log (raises on failure)."""
    dump = dump.resolve()
    dump.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--local-ranks-filter=0", "-m", "titan_fp4six.train", *args, "--job.dump_folder", str(dump),
           "--metrics.disable_color_printing"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    (dump / "log.txt").write_text(proc.stdout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; log tail:\n{proc.stdout[-4000:]}")
    return proc.stdout


def losses(log: str) -> dict[int, float]:
    """step -> global average loss, from torchtitan's step lines."""
    return {int(step): float(loss) for step, loss in _STEP.findall(log)}


def seed_checkpoint(args: list[str], dump: Path, **kw) -> Path:
    """One process writes the initial weights (step 0) that both runs load."""
    launch(1, [*args, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", "seed",
               "--parallelism.data_parallel_shard_degree", "1", "--parallelism.expert_parallel_degree", "1"], dump, **kw)
    path = dump.resolve() / "seed" / "step-0"
    if not path.is_dir():
        raise RuntimeError(f"no seed checkpoint at {path}; see {dump / 'log.txt'}")
    return path


def from_seed(seed: Path) -> list[str]:
    """Arguments that start a run from `seed` and save only the final model (fp32), in `<dump>/final`."""
    return ["--checkpoint.enable", "--checkpoint.initial_load_path", str(seed), "--checkpoint.folder", "final",
            "--checkpoint.interval", str(10**9), "--checkpoint.last_save_model_only", "--checkpoint.export_dtype",
            "float32"]


def model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a torchtitan DCP checkpoint, loaded whole in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        state = _load_state_dict_from_keys(checkpoint_id=str(checkpoint))
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def weight_drift(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], init: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||a - init|| over all model tensors: how far apart two runs ended, relative to how far they moved."""
    apart = sum((a[k].double() - b[k].double()).square().sum() for k in a)
    moved = sum((a[k].double() - init[k].double()).square().sum() for k in a)
    return float((apart / moved).sqrt())


@dataclasses.dataclass
class Comparison:
    losses_1: dict[int, float]
    losses_n: dict[int, float]
    drift: float
    """weight_drift of the final models (one process vs N)."""


def compare(args: list[str], parallel_args: list[str], *, nproc: int, global_batch: int, steps: int, out: Path,
            custom_import: str = PARITY_IMPORT, seed: Path | None = None, **kw) -> Comparison:
    """Train `steps` steps on 1 and on `nproc` processes from one seed checkpoint (made unless given) on the same
    global batches. `custom_import` must import PARITY_IMPORT."""
    if global_batch % nproc:
        raise ValueError(f"--global-batch {global_batch} must be a multiple of --nproc {nproc}")
    common = [*args, "--training.steps", str(steps), "--metrics.log_freq", "1",
              "--experimental.custom_import", custom_import]
    if seed is None:
        seed = seed_checkpoint([*common, "--training.local_batch_size", str(global_batch)], out / "seed_run", **kw)
    one = launch(1, [*common, *from_seed(seed), "--training.local_batch_size", str(global_batch)], out / "nproc1", **kw)
    many = launch(nproc, [*common, *from_seed(seed), "--training.local_batch_size", str(global_batch // nproc),
                          *parallel_args], out / f"nproc{nproc}", **kw)
    out = out.resolve()
    final = [model_weights(out / d / "final" / f"step-{steps}") for d in ("nproc1", f"nproc{nproc}")]
    return Comparison(losses(one), losses(many), weight_drift(*final, model_weights(seed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parallel-args", default=None, help="extra arguments of the N-process run (one string)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then titan_fp4six.train arguments")
    opts = parser.parse_args()
    args = [a for a in opts.train_args if a != "--"]
    parallel = (opts.parallel_args.split() if opts.parallel_args is not None
                else ["--parallelism.data_parallel_shard_degree", str(opts.nproc)])
    result = compare(args, parallel, nproc=opts.nproc, global_batch=opts.global_batch, steps=opts.steps,
                     out=opts.out)
    one, many = result.losses_1, result.losses_n
    rows = []
    for step in sorted(one):
        a, b = one[step], many.get(step, float("nan"))
        rows.append({"step": step, "loss_1": a, f"loss_{opts.nproc}": b, "abs_diff": abs(a - b),
                     "rel_diff": abs(a - b) / abs(a)})
        print(f"step {step:3d}  1 proc {a:.5f}  {opts.nproc} procs {b:.5f}  |diff| {abs(a - b):.5f}  "
              f"rel {abs(a - b) / abs(a):.2e}")
    worst = max(rows, key=lambda r: r["rel_diff"])
    print(f"max rel diff {worst['rel_diff']:.2e} at step {worst['step']}; final weights: "
          f"||W_1 - W_{opts.nproc}|| / ||W_1 - W_init|| = {result.drift:.2e}")
    (opts.out / "losses.json").write_text(json.dumps({"steps": rows, "weight_drift": result.drift}, indent=1))


if __name__ == "__main__":
    main()
