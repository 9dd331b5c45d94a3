"""Op-level speed of the four-over-six ops on one GPU, as ratios measured in one run.

    python scripts/bench_ops.py [--iters 50] [--json OUT.json]

Rows: 1024^3 `four_over_six_linear` forward+backward per backward mode against bf16 `F.linear` (GPU time per
iteration, CUDA events, queue kept full), the host time of one such call (the Python call alone, measured after a
sync so nothing waits on the GPU), and the public `four_over_six_quantize` on 1024x1024 back to back (host and
GPU time per call) and on 8192x5120 against the Triton kernel it launches. Works on CPU too (smoke test: host
timings only). The ops run as in training: backward on the calling thread (the converters' setting, for the bf16
rows too) and map-to-4 counting off (torchtitan counts it on logged steps only).
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from titan_fp4six import FourOverSixRecipe, four_over_six_linear, four_over_six_quantize, tensor_amax
from titan_fp4six.integration.backward_thread import run_backward_on_calling_thread
from titan_fp4six.ops import MAP4_STATS, quantize_linear_weight

MODES = ("quantized", "dequantized", "high_precision")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_ms(fn, iters: int) -> float:
    """Mean time per call with the queue kept full (GPU time when the device is the bottleneck)."""
    for _ in range(3):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - start) * 1e3 / iters


def host_us(fn, iters: int) -> float:
    """Median wall time of the Python call itself, each started on an idle device (host-side cost)."""
    times = []
    for _ in range(iters):
        _sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    _sync()
    return statistics.median(times) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--size", type=int, default=1024, help="M = K = N of the linear (small for a CPU smoke test)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    run_backward_on_calling_thread()
    MAP4_STATS.enabled = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    rows = []

    def row(name, value, unit, ratio=None):
        rows.append({"name": name, "value": value, "unit": unit, "ratio": ratio})
        print(f"{name:58s} {value:10.3f} {unit:3s}" + (f"   x{ratio:.2f}" if ratio is not None else ""))

    n = args.size
    x = torch.randn(n, n, generator=gen).to(device, torch.bfloat16).requires_grad_()
    w = (torch.randn(n, n, generator=gen) / n ** 0.5).to(device, torch.bfloat16).requires_grad_()
    dy = torch.randn(n, n, generator=gen).to(device, torch.bfloat16)

    def step(fn):
        def run():
            x.grad = w.grad = None
            fn().backward(dy)
        return run

    bf16 = step(lambda: F.linear(x, w))
    base = gpu_ms(bf16, args.iters)
    row(f"{n}^3 linear fwd+bwd bf16 (ms)", base, "ms", 1.0)
    base_host = host_us(bf16, args.iters)
    row(f"{n}^3 linear fwd+bwd bf16 host (us)", base_host, "us")
    for mode in MODES:
        recipe = FourOverSixRecipe(backward=mode)
        fn = step(lambda: four_over_six_linear(x, w, recipe=recipe))
        ms = gpu_ms(fn, args.iters)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode} (ms)", ms, "ms", ms / base)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode} host (us)", host_us(fn, args.iters), "us")
        # a micro-batch after the first with cache_weights: the weight comes quantized (quantize_linear_weight)
        qw = quantize_linear_weight(w, recipe=recipe)
        cached = gpu_ms(step(lambda: four_over_six_linear(x, w, recipe=recipe, quantized_weight=qw)), args.iters)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode}, weight cached (ms)", cached, "ms", cached / base)

    small = torch.randn(1024, 1024, generator=gen).to(device, torch.bfloat16)
    small_amax = tensor_amax(small)
    quantize = lambda: four_over_six_quantize(small, small_amax)  # noqa: E731
    row("public four_over_six_quantize 1024x1024 back to back (us/call)", gpu_ms(quantize, args.iters) * 1e3, "us")
    row("public four_over_six_quantize 1024x1024 host (us)", host_us(quantize, args.iters), "us")
    if device == "cuda":
        from titan_fp4six.kernels import quantize as kq
        from titan_fp4six.numerics.spec import OperandSpec

        big = torch.randn(8192, 5120, generator=gen).to(device, torch.bfloat16)
        big_amax = tensor_amax(big)
        kernel = gpu_ms(lambda: kq.quantize(big, big_amax, OperandSpec()), args.iters)
        public = gpu_ms(lambda: four_over_six_quantize(big, big_amax), args.iters)
        row("four_over_six_quantize 8192x5120: the kernel alone (ms)", kernel, "ms")
        row("four_over_six_quantize 8192x5120: public call (ms)", public, "ms", public / kernel)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
