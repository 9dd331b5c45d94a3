"""The Triton kernels on the CPU through Triton's interpreter, bitwise against the reference.

Thin samples (the full sweeps run on the GPU: test_kernels_gpu.py, test_kernels_operands_gpu.py): the
quantizers (tests/helpers/interp_sweep.py) and the operand kernels: fused NVFP4 quantize-decode, columnwise
quantization, decode, map-to-6 only (tests/helpers/interp_sweep_operands.py). Each runs in a subprocess
because TRITON_INTERPRET is read when the kernels are defined.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("module, least_configs, timeout", [("interp_sweep", 8, 600),
                                                            ("interp_sweep_operands", 40, 900)])
def test_interpreted_kernels_match_reference(module, least_configs, timeout):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", f"tests.helpers.{module}"], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("configs")]
    assert proc.returncode == 0 and summary, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert int(summary[0].split()[1]) >= least_configs
