"""The Triton kernels on the CPU through Triton's interpreter, bitwise against the reference.

Thin samples (the full sweeps run on the GPU: test_kernels_gpu.py, test_kernels_operands_gpu.py): the
quantizers (tests/helpers/interp_sweep.py) and the operand kernels: fused NVFP4 quantize-decode, columnwise
quantization, decode, map-to-6 only (tests/helpers/interp_sweep_operands.py). Each runs in a subprocess
because TRITON_INTERPRET is read when the kernels are defined.
"""

import pytest

from tests.helpers.interpreter import configs_checked


@pytest.mark.parametrize("module, least_configs, timeout", [("interp_sweep", 8, 600),
                                                            ("interp_sweep_operands", 40, 900)])
def test_interpreted_kernels_match_reference(module, least_configs, timeout):
    assert configs_checked(module, timeout) >= least_configs
