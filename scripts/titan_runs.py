"""Launch torchtitan trainings through `python -m titan_fp4six.train` and read their step lines back.

Why: the loss-curve and throughput scripts must measure the trainer users run (converters, data loader,
optimizer, compile), not a re-implementation, so they start it as a subprocess and parse the console line
torchtitan prints every `metrics.log_freq` steps (loss, grad_norm, memory, tps, tflops, mfu and any extra
`name: value` pair a plugin appends).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from titan_fp4six.compare.runs import parse_steps  # noqa: F401  (the scripts' step-line reader too)


@dataclass
class Run:
    """One training: a label, a TOML recipe and extra CLI overrides (`--section.key value` pairs)."""

    label: str
    config: str
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str) -> "Run":
        """'LABEL=CONFIG [--section.key value ...]' as given on the command line."""
        if "=" not in spec:
            raise ValueError(f"--run {spec!r}: expected 'LABEL=CONFIG [--section.key value ...]'")
        label, rest = spec.split("=", 1)
        parts = shlex.split(rest)
        if not parts or not parts[0].endswith(".toml"):
            raise ValueError(f"--run {spec!r}: the part after '=' must start with a .toml recipe path")
        return cls(label.strip(), parts[0], parts[1:])

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.label).strip("_")


def runs_parser(argv: list[str], description: str) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """A parser with the shared --out/--run options, the script's own arguments and the common trainer
    overrides (everything after `--`)."""
    own, common = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--run", action="append", default=[], type=Run.parse, help="'LABEL=CONFIG [overrides]'")
    return p, own, common


def command(run: Run, common: list[str]) -> list[str]:
    return [sys.executable, "-m", "titan_fp4six.train", "--job.config_file", run.config, *common, *run.overrides]


def start(run: Run, common: list[str], log: Path) -> subprocess.Popen:
    """Start the training in the background, console to `log`, dump folder outputs/<log name> (runs of one
    recipe side by side must not share it)."""
    common = [*common, "--job.dump_folder", f"outputs/{log.stem}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as f:
        f.write("# " + shlex.join(command(run, common)) + "\n")
        f.flush()
        return subprocess.Popen(command(run, common), stdout=f, stderr=subprocess.STDOUT, env=env)


def wait(proc: subprocess.Popen, timeout: float | None) -> int:
    """Exit status; a run past `timeout` seconds is terminated (its steps so far still count)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
