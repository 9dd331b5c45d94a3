"""Operand kernel benchmark (issue 18), all figures from one GPU run: each new kernel against a device copy of
the same bytes (read + written) and against the unfused PyTorch composition it replaces, with a bitwise check
of their outputs.

    python scripts/bench_kernels.py [--rep-ms 100] [--rounds 3]

Cases per shape (bf16 input, per-tensor amax, mse, B=256):
- NVFP4 quantize + decode fused, against the NVFP4 kernel then numerics' PyTorch decode_block_scaled;
- columnwise 4/6 and NVFP4 (x^T read in place), without and with the decode, against pad + transpose +
  contiguous, then the row-major kernel (fused with the decode where the columnwise one is);
- decode_block_scaled and nvfp4_dequantize (bf16 out) kernels, against numerics' PyTorch versions.
Times are medians of do_bench, the least over --rounds rounds (bench_quantize.py says why).
"""

import argparse

import torch
import triton

from bench_quantize import _copy, _least_of_rounds
from titan_fp4six import numerics
from titan_fp4six.kernels import decode as kd
from titan_fp4six.kernels import quantize as kq

SHAPES = ((16384, 7168), (8192, 5120), (4100, 2048))
DEVICE = "cuda"


def _same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def _row(name, nbytes, t_kernel, t_copy, t_unfused, exact):
    print(f"| {name} | {t_kernel:.3f} | {t_copy / t_kernel:6.1%} | {t_unfused:.3f} | {t_unfused / t_kernel:5.2f}x "
          f"| {nbytes / 1e6:.0f} | {exact} |", flush=True)


def run_shape(m, k, rep_ms, rounds):
    x = torch.randn(m, k, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0)).to(torch.bfloat16)
    amax = numerics.tensor_amax(x)
    n, mp = m * k, -(-m // 16) * 16
    np_ = mp * k  # elements of the padded transpose
    q46 = lambda e: e * 2 + e // 2 + 2 * (e // 16)  # noqa: E731  bf16 read; codes, scales, map4 written
    qnv = lambda e: e * 2 + e // 2 + e // 16  # noqa: E731

    def transposed():
        return torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16)).t().contiguous()

    fns = {
        "nv_dec": lambda: kq.nvfp4_quantize_decode(x, amax),
        "nv_dec_unfused": lambda: numerics.decode_block_scaled(*kq.nvfp4_quantize(x, amax)[:2]),
        "col46": lambda: kq.four_over_six_quantize_columnwise(x, amax, "mse", 256, False),
        "col46_unfused": lambda: kq.four_over_six_quantize(transposed(), amax, "1x16", "mse", 256),
        "col46d": lambda: kq.four_over_six_quantize_columnwise(x, amax, "mse", 256, True),
        "col46d_unfused": lambda: kq.four_over_six_quantize_decode(transposed(), amax, "1x16", "mse", 256),
        "colnv": lambda: kq.nvfp4_quantize_columnwise(x, amax, False),
        "colnv_unfused": lambda: kq.nvfp4_quantize(transposed(), amax),
        "colnvd": lambda: kq.nvfp4_quantize_columnwise(x, amax, True),
        "colnvd_unfused": lambda: kq.nvfp4_quantize_decode(transposed(), amax),
    }
    codes, scales = kq.nvfp4_quantize(x, amax)
    fns.update({
        "dec": lambda: kd.decode_block_scaled(codes, scales),
        "dec_unfused": lambda: numerics.decode_block_scaled(codes, scales),
        "deq": lambda: kd.nvfp4_dequantize(codes, scales, amax, 448, torch.bfloat16),
        "deq_unfused": lambda: numerics.nvfp4_dequantize(codes, scales, amax, scale_bound=448, dtype=torch.bfloat16),
    })
    sizes = {"nv_dec": qnv(n) + 2 * n, "col46": q46(n), "col46d": q46(np_) + 2 * np_, "colnv": qnv(np_),
             "colnvd": qnv(np_) + 2 * np_, "dec": n // 2 + n // 16 + 2 * n, "deq": n // 2 + n // 16 + 2 * n}
    for name, nbytes in sizes.items():
        fns["copy_" + name] = _copy(nbytes)
    t = _least_of_rounds(fns, rep_ms, rounds)
    exact = {
        "nv_dec": _same(fns["nv_dec"](), (fns["nv_dec_unfused"](), codes, scales)),
        "col46": _same(fns["col46"]()[1:], fns["col46_unfused"]()),
        "col46d": _same(fns["col46d"](), fns["col46d_unfused"]()),
        "colnv": _same(fns["colnv"]()[1:], fns["colnv_unfused"]()),
        "colnvd": _same(fns["colnvd"](), fns["colnvd_unfused"]()),
        "dec": _same((fns["dec"](), ), (fns["dec_unfused"](), )),
        "deq": _same((fns["deq"](), ), (fns["deq_unfused"](), )),
    }
    labels = {"nv_dec": "NVFP4 quantize+decode fused", "col46": "columnwise 4/6", "col46d": "columnwise 4/6 + decode",
              "colnv": "columnwise NVFP4", "colnvd": "columnwise NVFP4 + decode", "dec": "decode_block_scaled",
              "deq": "nvfp4_dequantize bf16"}
    print(f"\n{m}x{k} bf16 x (columnwise: x^T, {k}x{mp})\n")
    print("| kernel | ms | % of copy | unfused ms | speedup | MB moved | bitwise |")
    print("|---|---|---|---|---|---|---|")
    for name, label in labels.items():
        _row(label, sizes[name], t[name], t["copy_" + name], t[name + "_unfused"], exact[name])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed milliseconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per shape; each time is the least median")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA device")
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"least of {args.rounds} rounds' medians of do_bench")
    for m, k in SHAPES:
        run_shape(m, k, args.rep_ms, args.rounds)


if __name__ == "__main__":
    main()
