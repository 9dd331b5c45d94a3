"""The one launcher of a training subprocess: `python -m titan_fp4six.train ARGS`, or the same under torchrun.

Why one: a comparison (titan_fp4six.compare) and the lab's run drivers (scripts/runs.py) must measure the trainer
users run, started the same way: the interpreter running them, unbuffered output (a log read while the run trains,
or cut by a timeout, holds every line printed so far), the console (stdout and stderr together) into a log file
or returned, and a run past its time stopped. Nothing here imports the package or torchtitan: the trainer runs in
its own process.
"""

import os
import subprocess
import sys
from pathlib import Path

TRAINER = "titan_fp4six.train"


def training_command(args: list[str], nproc: int | None = None) -> list[str]:
    """The trainer's command line: `python -m titan_fp4six.train ARGS` in one process, or with `nproc` under
    torchrun (a standalone rendezvous, `nproc` local ranks, rank 0's console only)."""
    if nproc is None:
        return [sys.executable, "-m", TRAINER, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--local-ranks-filter=0", "-m", TRAINER, *args]


def start_training(command: list[str], log: Path | None = None, *, header: str | None = None,
                   env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start `command` (a training_command) in the background with this process's environment, PYTHONUNBUFFERED=1
    and `env` over it. Its console goes to `log` (truncated; `header` written first) or, without a log, to a pipe
    the caller reads (text)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if log is None:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=cwd)
    with open(log, "w") as f:
        if header is not None:
            f.write(header)
            f.flush()
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)


def run_training(command: list[str], log: Path | None = None, *, timeout: float | None = None,
                 **kwargs) -> tuple[int, str | None]:
    """start_training and wait: (exit status, the console when there is no log). A run past `timeout` seconds is
    killed and subprocess.TimeoutExpired raised, as subprocess.run does."""
    with start_training(command, log, **kwargs) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return proc.returncode, out


def stop(proc: subprocess.Popen, grace: float) -> int:
    """Terminate a training, killing it if it has not exited after `grace` seconds; its exit status."""
    proc.terminate()
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
