"""Run by test_kernels_interp in a subprocess with TRITON_INTERPRET=1: kernels vs reference on the CPU.

Prints one line per mismatching configuration and a final `configs N mismatches M` line.
"""

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from tests.helpers.kernel_cases import (cases, compare, compare_expert_amax, expert_weight_case,  # noqa: E402
                                        few_programs, near_tie_case)
from titan_fp4six.quant import row_amax, tensor_amax  # noqa: E402
from titan_fp4six.kernels import quantize as kq  # noqa: E402

SHAPES = [(16, 32), (3, 48)]
KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "tiny_amax")


def main() -> int:
    configs = mismatches = 0
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    # Every 11th case (11 is prime to the case grid's periods, so dtypes, kinds, blocks and amax modes all
    # rotate through), alternating the knob pairs: a thin but complete sample that runs in CI time.
    for index, (label, x, amax, block) in enumerate(cases(SHAPES, dtypes, KINDS)):
        if index % 11:
            continue
        err_mode, bound = (("mse", 448), ("mae", 256))[configs % 2]
        configs += 1
        bad = compare(kq, x, amax, block, err_mode, bound)
        if bad:
            mismatches += 1
            print("MISMATCH", label, err_mode, bound, bad)
    # Nearly tied candidate errors at every distance: where the fast path's error bounds have the least room.
    for block, err_mode, bound in (("1x16", "mse", 256), ("16x16", "mae", 448)):
        x, amax = near_tie_case(block, err_mode, bound, count=8)
        configs += 1
        bad = compare(kq, x, amax, block, err_mode, bound)
        if bad:
            mismatches += 1
            print("MISMATCH near ties", block, err_mode, bound, bad)
    # Programs of several chunks, some of them redone exactly after the chunk loop: the near ties laid out in
    # long rows (16x16: tiles side by side), with the floor on the number of programs lowered so that each
    # program takes up to 8 chunks, as on a GPU-sized input.
    with few_programs(kq):
        for block, err_mode, bound in (("1x16", "mse", 256), ("16x16", "mse", 448)):
            x, amax = near_tie_case(block, err_mode, bound, count=8)
            x = x.reshape(1, -1) if block == "1x16" else x.reshape(-1, 16, 256).transpose(0, 1).reshape(16, -1)
            nblk = x.shape[1] // 16
            launch = kq.LAUNCH[block, False]
            assert kq._chunks_per_program(-(-nblk // launch.blocks), 1, launch.most_chunks) > 1
            configs += 1
            bad = compare(kq, x, amax, block, err_mode, bound)
            if bad:
                mismatches += 1
                print("MISMATCH multi-chunk near ties", block, err_mode, bound, bad)
    # Expert weights: one amax per expert's run of rows, read as a scalar per 16x16 tile row.
    for rows_per_expert in (16, 32):
        configs += 1
        bad = compare_expert_amax(kq, *expert_weight_case(rows_per_expert), "mse", 256)
        if bad:
            mismatches += 1
            print("MISMATCH expert amax", rows_per_expert, bad)
    # Short rows: 24 and 48 blocks, which the one-row launches run as chunks of 8 and 16 blocks over 4 and 2 rows a
    # warp (the last warp's rows partly past R), with a per-tensor and a per-row amax, in several chunks a program.
    with few_programs(kq):
        for rows, cols in ((5, 384), (9, 768)):
            x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)).to(torch.bfloat16)
            launch = kq._row_launch(kq.LAUNCH["1x16", False], cols // 16)
            assert launch.rows > 1 and kq._chunks_per_program(cols // 16 // launch.blocks, -(-rows // launch.rows),
                                                              launch.most_chunks) > 1
            for amax, err_mode in ((tensor_amax(x), "mse"), (row_amax(x), "mae")):
                configs += 1
                bad = compare(kq, x, amax, "1x16", err_mode, 448)  # B=448: plain NVFP4's kernel too
                if bad:
                    mismatches += 1
                    print("MISMATCH short rows", rows, cols, tuple(amax.shape), bad)
    # Rows that are 4- but not 16-byte aligned: the kernels' word-at-a-time path instead of vector accesses.
    for dtype, offset in ((torch.bfloat16, 2), (torch.float32, 1)):
        full = torch.randn(16, 64 + 2 * offset).to(dtype)
        x = full[:, offset:offset + 64]
        configs += 1
        bad = compare(kq, x, tensor_amax(x), "16x16", "mse", 256) + compare(kq, x, tensor_amax(x), "1x16", "mae", 448)
        if bad:
            mismatches += 1
            print("MISMATCH unaligned rows", dtype, bad)
    # The scalar shortcuts on a stride through their inputs and one whole binade (the GPU test takes every one).
    from tests.helpers.rounding_kernels import FINITE, TOP
    from tests.helpers.rounding_kernels import mismatches as rounding_mismatches
    one = int(torch.tensor(1.0).view(torch.int32))
    bad_roundings = (rounding_mismatches(0, TOP + 1, 4099, "cpu") + rounding_mismatches(0, FINITE, 65537, "cpu")
                     + rounding_mismatches(one, one + (1 << 23), 1, "cpu"))
    if bad_roundings:
        mismatches += 1
        print("MISMATCH roundings", bad_roundings)
    print("configs", configs, "mismatches", mismatches)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
