"""Quantizer benchmark, all figures from one GPU run.

For each case: the Triton four-over-six quantizer's time, its effective bandwidth (bytes read + written per
second) as a fraction of a device-to-device copy moving the same bytes, its speedup over the pure-PyTorch
reference (and whether their bytes agree), its time relative to the standard NVFP4 kernel, the fused
quantize-decode relative to the quantize alone, and the amax kernels against torch's amax.

Each time is a median of do_bench, the least over --rounds rounds that time the kernels of a case in turn: the
GPU now and then runs one kernel slow for a whole measurement (seen on the NVFP4 kernel: 0.10 instead of 0.08
ms), which would otherwise decide a ratio.

    python scripts/bench_quantize.py [--rep-ms 200] [--rounds 3]
"""

import argparse

import torch
import triton

from titan_fp4six import dispatch
from titan_fp4six.kernels import amax as kamax
from titan_fp4six.kernels import quantize as kq
from titan_fp4six.numerics.spec import NVFP4, OperandSpec
from titan_fp4six.numerics import reference

CASES = (  # (rows, cols, amax mode, block)
    (16384, 7168, "tensor", "1x16"),
    (16384, 7168, "tensor", "16x16"),
    (8192, 5120, "tensor", "1x16"),
    (8192, 5120, "tensor", "16x16"),
    (16384, 7168, "row", "1x16"),
)


def _ms(fn, rep_ms: float) -> float:
    return triton.testing.do_bench(fn, warmup=max(rep_ms / 4, 10), rep=rep_ms, return_mode="median")


def _least_of_rounds(fns: dict, rep_ms: float, rounds: int) -> dict:
    """Each function's median time, the least over `rounds` rounds that time the functions in turn."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], _ms(fn, rep_ms))
    return best


def _copy(nbytes: int):
    """A device-to-device copy that reads nbytes/2 and writes nbytes/2: the same traffic as nbytes moved."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def run_case(rows, cols, mode, block, rep_ms, rounds):
    x = torch.randn(rows, cols, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    amax = dispatch.row_amax(x) if mode == "row" else dispatch.tensor_amax(x)
    n = rows * cols
    quant_bytes = n * 2 + n // 2 + 2 * (n // 16)  # read bf16 x; write codes, scales, map4 (amax is negligible)
    dec_bytes = quant_bytes + n * 2  # plus the bf16 decode
    t = _least_of_rounds({
        "fos": lambda: kq.quantize(x, amax, OperandSpec(block=block)),
        "fused": lambda: kq.quantize(x, amax, OperandSpec(block=block), True),
        "std": lambda: kq.quantize(x, amax, NVFP4),
        "copy_q": _copy(quant_bytes),
        "copy_d": _copy(dec_bytes),
        "amax_kernel": lambda: kamax.row_amax(x) if mode == "row" else kamax.tensor_amax(x),
        "amax_torch": lambda: x.abs().amax(dim=-1 if mode == "row" else None).float(),
    }, rep_ms, rounds)
    fos, fused, std, copy_q, copy_d = t["fos"], t["fused"], t["std"], t["copy_q"], t["copy_d"]
    ref = _ms(lambda: reference.four_over_six_reference(x, amax, block, "mse", 256), rep_ms * 2)
    exact = _same(kq.quantize(x, amax, OperandSpec(block=block))[:3],
                  reference.four_over_six_reference(x, amax, block, "mse", 256))
    print(f"{rows}x{cols} {mode:6s} {block:5s} | 4/6 {fos:7.3f} ms {quant_bytes / fos / 1e6:6.0f} GB/s "
          f"= {copy_q / fos:5.1%} of copy | ref {ref:8.2f} ms x{ref / fos:6.1f} bitwise={exact} | "
          f"NVFP4 {std:6.3f} ms, 4/6 / NVFP4 = {fos / std:4.2f} | fused decode {fused:6.3f} ms "
          f"({copy_d / fused:5.1%} of copy), fused / quantize = {fused / fos:4.2f} | "
          f"amax {t['amax_kernel']:6.3f} ms vs torch {t['amax_torch']:6.3f} ms", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep-ms", type=float, default=200.0, help="timed milliseconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case; each time is the least median")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_quantize.py needs a CUDA device")
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | bf16 input, "
          f"mse, B=256 | least of {args.rounds} rounds' medians of do_bench")
    for case in CASES:
        run_case(*case, args.rep_ms, args.rounds)
    exact_path_cost(args.rep_ms)


def exact_path_cost(rep_ms):
    """The worst case: data outside the fast path's range (an amax so small that every chunk runs the exact
    arithmetic) against the same tensor's fast path."""
    x = torch.randn(16384, 7168, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    amax = dispatch.tensor_amax(x)
    fast = _ms(lambda: kq.quantize(x, amax, OperandSpec()), rep_ms)
    tiny = torch.tensor(1e-30, device="cuda")
    slow = _ms(lambda: kq.quantize(x, tiny, OperandSpec()), rep_ms)
    print(f"16384x7168 1x16, every chunk on the exact path (amax 1e-30): {slow:.3f} ms = "
          f"{slow / fast:.1f}x the fast path")


if __name__ == "__main__":
    main()
