"""The Triton quantizer kernels on the CPU through Triton's interpreter, bitwise against the reference.

A thin sample (the full sweep runs on the GPU, test_kernels_gpu.py); it runs in a subprocess because
TRITON_INTERPRET is read when the kernels are defined.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_interpreted_kernels_match_reference():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.interp_sweep"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("configs")]
    assert proc.returncode == 0 and summary, proc.stdout + proc.stderr[-3000:]
    assert int(summary[0].split()[1]) >= 8
