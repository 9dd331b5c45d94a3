"""How long the README's commands take; writes the tables of docs/results/commands.md (--docs).

    python -m scripts.time_commands [--only readme,tools,gpu] [--workdir DIR] [--docs]

readme: clones this checkout's HEAD into WORKDIR (default: a new temporary folder), makes a new venv there and runs
        the two commands a newcomer runs, in order: `bash scripts/test.sh`, then `bash scripts/train.sh`.
tools:  in this checkout: the dry run of the 30B RL recipe and the README's two-process GRPO command on the CPU.
gpu:    `bash scripts/gpu_tests.sh` (needs CUDA).
Each row: the command, its wall time and what it ran (pytest's summary lines, the loss, the dry run's verdict).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts import results_page
from scripts.provenance import REPO

PAGE = "commands.md"
PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in ([\d.]+)s", re.M)
WARNINGS = re.compile(r",? \d+ warnings?")
TEST_STAGES = ("the suite", "the 0.3 stage", "vLLM generator and export", "vLLM plugin")  # scripts/test.sh's order
LOSS = re.compile(r"step:\s*(\d+)\b.*?\bloss:\s*(-?[\d.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RL_RECIPE = "configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml"
RL_30B = "configs/rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six.toml"
# The README's GRPO command on 2 CPU processes, as written there.
RL_CPU = (f"torchrun --nproc_per_node 2 -m titan_fp4six.rl --job.config_file {RL_RECIPE} --model.flavor tiny "
          "--training.mixed_precision_param float32 --training.steps 2 --rl.prompts_per_step 4 --rl.group_size 4 "
          "--metrics.log_freq 1 --parallelism.data_parallel_shard_degree 2 --job.dump_folder ./outputs/rl_cpu")


def duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s} s" if minutes else f"{s} s"


def pytest_stages(log: str, names: tuple[str, ...] = ()) -> str:
    """pytest's summary lines in the order the stages ran, named by `names` where given, warnings left out:
    `the suite: 1185 passed, 162 skipped (8 min 41 s)`."""
    stages = PYTEST_SUMMARY.findall(ANSI.sub("", log))
    return "; ".join((f"{names[i]}: " if i < len(names) else "") + f"{WARNINGS.sub('', what)} ({duration(float(s))})"
                     for i, (what, s) in enumerate(stages))


def losses(log: str) -> str:
    steps = [(int(s), float(v)) for s, v in LOSS.findall(ANSI.sub("", log))]
    if not steps:
        return "no step lines"
    return f"{steps[-1][0]} steps, loss {steps[0][1]:.2f} -> {steps[-1][1]:.2f}"


def last_line(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def timed(command: str, cwd: Path, env: dict | None = None) -> tuple[float, str, int]:
    """Run a shell command; its wall time, its stdout + stderr, its exit status (echoed as it runs)."""
    print(f"$ {command}   (in {cwd})", file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(command, shell=True, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = []
    for line in proc.stdout:
        sys.stderr.write(line)
        out.append(line)
    return time.monotonic() - start, "".join(out), proc.wait()


def row(command: str, seconds: float, what: str, rc: int) -> str:
    status = "" if rc == 0 else f" **exit {rc}**"
    return f"| `{command}` | {duration(seconds)}{status} | {what} |"


def table(rows: list[str]) -> str:
    return "\n".join(["| command | wall time | what it ran |", "| --- | --- | --- |", *rows])


def readme_rows(workdir: Path) -> list[str]:
    """The two commands in a clean clone with a new venv, as a newcomer runs them."""
    clone = workdir / "titan_fp4six"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    venv = clone / ".venv" / "bin"
    env = {**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv.parent),
           "PYTHON": str(venv / "python")}
    env.pop("PYTHONPATH", None)
    rows = []
    seconds, log, rc = timed("bash scripts/test.sh", clone, env)
    stages = pytest_stages(log, TEST_STAGES) or last_line(log)
    rows.append(row("bash scripts/test.sh", seconds, f"in a new venv: {stages}", rc))
    seconds, log, rc = timed("bash scripts/train.sh", clone, env)
    rows.append(row("bash scripts/train.sh", seconds, f"then, in that venv: {losses(log)}", rc))
    return rows


def tool_rows() -> list[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    dry = f"python -m titan_fp4six.dry_run --rl --nproc 8 --job.config_file {RL_30B}"
    seconds, log, rc = timed(dry.replace("python", sys.executable, 1), REPO, env)
    rows = [row(dry, seconds, last_line(log), 0 if rc in (0, 1) else rc)]  # exit 1: a rank does not fit (a verdict)
    torchrun = RL_CPU.replace("torchrun", f"{sys.executable} -m torch.distributed.run", 1)
    seconds, log, rc = timed(torchrun, REPO, env)
    rows.append(row(RL_CPU, seconds, f"2 CPU processes (gloo), start-up included: {losses(log)}", rc))
    return rows


def gpu_rows(workdir: Path) -> list[str]:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--only gpu needs a CUDA device")
    command = "bash scripts/gpu_tests.sh OUT_DIR"
    seconds, log, rc = timed(command.replace("OUT_DIR", str(workdir / "gpu_tests")), REPO)
    return [row(command, seconds, pytest_stages(log) or last_line(log), rc)]


SECTIONS = {"readme": "readme-commands", "tools": "tool-commands", "gpu": "gpu-tests"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="readme,tools", help="comma-separated: readme, tools, gpu (default readme,tools)")
    p.add_argument("--workdir", type=Path, help="where the clean clone goes (default: a new temporary folder)")
    p.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown {unknown}; valid: {sorted(SECTIONS)}")
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="time_commands_"))
    workdir.mkdir(parents=True, exist_ok=True)
    builders = {"readme": lambda: readme_rows(workdir), "tools": tool_rows, "gpu": lambda: gpu_rows(workdir)}
    failed = False
    for part in parts:
        rows = builders[part]()
        failed |= any("**exit" in r for r in rows)
        text = table(rows)
        print(text)
        if a.docs:
            results_page.write_section(PAGE, SECTIONS[part], text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
