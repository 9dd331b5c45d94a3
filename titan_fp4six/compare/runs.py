"""Train every (variant, seed) of a comparison through the plugin's launcher and read the step lines back.

Why subprocesses of ``python -m titan_fp4six.train`` (started by integration/launch.py, as the lab's runs are): the comparison must measure the trainer users run
(converters, data loader, optimizer, deterministic settings), and one process per run keeps torch.distributed
and the CPU launcher's patches apart. Several runs share one GPU when its memory allows (the debug models use
a few GiB of 141 and are host-bound), one at a time on the CPU. A finished run leaves ``<log>.exit``; a run
whose log, command and exit file are already there is not trained again, so a study can be spread over several
invocations (machine sessions) with the same command.
"""

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..integration.launch import start_training, stop, training_command

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<!validate )step:\s*(\d+)\s+(.*)$")
_PAIR = re.compile(r"([A-Za-z_][\w/()%-]*):\s*(-?[0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?\d+)?|nan|inf|-inf)")
_MEMORY = re.compile(r"memory:\s*([0-9.]+)GiB")


def parse_steps(text: str) -> list[dict[str, float]]:
    """Every torchtitan step line of a log as {"step": n, "loss": ..., "grad_norm": ..., "memory": GiB, ...}."""
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        m = _STEP.search(line)
        if not m or "loss:" not in m.group(2):
            continue
        row = {"step": int(m.group(1))}
        for key, value in _PAIR.findall(m.group(2)):
            row[key] = float(value.replace(",", ""))
        rows.append(row)
    return rows


@dataclass
class Job:
    """One training of the plan: variant, seed, its command and log."""

    variant: str
    seed: int
    command: list[str]
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started: float = 0.0

    @property
    def exit_file(self) -> Path:
        return self.log.with_suffix(".exit")

    def header(self) -> str:
        """The log's first line: the command, with the interpreter as `python` (machines differ in its path)."""
        return "# " + shlex.join(["python", *self.command[1:]]) + "\n"

    def done_before(self) -> bool:
        """Trained to the end by an earlier invocation with the same command (exit 0 recorded); a failed,
        stopped or killed run is trained again."""
        if self.exit_code() != 0 or not self.log.is_file():
            return False
        with open(self.log) as f:
            return f.readline() == self.header()

    def exit_code(self) -> int | None:
        return int(self.exit_file.read_text().split()[0]) if self.exit_file.is_file() else None


def command(config: Path, seed: int, steps: int, dump: Path, common: list[str], overrides: list[str]) -> list[str]:
    """The launcher's command line: deterministic algorithms, every step logged, the seed, then the user's
    overrides (the variant's last, so they win)."""
    return training_command(["--job.config_file", str(config), "--training.steps", str(steps), "--debug.seed",
                             str(seed), "--debug.deterministic", "--metrics.log_freq", "1",
                             "--metrics.disable_color_printing", "--job.dump_folder", str(dump), *common, *overrides])


def device_memory_gib() -> float | None:
    """Total memory of GPU 0, or None without CUDA (then runs go one at a time)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2 ** 30


class Scheduler:
    """Runs jobs at most `jobs` at a time; on a GPU also no more than fit in `memory_fraction` of its memory,
    judged from the peak reserved memory the runs' step lines report (one run alone until the first report)."""

    def __init__(self, jobs: int, device_gib: float | None, timeout: float, memory_fraction: float = 0.85,
                 echo=print):
        self.jobs, self.device_gib, self.timeout = jobs, device_gib, timeout
        self.memory_fraction, self.echo = memory_fraction, echo
        self.per_run_gib: float | None = None

    def limit(self) -> int:
        if self.device_gib is None:
            return 1
        if self.per_run_gib is None:
            return 1
        return max(1, min(self.jobs, int(self.memory_fraction * self.device_gib / self.per_run_gib)))

    def _start(self, job: Job, threads: int) -> None:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.exit_file.unlink(missing_ok=True)
        threads_env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(threads)}
        job.proc = start_training(job.command, job.log, header=job.header(), env=threads_env)
        job.started = time.monotonic()

    def _read_memory(self, running: list[Job]) -> None:
        for job in running:
            with open(job.log, "rb") as f:  # the newest step lines only: this runs twice a second per run
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4000))
                found = _MEMORY.findall(f.read().decode(errors="replace"))
            if found:
                gib = max(map(float, found))
                self.per_run_gib = max(self.per_run_gib or 0.0, gib)

    def _finish(self, job: Job, code: int, done: int, total: int) -> None:
        job.exit_file.write_text(f"{code}\n")
        rows = parse_steps(job.log.read_text(errors="replace"))
        last = rows[-1] if rows else {}
        loss = f"loss {last['loss']:.4f}" if "loss" in last else "no step logged"
        self.echo(f"[compare] {done}/{total} {job.variant} seed {job.seed}: exit {code}, "
                  f"{len(rows)} steps, {loss}, {time.monotonic() - job.started:.0f} s")

    def run(self, jobs: list[Job]) -> None:
        todo = [j for j in jobs if not j.done_before()]
        for j in jobs:
            if j not in todo:
                self.echo(f"[compare] {j.variant} seed {j.seed}: done by an earlier invocation ({j.log.name})")
        total, running = len(todo), []
        threads = max(1, (os.cpu_count() or 1) // max(1, min(self.jobs, total or 1)))
        try:
            self._loop(todo, running, total, threads)
        finally:  # stopped (Ctrl-C, SIGTERM): no training outlives the comparison; unfinished runs get no exit file
            for job in running:
                job.proc.kill()

    def _loop(self, todo: list[Job], running: list[Job], total: int, threads: int) -> None:
        done = 0
        while todo or running:
            self._read_memory(running)
            while todo and len(running) < self.limit():
                job = todo.pop(0)
                self._start(job, threads)
                running.append(job)
            time.sleep(0.5)
            for job in list(running):
                code = job.proc.poll()
                if code is None and time.monotonic() - job.started > self.timeout:
                    code = stop(job.proc, grace=30)
                    with open(job.log, "a") as f:
                        f.write(f"\n[compare] stopped after the --timeout of {self.timeout:.0f} s\n")
                if code is not None:
                    running.remove(job)
                    done += 1
                    self._finish(job, code, done, total)
