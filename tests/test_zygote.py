"""tests/helpers/zygote.py, which the training tests run their subprocesses through, behaves as subprocess.run does:
the same exit status, standard output and error, argv, environment and directory, and a timeout that kills the
child and raises subprocess.TimeoutExpired."""

import os
import subprocess
import sys

import pytest

from tests.helpers import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("module, args", [
    ("json.tool", ["--no-such-flag"]),  # argparse: exit status 2, usage on stderr
    ("platform", []),  # prints to stdout, exit 0
    ("timeit", ["-n", "1", "-r", "1",
                "import os, sys; sys.stdout.write(os.getcwd() + os.environ['ZYGOTE_PROBE'] + chr(10))"]),
])
def test_a_forked_run_equals_a_subprocess(tmp_path, module, args):
    env = dict(os.environ, ZYGOTE_PROBE="-probe")
    want = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    got = zygote.run(module, args, env, str(tmp_path), timeout=60)
    assert (got.returncode, got.stderr) == (want.returncode, want.stderr)
    assert got.stdout.split("\n")[0] == want.stdout.split("\n")[0]  # timeit's second line is a timing


def test_a_run_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run("timeit", ["-n", "1", "-r", "1", "import time; time.sleep(60)"], dict(os.environ), ROOT,
                   timeout=1)
    assert zygote.run("platform", [], dict(os.environ), ROOT, timeout=60).returncode == 0  # the zygote serves on
