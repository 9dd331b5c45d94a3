"""torchtitan 0.2.2 against 0.3.0 on the same recipe: the losses of four runs, written to docs/results/tt03_parity.md
(--docs). Run it with the Python that has torchtitan 0.2.2, after `bash scripts/setup_tt03.sh`:

    python -m scripts.tt03_losses [--steps 4] [--out outputs/tt03_losses] [--docs]

The runs (each through scripts/step_dump.py, so every step's loss and the step-1 gradients are recorded):
- 0.2.2 as written;
- 0.3.0 as written (its own initial weights and batches);
- 0.3.0 starting from the 0.2.2 run's weights, trained on its batches;
- the same with 0.2's attention at these lengths (RoPE without YaRN).
The last should repeat 0.2.2 to float tolerance (tests/test_tt03_parity.py pins it at one step).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from scripts import results_page
from scripts.provenance import REPO

RECIPE = "deepseek_v3_debugmodel_nvfp4_four_over_six"
TT03 = REPO / ".venv-tt03" / "bin" / "python"


def overrides(steps: int) -> list[str]:
    return ["--training.steps", str(steps), "--training.local_batch_size", "4", "--training.seq_len", "128",
            "--training.mixed_precision_param", "float32", "--lr_scheduler.warmup_steps", "2",
            "--metrics.log_freq", "1"]


def dump(python: str, record: Path, load: list[str], recipe: list[str], steps: int) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [python, "-m", "scripts.step_dump", str(record), *load, "--", *recipe, *overrides(steps)]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {run.returncode}:\n{run.stdout[-3000:]}")
    return torch.load(record, weights_only=True), time.monotonic() - start


def grad_norm(grads: dict[str, torch.Tensor]) -> float:
    return torch.stack([g.float().norm() for g in grads.values()]).norm().item()


def table(rows: list[tuple[str, list[float], float, float]], reference: list[float]) -> str:
    """Rows of (run, losses, step-1 gradient norm, wall s); the last column: max relative difference to `reference`."""
    steps = len(reference)
    head = ["run", *(f"loss {i + 1}" for i in range(steps)), "step-1 grad norm", "max rel. diff. to 0.2.2", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, losses, norm, wall in rows:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        lines.append(f"| {name} | " + " | ".join(f"{x:.5f}" for x in losses) + f" | {norm:.4f} | {diff:.1e} | "
                     f"{wall:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("outputs/tt03_losses"))
    p.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    a = p.parse_args(argv)
    if not TT03.exists():
        p.error(f"{TT03} is missing: run `bash scripts/setup_tt03.sh` first")
    a.out.mkdir(parents=True, exist_ok=True)
    tt02 = ["--job.config_file", f"configs/{RECIPE}.toml", "--job.dump_folder", str(a.out / "tt02")]
    tt03 = ["--module", "titan_fp4six.integration.tt03", "--config", RECIPE, "--dump_folder", str(a.out / "tt03")]
    ref_file = a.out / "tt02.pt"
    runs = [("0.2.2", sys.executable, ref_file, [], tt02),
            ("0.3.0", str(TT03), a.out / "tt03.pt", [], tt03),
            ("0.3.0, 0.2.2's weights and batches", str(TT03), a.out / "tt03_loaded.pt", [str(ref_file)], tt03),
            ("0.3.0, 0.2.2's weights and batches, RoPE without YaRN", str(TT03), a.out / "tt03_no_yarn.pt",
             [str(ref_file), "--no-yarn"], tt03)]
    rows = []
    for name, python, record, load, recipe in runs:
        result, wall = dump(python, record, load, recipe, a.steps)
        rows.append((name, [x.item() for x in result["losses"]], grad_norm(result["grads"]), wall))
    text = table(rows, rows[0][1])
    print(text)
    if a.docs:
        results_page.write_section("tt03_parity.md", "tt03-losses", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
