"""Forward+backward time of the four-over-six GEMMs as a ratio to the bf16 op, measured in one run.

Shapes are DeepSeek-V3- and Qwen3-30B-A3B-like (dense projections and routed-expert grouped GEMMs with
top-8 routing; DeepSeek-V3 with 32 local experts, i.e. 256 experts over 8-way expert parallelism).
    python scripts/bench_gemm.py            # on a GPU
    python scripts/bench_gemm.py --quick    # tiny shapes, any device (smoke test)
"""

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from titan_fp4six.dispatch.backend import backends_for

DENSE = [  # name, tokens M, in K, out N
    ("dsv3 attn wq_a 7168->1536", 8192, 7168, 1536),
    ("dsv3 shared-expert w1 7168->2048", 8192, 7168, 2048),
    ("qwen3-30b-a3b q_proj 2048->4096", 8192, 2048, 4096),
]
GROUPED = [  # name, routed rows M, K, N, experts E
    ("dsv3 experts w1 (E=32 local)", 8192 * 8 // 2, 7168, 2048, 32),
    ("qwen3-30b-a3b experts w1", 8192 * 8, 2048, 768, 128),
    ("qwen3-30b-a3b experts w2", 8192 * 8, 768, 2048, 128),
]
QUICK_DENSE = [("quick dense", 256, 256, 128)]
QUICK_GROUPED = [("quick grouped", 512, 256, 128, 4)]


def _timer(device):
    if device.type == "cuda":
        def run(fn, iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters
        return run

    def run_cpu(fn, iters):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    return run_cpu


def _host_syncs(step) -> int:
    """How many times one call of `step` makes the host wait for the GPU (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _bench(step, args, timer):
    for _ in range(args.warmup):
        step()
    ms = timer(step, args.iters)
    return ms, (_host_syncs(step) if torch.cuda.is_available() else 0)


def _fwd_bwd(fn, inputs, dy):
    def step():
        for t in inputs:
            t.grad = None
        fn().backward(dy)
    return step


def _offsets(rows, experts, device, gen):
    """Token groups of uneven sizes (one empty), each padded to a multiple of 16, 1/16 of the rows as tail."""
    weights = torch.rand(experts, generator=gen) + 0.2
    weights[experts // 2] = 0
    sizes = (weights / weights.sum() * rows * 15 / 16 / 16).floor().long() * 16
    return torch.cumsum(sizes, 0).to(torch.int32).to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny shapes (smoke test on any device)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer, gen = _timer(device), torch.Generator().manual_seed(0)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, GEMM backend: "
          f"{'Blackwell NVFP4' if backends_for('auto', 'auto', device).fp4 else 'emulated (bf16 decode, FP32 accumulation)'}, "
          f"bf16 decode for emulation {not backends_for('auto', 'auto', device).fp4}; fwd+bwd ms, mean of {args.iters} after {args.warmup} warm-up")
    print(f"{'shape':40s} {'op':28s} {'ms':>9s} {'x bf16':>7s} {'syncs':>6s}  (host syncs per fwd+bwd, GPU)")

    for label, m, k, n in QUICK_DENSE if args.quick else DENSE:
        x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16).requires_grad_()
        w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16).requires_grad_()
        dy = torch.randn(m, n, generator=gen).to(device, torch.bfloat16)
        base, syncs = _bench(_fwd_bwd(lambda: F.linear(x, w), (x, w), dy), args, timer)
        print(f"{label:40s} {'bf16 F.linear':28s} {base:9.3f} {1.0:7.2f} {syncs:6d}")
        for mode in ("quantized", "high_precision", "dequantized"):
            recipe = FourOverSixRecipe(backward=mode)
            ms, syncs = _bench(_fwd_bwd(lambda: four_over_six_linear(x, w, recipe=recipe), (x, w), dy), args, timer)
            print(f"{'':40s} {'4/6 linear ' + mode:28s} {ms:9.3f} {ms / base:7.2f} {syncs:6d}")
        del x, w, dy

    for label, m, k, n, e in QUICK_GROUPED if args.quick else GROUPED:
        a = torch.randn(m, k, generator=gen).to(device, torch.bfloat16).requires_grad_()
        w = (torch.randn(e, n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16).requires_grad_()
        dy = torch.randn(m, n, generator=gen).to(device, torch.bfloat16)
        offs = _offsets(m, e, device, gen)
        base, syncs = _bench(_fwd_bwd(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), (a, w), dy),
                             args, timer)
        print(f"{label:40s} {'bf16 torch._grouped_mm':28s} {base:9.3f} {1.0:7.2f} {syncs:6d}")
        for mode in ("high_precision", "dequantized"):
            recipe = FourOverSixRecipe(backward=mode)
            ms, syncs = _bench(_fwd_bwd(lambda: four_over_six_grouped_mm(a, w.transpose(-2, -1), offs,
                                                                         recipe=recipe), (a, w), dy), args, timer)
            print(f"{'':40s} {'4/6 grouped ' + mode:28s} {ms:9.3f} {ms / base:7.2f} {syncs:6d}")
        del a, w, dy


if __name__ == "__main__":
    main()
