"""Compile the quantizer kernel variants that tests, benchmarks and training launch, in parallel processes,
filling Triton's on-disk cache so they start without compiling large unrolled kernels one after another: the
public quantizers' (input dtype x 1x16/16x16 x mae/mse x B x decode, and standard NVFP4 with and without
decode; each with one amax per tensor and with one per row, writing the map-to-4 mask; the columnwise 4/6 and
NVFP4 variants) and the GEMM ops' (bf16, fused with the decode, no mask or the map-to-4 count, by token group
or per row for a grouped GEMM's activations; columnwise without a mask).

    python scripts/warm_quantize_kernels.py [--jobs 16]
"""

import argparse
import itertools
from concurrent.futures import ProcessPoolExecutor

DTYPES = ("bfloat16", "float16", "float32")
KNOBS = list(itertools.product(("mae", "mse"), (256, 448)))
# (dtype, kind, err_mode, bound, decode, amax per row, map4: "mask", "none" or "count", token groups: None,
# "group" or "row")
VARIANTS = [(dtype, block, *knobs, decode, row_amax, "mask", None) for dtype in DTYPES for row_amax in (False, True)
            for block, knobs, decode in itertools.product(("1x16", "16x16"), KNOBS, (False, True))]
VARIANTS += [(dtype, "nvfp4", None, 448, decode, row_amax, "mask", None) for dtype in DTYPES
             for row_amax in (False, True) for decode in (False, True)]
# Columnwise (x^T read in place; one amax per tensor): 4/6 with every knob pair and NVFP4, with and without decode.
VARIANTS += [(dtype, "columnwise", *knobs, decode, False, "mask", None) for dtype in DTYPES for knobs in KNOBS
             for decode in (False, True)]
VARIANTS += [(dtype, "nvfp4_columnwise", None, 448, decode, False, "mask", None) for dtype in DTYPES
             for decode in (False, True)]
# The ops' forward (map-to-4 counted on logged steps), grouped activations and the quantized backward's columnwise.
VARIANTS += [("bfloat16", block, *knobs, True, False, map4, None) for block in ("1x16", "16x16") for knobs in KNOBS
             for map4 in ("none", "count")]
VARIANTS += [("bfloat16", "1x16", *knobs, True, False, map4, groups) for knobs in KNOBS for map4 in ("none", "count")
             for groups in ("group", "row")]
VARIANTS += [("bfloat16", "columnwise", *knobs, True, False, "none", None) for knobs in KNOBS]


def _compile(variant) -> str:
    import torch

    from titan_fp4six.kernels import quantize as kq
    from titan_fp4six.numerics.formats import map4_count_buffer
    from titan_fp4six.numerics.reference import RowGroups
    from titan_fp4six.numerics.spec import NVFP4, four_over_six_spec

    dtype, block, err_mode, bound, decode, row_amax, map4, groups = variant
    x = torch.ones(16, 16, device="cuda", dtype=getattr(torch, dtype))
    amax = torch.ones(16 if row_amax or groups == "row" else 1 if groups else (), device="cuda")
    mask = {"mask": True, "none": False, "count": map4_count_buffer("cuda")}[map4]
    if groups:
        groups = RowGroups(torch.zeros(16, dtype=torch.int64, device="cuda"), 1, amax_by_group=groups == "group")
    if block == "columnwise":
        kq.quantize_columnwise(x, amax, four_over_six_spec("1x16", err_mode, bound, True), decode, map4=mask)
    elif block == "nvfp4_columnwise":
        kq.quantize_columnwise(x, amax, NVFP4, decode)
    elif block == "nvfp4":
        kq.quantize(x, amax, NVFP4, decode)
    else:
        kq.quantize(x, amax, four_over_six_spec(block, err_mode, bound, True), decode, groups=groups, map4=mask)
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
