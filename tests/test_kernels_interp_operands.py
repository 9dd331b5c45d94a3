"""The operand kernels (fused NVFP4 quantize-decode, columnwise quantization, decode) on the CPU through Triton's
interpreter, bitwise against the reference compositions they replace (tests/helpers/interp_sweep_operands.py: one
subprocess, since TRITON_INTERPRET is read when the kernels are defined)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_interpreted_operand_kernels_match_reference():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.interp_sweep_operands"], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("configs")]
    assert proc.returncode == 0 and summary, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert int(summary[0].split()[1]) >= 30
