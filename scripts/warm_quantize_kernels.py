"""Compile every quantizer kernel variant (input dtype x 1x16/16x16 x mae/mse x B x decode, and standard
NVFP4 with and without decode; each with one amax per tensor and with one per row; and the columnwise 4/6 and
NVFP4 variants) in parallel processes, filling Triton's on-disk cache so tests and benchmarks start without
compiling ~110 large unrolled kernels one after another.

    python scripts/warm_quantize_kernels.py [--jobs 16]
"""

import argparse
import itertools
from concurrent.futures import ProcessPoolExecutor

DTYPES = ("bfloat16", "float16", "float32")
VARIANTS = [(dtype, *knobs, row_amax) for dtype in DTYPES for row_amax in (False, True)
            for knobs in itertools.product(("1x16", "16x16"), ("mae", "mse"), (256, 448), (False, True))]
VARIANTS += [(dtype, "nvfp4", None, 448, decode, row_amax) for dtype in DTYPES for row_amax in (False, True)
             for decode in (False, True)]
# Columnwise (x^T read in place; one amax per tensor): 4/6 with every knob pair and NVFP4, with and without decode.
VARIANTS += [(dtype, "columnwise", *knobs, False) for dtype in DTYPES
             for knobs in itertools.product(("mae", "mse"), (256, 448), (False, True))]
VARIANTS += [(dtype, "nvfp4_columnwise", None, 448, decode, False) for dtype in DTYPES for decode in (False, True)]


def _compile(variant) -> str:
    import torch

    from titan_fp4six.kernels import quantize as kq

    dtype, block, err_mode, bound, decode, row_amax = variant
    x = torch.ones(16, 16, device="cuda", dtype=getattr(torch, dtype))
    amax = torch.ones(16 if row_amax else (), device="cuda")
    if block == "columnwise":
        kq.four_over_six_quantize_columnwise(x, amax, err_mode, bound, decode)
    elif block == "nvfp4_columnwise":
        kq.nvfp4_quantize_columnwise(x, amax, decode)
    elif block == "nvfp4":
        (kq.nvfp4_quantize_decode if decode else kq.nvfp4_quantize)(x, amax)
    elif decode:
        kq.four_over_six_quantize_decode(x, amax, block, err_mode, bound)
    else:
        kq.four_over_six_quantize(x, amax, block, err_mode, bound)
    torch.cuda.synchronize()
    return str(variant)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    args = parser.parse_args()
    import multiprocessing
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_compile, VARIANTS))
    print(f"ran {len(done)} quantizer variants (those sharing a kernel, such as 1x16 with either amax, compile once)")


if __name__ == "__main__":
    main()
