"""Run by test_kernels_interp_operands in a subprocess with TRITON_INTERPRET=1: the operand kernels (fused NVFP4
quantize-decode, columnwise quantization, decode) against the reference compositions on the CPU.

    TRITON_INTERPRET=1 python -m tests.helpers.interp_sweep_operands [nvfp4_decode] [columnwise] [decode]  (all: none)

Prints one line per mismatching configuration and a final `configs N mismatches M` line. A thin sample that
keeps the interpreter's time small (few programs per launch); the GPU sweep (test_kernels_operands_gpu.py)
takes realistic shapes.
"""

import os
import sys
import time

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from tests.helpers.kernel_cases import _data, near_tie_case  # noqa: E402
from tests.helpers.operand_cases import (column_case, compare_columnwise, compare_decode, compare_nvfp4_decode,  # noqa: E402
                           decode_case)
from titan_fp4six.kernels import decode as kd  # noqa: E402
from titan_fp4six.kernels import quantize as kq  # noqa: E402
from titan_fp4six.dispatch import tensor_amax  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "tiny_amax", "high_edge", "zero_amax",
         "nan_amax", "inf_amax")
COLUMN_KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "tiny_amax")


def nvfp4_decode(gen):
    """Row-major NVFP4 with its decode: 2 rows (2 programs), 5 blocks a row, every kind and dtype in rotation."""
    for index, kind in enumerate(KINDS):
        dtype = DTYPES[index % 3]
        x, amax = _data(kind, 2, 80, 448, gen)
        x = x.to(dtype)
        amax = (tensor_amax(x) if amax is None else amax).float()
        if index % 4 == 3:  # one amax per row
            amax = torch.stack([amax, amax * 3])
        yield f"nvfp4_decode/{kind}/{dtype}/amax{tuple(amax.shape)}", compare_nvfp4_decode(kq, x, amax)


def columnwise(gen):
    """Columnwise 4/6 (every knob pair, with and without the decode) and NVFP4: ragged M (zero-row padding),
    K not a multiple of anything, rows in wider storage, every kind and dtype in rotation, near ties."""
    knobs = (("mse", 256), ("mae", 448), ("mae", 256), ("mse", 448))
    shapes = ((37, 24, None), (16, 40, None), (5, 20, 29), (21, 31, None))
    for index, kind in enumerate(COLUMN_KINDS):
        dtype = DTYPES[index % 3]
        m, k, stride = shapes[index % len(shapes)]
        err_mode, bound = knobs[index % len(knobs)]
        x, amax = column_case(kind, m, k, dtype, gen, stride)
        bad = compare_columnwise(kq, x, amax, err_mode, bound, decode=index % 2 == 0, nvfp4=index % 3 == 0)
        yield f"columnwise/{m}x{k}/{kind}/{dtype}/{err_mode}/{bound}", bad
    # Near-tied candidate errors, several chunks per program (some redone exactly after the chunk loop).
    floor, kq.MIN_PROGRAMS = kq.MIN_PROGRAMS, 1
    for err_mode, bound, decode in (("mae", 448, True), ):
        x, amax = near_tie_case("1x16", err_mode, bound, count=4)
        x = x.t().contiguous()  # columnwise quantizes x^T: the near-tie blocks
        yield f"columnwise/near ties/{err_mode}/{bound}", compare_columnwise(kq, x, amax, err_mode, bound, decode,
                                                                            nvfp4=False)
    kq.MIN_PROGRAMS = floor


def decode(gen):
    """Both decode kernels on every code byte and edge scales, per-tensor and per-row amax, every output dtype."""
    for rows, cols, edge in ((9, 48, True), (3, 1040, False)):
        codes, scales, amax_rows = decode_case(rows, cols, gen, edge)
        for index, dtype in enumerate(DTYPES):
            for amax in (amax_rows, amax_rows[1].clone(), torch.tensor(float("nan"))):
                bound = (256, 448)[index % 2]
                yield f"decode/{rows}x{cols}/{dtype}/{bound}/amax{tuple(amax.shape)}", compare_decode(
                    kd, codes, scales, amax, bound, dtype)


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    configs = mismatches = 0
    start = time.time()
    sections = {"nvfp4_decode": nvfp4_decode, "columnwise": columnwise, "decode": decode}
    for name in sys.argv[1:] or sections:
        for label, bad in sections[name](gen):
            configs += 1
            print(f"{time.time() - start:6.1f} s {label}", flush=True)
            if bad:
                mismatches += 1
                print("MISMATCH", label, bad)
    print("configs", configs, "mismatches", mismatches)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
