"""Operand kernel benchmark (issue 18), all figures from one GPU run: each new kernel against a device copy of
the same bytes (read + written) and against the unfused PyTorch composition it replaces, with a bitwise check
of their outputs.

    python scripts/bench_kernels.py [--rep-ms 100] [--rounds 3] [--only operands|epilogue]

Cases per shape (bf16 input, per-tensor amax, mse, B=256):
- NVFP4 quantize + decode fused, against the NVFP4 kernel then numerics' PyTorch decode_block_scaled;
- columnwise 4/6 and NVFP4 (x^T read in place), without and with the decode, against pad + transpose +
  contiguous, then the row-major kernel (fused with the decode where the columnwise one is);
- decode_block_scaled and nvfp4_dequantize (bf16 out) kernels, against numerics' PyTorch versions.
Then the GEMM epilogue (grouped bf16 product of the Qwen3 MoE debug experts, dense FP32 product) and the row
amax, each against a copy of the same bytes, against the same kernel compiled without specializing the sizes
and strides (how it was before: no vectorized loads), and against the PyTorch reference (bitwise).
Times are medians of do_bench, the least over --rounds rounds (bench_quantize.py says why).
"""

import argparse

import torch
import triton

from bench_quantize import _copy, _least_of_rounds
from titan_fp4six import numerics
from titan_fp4six.kernels import amax as ka
from titan_fp4six.kernels import decode as kd
from titan_fp4six.kernels import epilogue as ke
from titan_fp4six.kernels import quantize as kq
from titan_fp4six.numerics.spec import NVFP4, OperandSpec
from titan_fp4six.kernels.launch import FastLaunch
from titan_fp4six.numerics import reference

SHAPES = ((16384, 7168), (8192, 5120), (4100, 2048))
GROUPED_PRODUCT = (64, 131072, 768)  # Qwen3 MoE debug experts: 64 experts, 16384 tokens x top-8, moe_inter_dim 768
DENSE_PRODUCT = (16384, 1024)
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
        "nv_dec": lambda: kq.quantize(x, amax, NVFP4, True),
        "nv_dec_unfused": lambda: numerics.decode_block_scaled(*kq.quantize(x, amax, NVFP4)[:2]),
        "col46": lambda: kq.quantize_columnwise(x, amax, OperandSpec(), False),
        "col46_unfused": lambda: kq.quantize(transposed(), amax, OperandSpec()),
        "col46d": lambda: kq.quantize_columnwise(x, amax, OperandSpec(), True),
        "col46d_unfused": lambda: kq.quantize(transposed(), amax, OperandSpec(), True),
        "colnv": lambda: kq.quantize_columnwise(x, amax, NVFP4, False),
        "colnv_unfused": lambda: kq.quantize(transposed(), amax, NVFP4),
        "colnvd": lambda: kq.quantize_columnwise(x, amax, NVFP4, True),
        "colnvd_unfused": lambda: kq.quantize(transposed(), amax, NVFP4, True),
    }
    codes, scales = kq.quantize(x, amax, NVFP4)[:2]
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


def run_epilogue_and_amax(rep_ms, rounds):
    """The epilogue and the row amax: now (sizes and strides specialized) vs unspecialized vs copy vs PyTorch."""
    gen = torch.Generator(DEVICE).manual_seed(0)
    experts, m, n = GROUPED_PRODUCT
    prod = torch.randn(m, n, device=DEVICE, generator=gen).to(torch.bfloat16)
    group = torch.arange(m, device=DEVICE) * experts // m
    a_rows = torch.rand(m, device=DEVICE, generator=gen) * 4
    w_amax = torch.rand(experts, device=DEVICE, generator=gen)
    acc = torch.randn(*DENSE_PRODUCT, device=DEVICE, generator=gen)
    a_amax, b_amax = torch.rand((), device=DEVICE) * 4, torch.rand((), device=DEVICE)
    before = {ke: ("_SCALE_CAST", ["M", "N", "experts"]), ka: ("_ROW_AMAX", ["R", "C", "stride"])}

    def unspecialized(module, fn):
        """fn run with module's kernel rebuilt as it was before: sizes and strides not specialized."""
        name, args = before[module]
        kernel = FastLaunch(triton.jit(do_not_specialize=args)(getattr(module, name).fn.fn))

        def run():
            now = getattr(module, name)
            setattr(module, name, kernel)
            try:
                return fn()
            finally:
                setattr(module, name, now)
        return run

    cases = {
        f"grouped epilogue {m}x{n} bf16 -> bf16": (
            4 * m * n, lambda: ke.grouped_scale_cast(prod, a_rows, False, w_amax, group, 256, torch.bfloat16),
            unspecialized(ke, lambda: ke.grouped_scale_cast(prod, a_rows, False, w_amax, group, 256, torch.bfloat16)),
            lambda: reference.grouped_scale_cast_reference(prod, a_rows, False, w_amax, group, 256, torch.bfloat16)),
        f"dense epilogue {acc.shape[0]}x{acc.shape[1]} fp32 -> bf16": (
            6 * acc.numel(), lambda: ke.scale_cast(acc, a_amax, 256, b_amax, 256, torch.bfloat16),
            unspecialized(ke, lambda: ke.scale_cast(acc, a_amax, 256, b_amax, 256, torch.bfloat16)),
            lambda: reference.scale_cast_reference(acc, a_amax, 256, b_amax, 256, torch.bfloat16)),
        f"row amax {m}x{n} bf16": (
            2 * m * n, lambda: ka.row_amax(prod), unspecialized(ka, lambda: ka.row_amax(prod)),
            lambda: reference.row_amax_reference(prod)),
    }
    fns = {}
    for name, (nbytes, now, old, ref) in cases.items():
        fns.update({name: now, name + " old": old, name + " ref": ref, name + " copy": _copy(nbytes)})
    t = _least_of_rounds(fns, rep_ms, rounds)
    print("\n| kernel | ms | % of copy | unspecialized ms | speedup | PyTorch ms | MB moved | bitwise (now, old) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (nbytes, now, old, ref) in cases.items():
        want = ref()
        exact = (_same((now(), ), (want, )), _same((old(), ), (want, )))
        print(f"| {name} | {t[name]:.3f} | {t[name + ' copy'] / t[name]:6.1%} | {t[name + ' old']:.3f} | "
              f"{t[name + ' old'] / t[name]:5.2f}x | {t[name + ' ref']:.3f} | {nbytes / 1e6:.0f} | {exact} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed milliseconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per shape; each time is the least median")
    parser.add_argument("--only", choices=("operands", "epilogue"), help="one part of the benchmark")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA device")
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"least of {args.rounds} rounds' medians of do_bench")
    if args.only in (None, "operands"):
        for m, k in SHAPES:
            run_shape(m, k, args.rep_ms, args.rounds)
    if args.only in (None, "epilogue"):
        run_epilogue_and_amax(args.rep_ms, args.rounds)


if __name__ == "__main__":
    main()
