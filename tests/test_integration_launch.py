"""integration/launch.py, the one launcher of a training subprocess (titan_fp4six.compare's runs and the lab's
scripts/runs.py): the command in one process or under torchrun, the environment, the log and its header, the
console returned, the timeout. A short Python command stands in for the trainer."""

import subprocess
import sys
import time

import pytest

from titan_fp4six.integration.launch import run_training, start_training, stop, training_command

PRINT_ENV = [sys.executable, "-c", "import os, sys; print(os.environ['PYTHONUNBUFFERED'], os.environ.get('EXTRA')); "
             "print('to stderr', file=sys.stderr); sys.exit(3)"]


def test_the_command_is_the_trainer_in_one_process_or_under_torchrun():
    assert training_command(["--job.config_file", "x.toml"]) == [sys.executable, "-m", "titan_fp4six.train",
                                                                 "--job.config_file", "x.toml"]
    assert training_command(["--a"], nproc=2) == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node=2", "--local-ranks-filter=0", "-m",
                                                  "titan_fp4six.train", "--a"]


def test_a_log_gets_the_header_then_the_console_unbuffered_with_the_extra_environment(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("an earlier run\n")
    proc = start_training(PRINT_ENV, log, header="# the command\n", env={"EXTRA": "x"})
    assert proc.wait(timeout=60) == 3
    assert log.read_text().splitlines() == ["# the command", "1 x", "to stderr"]


def test_without_a_log_the_console_comes_back(tmp_path):
    assert run_training(PRINT_ENV, cwd=tmp_path) == (3, "1 None\nto stderr\n")
    assert run_training(PRINT_ENV, tmp_path / "log") == (3, None)


def test_a_run_past_its_timeout_is_killed_and_says_so(tmp_path):
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_training(sleeper, tmp_path / "log", timeout=2)
    assert time.monotonic() - began < 30 and (tmp_path / "log").read_text() == "started\n"
    proc = start_training(sleeper)
    assert stop(proc, grace=10) != 0
