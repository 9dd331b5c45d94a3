"""Run a tests.helpers module under Triton's interpreter (TRITON_INTERPRET=1) in a subprocess: the variable is
read when the kernels are defined, so it cannot be switched on inside the test process."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOOP_BOUND_BUG = "only 0-dimensional arrays can be converted to Python scalars"
"""Triton 3.6's interpreter cannot take a runtime argument as a loop bound (`tl.range(CHUNKS)`): it indexes the
argument's one-element array as a scalar. Newer interpreters (3.9 in CI) squeeze it first."""


def configs_checked(module: str, timeout: float) -> int:
    """Runs `python -m tests.helpers.<module>` interpreted and returns N from its `configs N` line; fails the test
    with the helper's output when it exits non-zero, skips it on a Triton whose interpreter cannot run the
    kernels (the same kernels are checked on the GPU by the CUDA tests)."""
    triton = pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", f"tests.helpers.{module}"], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if proc.returncode and _LOOP_BOUND_BUG in proc.stderr:
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run the kernels (a runtime loop bound)")
    summary = [line for line in proc.stdout.splitlines() if line.startswith("configs")]
    assert proc.returncode == 0 and summary, proc.stdout[-5000:] + proc.stderr[-3000:]
    return int(summary[0].split()[1])
