"""Benchmarks of the quantizer kernels and the four-over-six ops, every figure a ratio measured in the same run.

    python -m scripts.bench quantize [--rep-ms 200] [--rounds 3]    # Triton 4/6 quantizer vs copy, reference, NVFP4
    python -m scripts.bench kernels [--only operands|epilogue|columns|prologue|layouts]  # operand kernels,
                                      # epilogue, row amax; columns: columnwise launch-shape sweep; prologue: the
                                      # decode's share of the full recipe's grouped operands, a plain Triton GEMM
                                      # vs cuBLAS; layouts: each 4/6 layout of the full recipe vs plain NVFP4
    python -m scripts.bench gemm [--quick]                          # fwd+bwd of the GEMMs at model shapes vs bf16
    python -m scripts.bench ops [--iters 50] [--json OUT.json]      # 1024^3 linear per backward mode, public quantize
    python -m scripts.bench compare --before A*.json --after B*.json  # `ops --json` runs of two trees compared
    python -m scripts.bench warm [--jobs 16]                        # compile the quantizer variants in parallel

With --docs, `quantize`, `kernels`, `gemm`, `ops` and `compare` also write their tables into their sections of
docs/results/kernels.md and docs/results/speed.md (scripts/results_page.py; the markdown is built by the *_table
functions below from the measured numbers). `kernels --only epilogue` has no table on a results page.

`quantize` and `kernels` need a CUDA device; `gemm` and `ops` run anywhere (on the CPU as smoke tests), `warm`
fills Triton's cache on a CUDA device so tests and benchmarks start without compiling kernels one after another.
Kernel times are medians of `do_bench`, the least over --rounds rounds that time a case's kernels in turn: the
GPU now and then runs one kernel slow for a whole measurement (seen on the NVFP4 kernel: 0.10 instead of 0.08
ms), which would otherwise decide a ratio.
"""

import argparse
import itertools
import json
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from scripts import results_page
from titan_fp4six import (FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear,
                          four_over_six_quantize, quant, tensor_amax)
from titan_fp4six.numerics import reference
from titan_fp4six.numerics.spec import NVFP4, NVFP4_STOCHASTIC, OperandSpec, four_over_six_spec


def _needs_cuda(command: str) -> None:
    if not torch.cuda.is_available():
        raise SystemExit(f"scripts.bench {command} needs a CUDA device")


def _ms(fn, rep_ms: float) -> float:
    import triton

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
    """Bitwise equality of two tuples of tensors (None where an output was not asked for)."""
    return len(a) == len(b) and all(x is None and y is None or x is not None and y is not None
                                    and torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def _bf16_input(rows: int, cols: int) -> torch.Tensor:
    """The benchmarks' input: a (rows, cols) bf16 normal sample on the GPU, the same for a shape every run."""
    return torch.randn(rows, cols, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)


def _bytes_4over6(e: int, decode: bool = False) -> int:
    """Bytes a 4/6 quantization of e bf16 elements moves: the input read; codes, scales and map-to-4 flags
    written (and the bf16 decode with `decode`)."""
    return e * 2 + e // 2 + 2 * (e // 16) + (2 * e if decode else 0)


def _bytes_nvfp4(e: int, decode: bool = False) -> int:
    """Bytes an NVFP4 quantization of e bf16 elements moves: the input read; codes and scales written (and the
    bf16 decode with `decode`)."""
    return e * 2 + e // 2 + e // 16 + (2 * e if decode else 0)


STOCHASTIC_SEED = 12345  # the stochastic-rounding rows' seed
KERNELS_PAGE, SPEED_PAGE = "kernels.md", "speed.md"  # the results pages (docs/results/) --docs writes into


def _header(rounds: int) -> None:
    import triton

    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | bf16 input, "
          f"mse, B=256 | least of {rounds} rounds' medians of do_bench")


# --- quantize: the 4/6 quantizer against a copy of its bytes, the reference and the NVFP4 kernel ---------------

QUANTIZE_CASES = (  # (rows, cols, amax mode, block)
    (16384, 7168, "tensor", "1x16"),
    (16384, 7168, "tensor", "16x16"),
    (8192, 5120, "tensor", "1x16"),
    (8192, 5120, "tensor", "16x16"),
    (16384, 7168, "row", "1x16"),
)


def quantize_case(rows, cols, mode, block, rep_ms, rounds) -> dict:
    """One case of QUANTIZE_CASES, printed; returns its figures (ms, bitwise) for `quantize_table`."""
    from titan_fp4six.kernels import amax as kamax
    from titan_fp4six.kernels import quantize as kq

    x = _bf16_input(rows, cols)
    amax = quant.row_amax(x) if mode == "row" else quant.tensor_amax(x)
    n = rows * cols
    quant_bytes = _bytes_4over6(n)  # the amax read is negligible
    dec_bytes = _bytes_4over6(n, decode=True)
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
    want = reference.four_over_six_reference(x, amax, block, "mse", 256)
    exact = _same(kq.quantize(x, amax, OperandSpec(block=block))[:len(want)], want)
    print(f"{rows}x{cols} {mode:6s} {block:5s} | 4/6 {fos:7.3f} ms {quant_bytes / fos / 1e6:6.0f} GB/s "
          f"= {copy_q / fos:5.1%} of copy | ref {ref:8.2f} ms x{ref / fos:6.1f} bitwise={exact} | "
          f"NVFP4 {std:6.3f} ms, 4/6 / NVFP4 = {fos / std:4.2f} | fused decode {fused:6.3f} ms "
          f"({copy_d / fused:5.1%} of copy), fused / quantize = {fused / fos:4.2f} | "
          f"amax {t['amax_kernel']:6.3f} ms vs torch {t['amax_torch']:6.3f} ms", flush=True)
    return {"case": (rows, cols, mode, block), "fos": fos, "copy": copy_q, "ref": ref, "nvfp4": std, "fused": fused,
            "exact": exact}


def exact_path_cost(rep_ms) -> tuple[float, float]:
    """The worst case: data outside the fast path's range (an amax so small that every chunk runs the exact
    arithmetic) against the same tensor's fast path: (exact path ms, fast path ms), printed."""
    from titan_fp4six.kernels import quantize as kq

    x = _bf16_input(16384, 7168)
    amax = quant.tensor_amax(x)
    fast = _ms(lambda: kq.quantize(x, amax, OperandSpec()), rep_ms)
    tiny = torch.tensor(1e-30, device="cuda")
    slow = _ms(lambda: kq.quantize(x, tiny, OperandSpec()), rep_ms)
    print(f"16384x7168 1x16, every chunk on the exact path (amax 1e-30): {slow:.3f} ms = "
          f"{slow / fast:.1f}x the fast path")
    return slow, fast


def quantize_table(cases: list[dict], exact_path: tuple[float, float] | None = None) -> str:
    """`quantize`'s figures as the markdown of kernels.md's quantize-rows section: one row per case (quantize_case's
    dicts: ms of the 4/6 kernel, a copy of its bytes, the reference, the NVFP4 kernel, the fused quantize-decode),
    then the exact path's cost (exact_path_cost's (exact ms, fast ms))."""
    lines = ["| case | 4/6 time | % of copy bandwidth | vs reference | NVFP4 kernel | 4/6 / NVFP4 | fused / quantize | "
             "bitwise |", "|---|---|---|---|---|---|---|---|"]
    for c in cases:
        rows, cols, mode, block = c["case"]
        lines.append(f"| {rows}x{cols} {mode}, {block} | {c['fos']:.3f} ms | {c['copy'] / c['fos']:.1%} | "
                     f"{c['ref'] / c['fos']:.0f}x | {c['nvfp4']:.3f} ms | {c['fos'] / c['nvfp4']:.2f} | "
                     f"{c['fused'] / c['fos']:.2f} | {c['exact']} |")
    if exact_path is not None:
        slow, fast = exact_path
        lines += ["", f"16384x7168 1x16 with every chunk on the exact path (amax 1e-30): {slow:.3f} ms, "
                      f"{slow / fast:.1f}x the fast path."]
    return "\n".join(lines) + "\n"


def cmd_quantize(args):
    _needs_cuda("quantize")
    _header(args.rounds)
    cases = [quantize_case(*case, args.rep_ms, args.rounds) for case in QUANTIZE_CASES]
    exact_path = exact_path_cost(args.rep_ms)
    if args.docs:
        results_page.write_section(KERNELS_PAGE, "quantize-rows", quantize_table(cases, exact_path))


# --- kernels: each operand kernel against a copy of its bytes and the unfused composition it replaces ----------

KERNEL_SHAPES = ((16384, 7168), (8192, 5120), (4100, 2048))
GROUPED_PRODUCT = (64, 131072, 768)  # Qwen3 MoE debug experts: 64 experts, 16384 tokens x top-8, moe_inter_dim 768
DENSE_PRODUCT = (16384, 1024)


def _kernel_row(name, nbytes, t_kernel, t_copy, t_unfused, exact):
    print(f"| {name} | {t_kernel:.3f} | {t_copy / t_kernel:6.1%} | {t_unfused:.3f} | {t_unfused / t_kernel:5.2f}x "
          f"| {nbytes / 1e6:.0f} | {exact} |", flush=True)


def operand_kernels(m, k, rep_ms, rounds) -> dict:
    """NVFP4 quantize + decode fused; columnwise 4/6 and NVFP4 (x^T read in place) with and without the decode,
    against pad + transpose + contiguous then the row-major kernel; decode and dequantize against the reference;
    the stochastic-rounding NVFP4 quantizer (rows, columnwise) against the reference with the same Philox bits.
    Printed; returns {kernel: {"ms", "copy" (ms of a copy of its bytes), "unfused" (ms), "exact"}}."""
    from titan_fp4six.kernels import decode as kd
    from titan_fp4six.kernels import hadamard as kh
    from titan_fp4six.kernels import quantize as kq
    from titan_fp4six.numerics.hadamard import rht16_columns_reference

    x = _bf16_input(m, k)
    amax = tensor_amax(x)
    n, mp = m * k, -(-m // 16) * 16
    np_ = mp * k  # elements of the padded transpose

    def transposed():
        return torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16)).t().contiguous()

    fns = {
        "nv_dec": lambda: kq.quantize(x, amax, NVFP4, True),
        "nv_dec_unfused": lambda: reference.decode_block_scaled_reference(*kq.quantize(x, amax, NVFP4)[:2]),
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
        "dec_unfused": lambda: reference.decode_block_scaled_reference(codes, scales),
        "deq": lambda: kd.nvfp4_dequantize(codes, scales, amax, 448, torch.bfloat16),
        "deq_unfused": lambda: reference.dequantize_reference(codes, scales, amax, 448, torch.bfloat16),
    })
    fns.update({"rht": lambda: kh.rht16_columns(x), "rht_unfused": lambda: rht16_columns_reference(x)})
    fns.update({  # gradient_rounding='stochastic': the same kernels drawing 16 Philox bits per element
        "nv": lambda: kq.quantize(x, amax, NVFP4),
        "nv_unfused": lambda: reference.nvfp4_reference(x, amax),
        "nvsr": lambda: kq.quantize(x, amax, NVFP4_STOCHASTIC, seed=STOCHASTIC_SEED),
        "nvsr_unfused": lambda: reference.nvfp4_reference(x, amax, STOCHASTIC_SEED),
        "colnvsr": lambda: kq.quantize_columnwise(x, amax, NVFP4_STOCHASTIC, False, seed=STOCHASTIC_SEED),
        "colnvsr_unfused": lambda: kq.quantize(transposed(), amax, NVFP4_STOCHASTIC, seed=STOCHASTIC_SEED),
    })
    decode_bytes = n // 2 + n // 16 + 2 * n  # codes and scales read, bf16 written
    sizes = {"nv_dec": _bytes_nvfp4(n, decode=True), "col46": _bytes_4over6(n),
             "col46d": _bytes_4over6(np_, decode=True), "colnv": _bytes_nvfp4(np_),
             "colnvd": _bytes_nvfp4(np_, decode=True), "dec": decode_bytes, "deq": decode_bytes,
             "rht": 2 * n + 2 * np_, "nv": _bytes_nvfp4(n), "nvsr": _bytes_nvfp4(n), "colnvsr": _bytes_nvfp4(np_)}
    for name, nbytes in sizes.items():
        fns["copy_" + name] = _copy(nbytes)
    t = _least_of_rounds(fns, rep_ms, rounds)
    exact = {
        "nv_dec": _same(fns["nv_dec"](), (codes, scales, None, fns["nv_dec_unfused"]())),
        "col46": _same(fns["col46"](), fns["col46_unfused"]()),
        "col46d": _same(fns["col46d"](), fns["col46d_unfused"]()),
        "colnv": _same(fns["colnv"](), fns["colnv_unfused"]()),
        "colnvd": _same(fns["colnvd"](), fns["colnvd_unfused"]()),
        "dec": _same((fns["dec"](), ), (fns["dec_unfused"](), )),
        "deq": _same((fns["deq"](), ), (fns["deq_unfused"](), )),
        "rht": _same((fns["rht"](), ), (fns["rht_unfused"](), )),
        "nv": _same(fns["nv"]()[:2], fns["nv_unfused"]()),
        "nvsr": _same(fns["nvsr"]()[:2], fns["nvsr_unfused"]()),
        "colnvsr": _same(fns["colnvsr"](), fns["colnvsr_unfused"]()),
    }
    labels = {"nv_dec": "NVFP4 quantize+decode fused", "col46": "columnwise 4/6", "col46d": "columnwise 4/6 + decode",
              "colnv": "columnwise NVFP4", "colnvd": "columnwise NVFP4 + decode", "dec": "decode_block_scaled",
              "deq": "nvfp4_dequantize bf16", "rht": "rht16 down the columns (wgrad_rht; unfused: the reference)",
              "nv": "NVFP4 round-to-nearest (unfused: the reference)",
              "nvsr": "NVFP4 stochastic rounding (unfused: the reference, same Philox bits)",
              "colnvsr": "columnwise NVFP4 stochastic rounding"}
    print(f"\n{m}x{k} bf16 x (columnwise: x^T, {k}x{mp})\n")
    print("| kernel | ms | % of copy | unfused ms | speedup | MB moved | bitwise |")
    print("|---|---|---|---|---|---|---|")
    for name, label in labels.items():
        _kernel_row(label, sizes[name], t[name], t["copy_" + name], t[name + "_unfused"], exact[name])
    return {name: {"ms": t[name], "copy": t["copy_" + name], "unfused": t[name + "_unfused"], "exact": exact[name]}
            for name in labels}


def operands_table(by_shape: dict) -> str:
    """speed.md's kernels-operands section: the full recipe's kernel targets (>= 50% of copy bandwidth) at each shape
    of `kernels --only operands`, from operand_kernels' results by (m, k)."""
    shapes = " / ".join(f"{m}x{k}" for m, k in by_shape)

    def pct(name):
        return " / ".join(f"{100 * r[name]['copy'] / r[name]['ms']:.1f}" for r in by_shape.values()) + "%"

    def ms(name):
        return " / ".join(f"{r[name]['ms']:.3f}" for r in by_shape.values())

    def met(name):
        return "yes" if all(r[name]["copy"] / r[name]["ms"] >= 0.5 for r in by_shape.values()) else "no"

    inexact = sorted({name for r in by_shape.values() for name, v in r.items() if not v["exact"]})
    return "\n".join([
        "| workload | measured | target | met |", "| --- | --- | --- | --- |",
        f"| `rht16_columns` (wgrad_rht), % of copy bandwidth at {shapes} | {pct('rht')} | >= 50% | {met('rht')} |",
        f"| NVFP4 stochastic-rounding quantize, % of copy at {shapes} | {pct('nvsr')} ({ms('nvsr')} ms; round to "
        f"nearest {ms('nv')}) | >= 50% | {met('nvsr')} |",
        f"| the same, columnwise (x^T read in place: the wgrad's `Q_col(dy)`) | {pct('colnvsr')} ({ms('colnvsr')} ms); "
        f"columnwise round to nearest {pct('colnv')} ({ms('colnv')} ms) | >= 50% | {met('colnvsr')} |",
        "", "Every kernel of the benchmark bitwise equal to its unfused composition or reference: "
            + (f"no ({', '.join(inexact)})" if inexact else "yes") + ".",
    ]) + "\n"


# Launch shapes (rows of x^T = columns of x per program, blocks per row, chunks per program, warps[, register cap])
# the columnwise sweep tries against the shipped kernels.quantize.COLUMN_LAUNCH of each kernel. A thread reads 8
# consecutive columns (16 bytes of bf16) per access; a program's codes per column are 8 bytes per block down it.
COLUMN_LAUNCHES = ((8, 4, 8, 1), (8, 8, 8, 2), (8, 4, 8, 2), (16, 4, 8, 2), (16, 4, 8, 1), (8, 8, 8, 1),
                   (16, 2, 8, 1), (32, 1, 8, 1), (8, 4, 8, 1, 80), (16, 4, 8, 2, 80), (16, 4, 8, 2, 96))


def column_launches(m, k, rep_ms, rounds) -> str:
    """The columnwise kernels (NVFP4, 4/6 with and without the decode, stochastic NVFP4; x^T read in place) under
    each launch shape of COLUMN_LAUNCHES: time, % of copy, and bytes equal to the shipped launches'. The shape
    each kernel should ship. The last row is each kernel's shipped launch reading one element per access: x's rows
    at a stride of k + 1 elements (the same values), which the vector loads cannot take. Printed; returns the
    markdown (`columns_table`)."""
    from titan_fp4six.kernels import quantize as kq

    x = _bf16_input(m, k)
    unaligned = torch.empty(m, k + 1, dtype=x.dtype, device=x.device)[:, :k]
    unaligned.copy_(x)
    amax = tensor_amax(x)
    np_ = -(-m // 16) * 16 * k
    kernels = {"NVFP4": (NVFP4, False, None, _bytes_nvfp4(np_)),
               "4/6": (OperandSpec(), False, None, _bytes_4over6(np_)),
               "4/6 + decode": (OperandSpec(), True, None, _bytes_4over6(np_, decode=True)),
               "NVFP4 stochastic": (NVFP4_STOCHASTIC, False, STOCHASTIC_SEED, _bytes_nvfp4(np_))}
    element_loads = "shipped, element loads"

    def shipped(spec, decode):
        return kq.COLUMN_LAUNCH[kq.spec_flags(spec).launch, decode]

    def with_launch(launch, spec, decode, seed, source=x):
        def run():
            kept, kq.COLUMN_LAUNCH = kq.COLUMN_LAUNCH, dict.fromkeys(kq.COLUMN_LAUNCH, kq.Launch(*launch))
            try:
                return kq.quantize_columnwise(source, amax, spec, decode, seed=seed)
            finally:
                kq.COLUMN_LAUNCH = kept
        return run

    fns = {(name, launch): with_launch(launch, spec, decode, seed)
           for name, (spec, decode, seed, _) in kernels.items() for launch in COLUMN_LAUNCHES}
    fns.update({(name, element_loads): with_launch(shipped(spec, decode), spec, decode, seed, unaligned)
                for name, (spec, decode, seed, _) in kernels.items()})
    fns.update({("copy", name): _copy(nbytes) for name, (_, _, _, nbytes) in kernels.items()})
    t = _least_of_rounds(fns, rep_ms, rounds)
    want = {name: kq.quantize_columnwise(x, amax, spec, decode, seed=seed)
            for name, (spec, decode, seed, _) in kernels.items()}
    rows = [(launch, {name: (t[name, launch], t["copy", name]) for name in kernels},
             all(_same(fns[name, launch](), want[name]) for name in kernels))
            for launch in COLUMN_LAUNCHES + (element_loads, )]
    table = columns_table(m, k, {name: tuple(shipped(spec, decode)) for name, (spec, decode, _, _) in kernels.items()},
                          rows)
    print("\n" + table, flush=True)
    return table


def _launch_label(launch) -> str:
    """(rows of x^T, blocks, chunks, warps[, register cap]) as kernels.md writes it: "16 x 4, 2, 80 registers"."""
    if isinstance(launch, str):
        return launch
    rows, blocks, chunks, warps, *cap = launch
    return (f"{rows} x {blocks}, {warps}" + (f", {chunks} chunks" if chunks != 8 else "")
            + (f", {cap[0]} registers" if cap and cap[0] is not None else ""))


def columns_table(m: int, k: int, shipped: dict, rows: list) -> str:
    """One shape of the columnwise launch sweep as markdown (kernels.md's kernels-columns section): % of copy
    bandwidth and ms per kernel under each launch, each kernel's shipped launch in bold. shipped: {kernel: launch};
    rows: [(launch, or a label such as "shipped, element loads", {kernel: (ms, copy ms)}, bitwise)]."""
    def full(launch):
        return tuple(launch) + (None, ) * (5 - len(launch)) if not isinstance(launch, str) else launch

    names = list(shipped)
    lines = [f"{m}x{k} bf16 x, columnwise (x^T, {k}x{-(-m // 16) * 16}); shipped launches in bold: "
             + "; ".join(f"{name} {_launch_label(full(launch))}" for name, launch in shipped.items()) + ".", "",
             "| columns x blocks per warp, warps[, register cap] | "
             + " | ".join(f"{name}: % of copy (ms)" for name in names) + " | bitwise |",
             "|---|" + "---|" * len(names) + "---|"]
    for launch, times, exact in rows:
        cells = []
        for name in names:
            ms, copy = times[name]
            cell = f"{copy / ms:.1%} ({ms:.3f})"
            cells.append(f"**{cell}**" if full(launch) == full(shipped[name]) else cell)
        lines.append(f"| {_launch_label(launch)} | " + " | ".join(cells) + f" | {exact} |")
    return "\n".join(lines) + "\n"


def epilogue_and_amax(rep_ms, rounds):
    """The GEMM epilogue (grouped bf16 product of the Qwen3 MoE debug experts, dense FP32 product) and the row
    amax: against a copy of the same bytes, the same kernel compiled without specializing sizes and strides (no
    vectorized loads) and the PyTorch reference (bitwise)."""
    import triton

    from titan_fp4six.kernels import amax as ka
    from titan_fp4six.kernels import epilogue as ke
    from titan_fp4six.kernels.launch import FastLaunch

    gen = torch.Generator("cuda").manual_seed(0)
    experts, m, n = GROUPED_PRODUCT
    prod = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    group = torch.arange(m, device="cuda") * experts // m
    a_rows = torch.rand(m, device="cuda", generator=gen) * 4
    w_amax = torch.rand(experts, device="cuda", generator=gen)
    acc = torch.randn(*DENSE_PRODUCT, device="cuda", generator=gen)
    a_amax, b_amax = torch.rand((), device="cuda") * 4, torch.rand((), device="cuda")
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

    grouped = lambda: ke.grouped_scale_cast(prod, a_rows, False, w_amax, group, 256, torch.bfloat16)  # noqa: E731
    dense = lambda: ke.scale_cast(acc, a_amax, 256, b_amax, 256, torch.bfloat16)  # noqa: E731
    cases = {
        f"grouped epilogue {m}x{n} bf16 -> bf16": (
            4 * m * n, grouped, unspecialized(ke, grouped),
            lambda: reference.grouped_scale_cast_reference(prod, a_rows, False, w_amax, group, 256, torch.bfloat16)),
        f"dense epilogue {acc.shape[0]}x{acc.shape[1]} fp32 -> bf16": (
            6 * acc.numel(), dense, unspecialized(ke, dense),
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


# --- what a GEMM that decodes its FP4 operands in its prologue would save, and what such a GEMM costs ---------

EXPERT_SHAPES = (("w1/w3", 65536, 2048, 768), ("w2", 65536, 768, 2048))  # Qwen3-30B-A3B: 8192 tokens x top-8
EXPERTS = 128


X_ROWS, X_T_BLOCKS = "forward: x rows (4/6)", "wgrad: x^T token blocks (RHT, 4/6)"
SHARED_BY_W1_W3 = (X_ROWS, X_T_BLOCKS)
"""The w1/w3 operands of their common input, quantized once for both GEMMs (ops.four_over_six_grouped_mms)."""


def _full_recipe_pieces(label, m, k, n, rep_ms, rounds):
    """Each operand of the full 4/6 recipe's grouped GEMM (forward and quantized backward), quantized with the
    bf16 decode the emulated GEMMs read and without it (what an FP4 GEMM, or one decoding in its prologue,
    reads), and the dgrad's decode of the weight tiles: the decode's share of the operand work."""
    from titan_fp4six.numerics.groups import RowGroups, TokenBlocks
    from titan_fp4six.quant.amax import run_expert_amax, run_token_groups
    from titan_fp4six.quant.backends import Backends
    from titan_fp4six.quant.operands import RoleQuantizer
    from titan_fp4six.quant.quantize import run_decode_block_scaled

    plan = FourOverSixRecipe(backward="quantized", wgrad_rht=True, gradient_rounding="stochastic",
                             weight_block="16x16").plan(grouped=True)
    gen = torch.Generator().manual_seed(0)
    A = _bf16_input(m, k)
    W = (_bf16_input(EXPERTS * n, k) * k ** -0.5).contiguous()
    dy = _bf16_input(m, n)
    offs = _offsets(m, EXPERTS, "cuda", gen)
    a_amax, group_of_row, _ = run_token_groups(A, offs, False, "triton")
    dy_amax = run_token_groups(dy, offs, False, "triton")[0]
    w_amax = run_expert_amax(W, EXPERTS, "triton")
    groups = RowGroups(group_of_row, EXPERTS, amax_by_group=True)
    tb = TokenBlocks.of(offs, m)
    fns = {}
    for decode in (True, False):
        role = {r: RoleQuantizer(getattr(plan, r), Backends("triton", not decode)) for r in ("x", "w", "dy", "dy_t",
                                                                                              "x_t")}
        dy_rht, x_rht = role["dy_t"].transform_token_blocks(dy, tb), role["x_t"].transform_token_blocks(A, tb)
        fns.update({
            (X_ROWS, decode): lambda r=role: r["x"].rows(A, a_amax, groups),
            ("forward: W 16x16 tiles (4/6)", decode): lambda r=role: r["w"].rows(W, w_amax),
            ("dgrad: dy rows (stochastic)", decode): lambda r=role: r["dy"].rows(dy, dy_amax, groups),
            ("wgrad: dy^T token blocks (RHT, stochastic)", decode):
                lambda r=role, t=dy_rht: r["dy_t"].token_blocks(dy, tb, dy_amax, group_of_row, t),
            (X_T_BLOCKS, decode): lambda r=role, t=x_rht: r["x_t"].token_blocks(A, tb, a_amax, group_of_row, t),
        })
    w_op = RoleQuantizer(plan.w, Backends("triton", False)).rows(W, w_amax)
    codes, scales = w_op.codes, w_op.scales
    decode = "dgrad: decode of W's tiles (none: the FP4 GEMM reads the tiles' codes)"
    fns[(decode, True)] = lambda: run_decode_block_scaled(codes, scales, "triton")
    t = _least_of_rounds(fns, rep_ms, rounds)
    return [(label, name, t[(name, True)], t.get((name, False), 0.0)) for name in dict.fromkeys(n for n, _ in fns)]


def _layer_count(row: tuple) -> int:
    """How often a layer's step runs a prologue-operands row: w1/w3's own operands twice, their shared x once."""
    return 2 if row[0] == "w1/w3" and row[1] not in SHARED_BY_W1_W3 else 1


def prologue_operands_table(rows: list) -> str:
    """speed.md's prologue-operands section: each grouped operand of the full recipe with and without the bf16
    decode (rows: (GEMM, operand, with ms, without ms), _full_recipe_pieces'), and one layer's sum."""
    lines = ["| GEMM | operand | with bf16 decode (ms) | without (ms) | decode's share |",
             "| --- | --- | --- | --- | --- |"]
    for label, name, with_dec, without in rows:
        lines.append(f"| {label} | {name} | {with_dec:.3f} | {without:.3f} | {1 - without / with_dec:.0%} |")
    per_layer = [sum(_layer_count(r) * r[i] for r in rows) for i in (2, 3)]
    lines.append(f"| one layer | w1 and w3 at the first shape (their shared x once), w2 at the second | "
                 f"{per_layer[0]:.3f} | "
                 f"{per_layer[1]:.3f} | {1 - per_layer[1] / per_layer[0]:.0%} |")
    return "\n".join(lines) + "\n"


PROLOGUE_GEMM_HEADER = ("| shape M x K x N | torch.mm (FP32 out) ms | Triton plain GEMM ms (best config) | "
                        "Triton / torch.mm | torch._grouped_mm ms |\n| --- | --- | --- | --- | --- |")


def _prologue_gemm_row(label, m, k, n, t_torch, t_triton, config, t_grouped) -> str:
    return (f"| {label} {m} x {k} x {n} | {t_torch:.3f} | {t_triton:.3f} {config} | {t_triton / t_torch:.2f}x | "
            f"{t_grouped:.3f} |")


def prologue_gemm_table(gemms: list) -> str:
    """speed.md's prologue-gemm section: a plain Triton bf16 GEMM against torch.mm and torch._grouped_mm (gemms:
    (label, m, k, n, torch.mm ms, Triton ms, its config, torch._grouped_mm ms))."""
    return "\n".join([PROLOGUE_GEMM_HEADER, *(_prologue_gemm_row(*g) for g in gemms)]) + "\n"


def prologue_budget(rep_ms, rounds) -> tuple[str, str]:
    """The operand work a decode-in-prologue GEMM removes (the quantizers' bf16 decode writes and the dgrad's
    decode), and the price of leaving cuBLAS/CUTLASS: a plain Triton bf16 GEMM (no decode at all, FP32 output)
    against torch.mm at the expert GEMMs' sizes, and torch._grouped_mm at the same sizes. Printed; returns the two
    tables' markdown."""
    from scripts.plain_mm import CONFIGS, plain_mm

    rows = []
    for label, m, k, n in EXPERT_SHAPES:
        rows += _full_recipe_pieces(label, m, k, n, rep_ms, rounds)
    print("\nFull 4/6 recipe, grouped GEMM operands at Qwen3-30B-A3B expert shapes (128 experts, 65536 routed rows)\n")
    operands = prologue_operands_table(rows)
    print(operands, end="")
    print("\nbf16 GEMMs, FP32 accumulation\n")
    print(PROLOGUE_GEMM_HEADER)
    gemms = []
    gen = torch.Generator().manual_seed(0)
    for label, m, k, n in EXPERT_SHAPES:
        a, w = _bf16_input(m, k), _bf16_input(n, k)
        offs = _offsets(m, EXPERTS, "cuda", gen)
        we = _bf16_input(EXPERTS * n, k).view(EXPERTS, n, k)
        t_torch = min(_ms(lambda: torch.mm(a, w.t(), out_dtype=torch.float32), rep_ms) for _ in range(rounds))
        t_grouped = min(_ms(lambda: torch._grouped_mm(a, we.transpose(-2, -1), offs=offs), rep_ms)
                        for _ in range(rounds))
        want = torch.mm(a, w.t(), out_dtype=torch.float32)
        best = min((min(_ms(lambda c=cfg: plain_mm(a, w, *c), rep_ms) for _ in range(rounds)), cfg)
                   for cfg in CONFIGS if torch.allclose(plain_mm(a, w, *cfg), want, rtol=1e-3, atol=1e-3))
        gemms.append((label, m, k, n, t_torch, best[0], best[1], t_grouped))
        print(_prologue_gemm_row(*gemms[-1]), flush=True)
    return operands, prologue_gemm_table(gemms)


# The layouts in which the full 4/6 recipe quantizes an operand by 4/6, each against the plain NVFP4 full recipe's
# quantization of the same operand (its twin: map-to-6 only, scale bound 448, the same block and kernel), both with
# the bf16 decode the emulated GEMMs read on Hopper, or without it (the Blackwell path's operands).
LAYOUT_EXPERTS = 64  # equal token groups of the grouped layouts
# The kernel benchmark's two large shapes, and routed tokens x Qwen3-30B-A3B's expert width: rows of 48 blocks,
# where a program's fixed work weighs more (the 4/6 choice has more of it)
LAYOUT_SHAPES = ((16384, 7168), (8192, 5120), (65536, 768))


def layout_kernels(m, k, rep_ms, rounds) -> dict:
    """Each 4/6 layout of the full recipe (rows with a per-tensor or per-token-group amax, 16x16 weight tiles with
    one amax per tensor or per expert, x^T read columnwise or by token blocks, of equal groups or of routed ones
    padded as training has them) against its plain-NVFP4 twin on the same bytes, with and without the decode.
    Printed; returns {(layout, decode): {"fos": ms, "nvfp4": ms}}."""
    from titan_fp4six.kernels import quantize as kq
    from titan_fp4six.modules.experts import GROUP_ALIGN, pad_token_groups
    from titan_fp4six.numerics.groups import RowGroups, TokenBlocks
    from titan_fp4six.quant.amax import run_token_groups
    from titan_fp4six.quant.process_state import map4_count_buffer
    from titan_fp4six.quant.recipe import plain_nvfp4

    x = _bf16_input(m, k)
    amax = tensor_amax(x)
    offs = (torch.arange(1, LAYOUT_EXPERTS + 1, device="cuda") * (m // LAYOUT_EXPERTS)).to(torch.int32)
    group_amax, group_of_row, _ = run_token_groups(x, offs, False, "reference")
    expert_amax = x.view(LAYOUT_EXPERTS, -1).abs().amax(dim=1).float()  # x's rows as 64 experts' weights
    groups = RowGroups(group_of_row, LAYOUT_EXPERTS, amax_by_group=True)
    blocks = TokenBlocks.of(offs, m)
    def routed(weights):
        """x's rows dealt to the experts by `weights` (one per expert) and each group padded with zero rows, as
        the experts module hands them to the grouped op (every group's last blocks hold a few tokens and zeros):
        (the padded rows, their token blocks, each group's amax)."""
        dealt = torch.multinomial(weights, m, replacement=True, generator=torch.Generator("cuda").manual_seed(0))
        padded, sizes, _ = pad_token_groups(x, torch.bincount(dealt, minlength=weights.numel()), GROUP_ALIGN)
        ends = torch.cumsum(sizes, 0).to(torch.int32)
        return padded, TokenBlocks.of(ends, padded.shape[0]), run_token_groups(padded, ends, False, "reference")[0]

    even = routed(torch.ones(LAYOUT_EXPERTS, device="cuda"))
    # 128 experts of Zipf-skewed loads, as an untrained router deals them: many groups of a few tokens
    skewed = routed(1 / torch.arange(1, 2 * LAYOUT_EXPERTS + 1, device="cuda", dtype=torch.float32))
    counts = map4_count_buffer("cuda")  # the ops' running count; the twin's map-to-6-only kernel counts too (zeros)
    full = FourOverSixRecipe(backward="quantized")  # the full recipe's x, W (16x16) and x^T specs; dy is NVFP4 in both
    recipes = {"fos": full, "nvfp4": plain_nvfp4(full)}
    def rows(spec, d):
        return kq.quantize(x, amax, spec, d, map4=False)

    layouts = {  # name: (the operand role whose spec it quantizes by, grouped, call)
        "rows, per-tensor amax (dense x)": ("x", False, rows),
        "rows, per-group amax (grouped x)": ("x", True, lambda spec, d: kq.quantize(x, group_amax, spec, d,
                                                                                    groups=groups, map4=False)),
        "16x16 tiles (weights)": ("w", False, rows),
        "16x16 tiles, one amax per expert (expert weights)": ("w", False, lambda spec, d: kq.quantize(
            x, expert_amax, spec, d, map4=False)),
        "the same, map-to-4 blocks counted (a logged step's)": ("w", False, lambda spec, d: kq.quantize(
            x, expert_amax, spec, d, map4=counts)),
        "columns (dense x^T, wgrad)": ("x_t", False, lambda spec, d: kq.quantize_columnwise(x, amax, spec, d,
                                                                                           map4=False)),
        "token blocks (grouped x^T, wgrad)": ("x_t", True, lambda spec, d: kq.quantize_token_blocks(
            x, blocks, group_amax, spec, d)),
        "token blocks, routed groups padded with zero rows": ("x_t", True, lambda spec, d: kq.quantize_token_blocks(
            *even, spec, d)),
        "token blocks, 128 routed groups of skewed sizes, padded": (
            "x_t", True, lambda spec, d: kq.quantize_token_blocks(*skewed, spec, d)),
    }
    specs = {(name, which): getattr(recipes[which].plan(grouped), role)
             for name, (role, grouped, _) in layouts.items() for which in recipes}
    fns = {(name, d, which): (lambda f=f, spec=specs[(name, which)], d=d: f(spec, d))
           for name, (_, _, f) in layouts.items() for d in (True, False) for which in recipes}
    t = _least_of_rounds(fns, rep_ms, rounds)
    print(f"\n{m}x{k} bf16 x, {LAYOUT_EXPERTS} token groups\n\n| layout | decode | 4/6 ms | NVFP4 ms | 4/6 / NVFP4 |"
          "\n|---|---|---|---|---|")
    out = {}
    for name in layouts:
        for d in (True, False):
            r = out[(name, d)] = {"fos": t[(name, d, "fos")], "nvfp4": t[(name, d, "nvfp4")]}
            print(f"| {name} | {d} | {r['fos']:.3f} | {r['nvfp4']:.3f} | {r['fos'] / r['nvfp4']:.2f}x |", flush=True)
    return out


LAYOUT_TARGET = 1.15  # each 4/6 layout's kernel time within this factor of plain NVFP4's on the same bytes


def layouts_table(by_shape: dict) -> str:
    """speed.md's kernels-layouts section: each 4/6 layout's kernel time over plain NVFP4's at each shape of
    `kernels --only layouts`, with and without the decode, against LAYOUT_TARGET."""
    shapes = " / ".join(f"{m}x{k}" for m, k in by_shape)
    lines = [f"| layout (4/6 / plain NVFP4 kernel time at {shapes}) | with the decode (Hopper) | without "
             f"(Blackwell) | target | met with / without the decode |", "| --- | --- | --- | --- | --- |"]
    first = next(iter(by_shape.values()))
    for name in dict.fromkeys(n for n, _ in first):
        cells, met = [], []
        for d in (True, False):
            ratios = [r[(name, d)]["fos"] / r[(name, d)]["nvfp4"] for r in by_shape.values()]
            met.append("yes" if max(ratios) <= LAYOUT_TARGET else f"no ({max(ratios):.3f}x)")
            cells.append(" / ".join(f"{x:.2f}x" for x in ratios) + " (" + " / ".join(
                f"{r[(name, d)]['fos']:.3f} vs {r[(name, d)]['nvfp4']:.3f} ms" for r in by_shape.values()) + ")")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | <= {LAYOUT_TARGET:.2f}x | {met[0]} / {met[1]} |")
    return "\n".join(lines)


KERNELS_DOCS = {  # `kernels --only X --docs`: the (page, section) of each table X measures (None: no --only)
    None: ((SPEED_PAGE, "kernels-operands"), ),
    "operands": ((SPEED_PAGE, "kernels-operands"), ),
    "epilogue": (),  # quoted in prose only (speed.md, kernels.md), no table
    "columns": ((KERNELS_PAGE, "kernels-columns"), ),
    "prologue": ((SPEED_PAGE, "prologue-operands"), (SPEED_PAGE, "prologue-gemm")),
    "layouts": ((SPEED_PAGE, "kernels-layouts"), ),
}


def cmd_kernels(args):
    if args.docs and not KERNELS_DOCS[args.only]:
        raise SystemExit(f"scripts.bench kernels --only {args.only}: no results page has its table; drop --docs")
    _needs_cuda("kernels")
    _header(args.rounds)
    tables = {}
    if args.only in (None, "operands"):
        tables["kernels-operands"] = operands_table(
            {(m, k): operand_kernels(m, k, args.rep_ms, args.rounds) for m, k in KERNEL_SHAPES})
    if args.only in (None, "epilogue"):
        epilogue_and_amax(args.rep_ms, args.rounds)
    if args.only == "columns":
        tables["kernels-columns"] = "\n".join(column_launches(m, k, args.rep_ms, args.rounds) for m, k in KERNEL_SHAPES)
    if args.only == "prologue":
        tables["prologue-operands"], tables["prologue-gemm"] = prologue_budget(args.rep_ms, args.rounds)
    if args.only == "layouts":
        tables["kernels-layouts"] = layouts_table(
            {(m, k): layout_kernels(m, k, args.rep_ms, args.rounds) for m, k in LAYOUT_SHAPES})
    if args.docs:
        for page, name in KERNELS_DOCS[args.only]:
            results_page.write_section(page, name, tables[name])


# --- host and GPU time of whole op calls (gemm, ops) ----------------------------------------------------------

def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_ms(fn, iters: int, warmup: int = 3) -> float:
    """Mean time per call with the queue kept full (GPU time when the device is the bottleneck)."""
    for _ in range(warmup):
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


def _fwd_bwd(fn, inputs, dy):
    def step():
        for t in inputs:
            t.grad = None
        fn().backward(dy)
    return step


# --- gemm: fwd+bwd of the 4/6 GEMMs at DeepSeek-V3 / Qwen3-30B-A3B shapes against the bf16 op ----------------

DENSE = [  # name, tokens M, in K, out N
    ("dsv3 attn wq_a 7168->1536", 8192, 7168, 1536),
    ("dsv3 shared-expert w1 7168->2048", 8192, 7168, 2048),
    ("qwen3-30b-a3b q_proj 2048->4096", 8192, 2048, 4096),
]
GROUPED = [  # name, routed rows M, K, N, experts E (top-8 routing; DeepSeek-V3: 256 experts over 8-way EP)
    ("dsv3 experts w1 (E=32 local)", 8192 * 8 // 2, 7168, 2048, 32),
    ("qwen3-30b-a3b experts w1", 8192 * 8, 2048, 768, 128),
    ("qwen3-30b-a3b experts w2", 8192 * 8, 768, 2048, 128),
]
QUICK_DENSE = [("quick dense", 256, 256, 128)]
GEMM_MODES = {  # the op rows of `gemm`: each backward mode, and the full recipe (16x16 weights by default)
    "quantized": FourOverSixRecipe(backward="quantized"),
    "quantized wgrad_rht": FourOverSixRecipe(backward="quantized", wgrad_rht=True),
    "full (rht, stochastic dy)": FourOverSixRecipe(backward="quantized", wgrad_rht=True,
                                                   gradient_rounding="stochastic"),
    "high_precision": FourOverSixRecipe(backward="high_precision"),
    "dequantized": FourOverSixRecipe(backward="dequantized"),
}
QUICK_GROUPED = [("quick grouped", 512, 256, 128, 4)]


def _host_syncs(step) -> int:
    """How many times one call of `step` makes the host wait for the GPU (torch's sync debug mode)."""
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _offsets(rows, experts, device, gen):
    """Token groups of uneven sizes (one empty), each padded to a multiple of 16, 1/16 of the rows as tail."""
    weights = torch.rand(experts, generator=gen) + 0.2
    weights[experts // 2] = 0
    sizes = (weights / weights.sum() * rows * 15 / 16 / 16).floor().long() * 16
    return torch.cumsum(sizes, 0).to(torch.int32).to(device)


def cmd_gemm(args):
    from titan_fp4six.quant.backends import backends_for

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(0)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    fp4 = backends_for("auto", "auto", device).fp4
    backend = "Blackwell NVFP4" if fp4 else "emulated (bf16 decode, FP32 accumulation)"
    print(f"device {name}, torch {torch.__version__}, GEMM backend: {backend}, bf16 decode for emulation {not fp4}; "
          f"fwd+bwd ms, mean of {args.iters} after {args.warmup} warm-up")
    print(f"{'shape':40s} {'op':36s} {'ms':>9s} {'x bf16':>7s} {'syncs':>6s}  (host syncs per fwd+bwd, GPU)")
    shapes = []  # gemm_table's rows

    def line(label, op, step, base=None) -> tuple[float, int]:
        ms = gpu_ms(step, args.iters, args.warmup)
        syncs = _host_syncs(step)
        print(f"{label:40s} {op:36s} {ms:9.3f} {ms / (base or ms):7.2f} {syncs:6d}")
        return ms, syncs

    for label, m, k, n in QUICK_DENSE if args.quick else DENSE:
        x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16).requires_grad_()
        w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16).requires_grad_()
        dy = torch.randn(m, n, generator=gen).to(device, torch.bfloat16)
        shapes.append({"shape": f"{label}, {m} tokens",
                       "bf16": line(label, "bf16 F.linear", _fwd_bwd(lambda: F.linear(x, w), (x, w), dy))})
        base = shapes[-1]["bf16"][0]
        for mode, recipe in GEMM_MODES.items():
            shapes[-1][mode] = line("", "4/6 linear " + mode, _fwd_bwd(
                lambda: four_over_six_linear(x, w, recipe=recipe), (x, w), dy), base)
        del x, w, dy

    for label, m, k, n, e in QUICK_GROUPED if args.quick else GROUPED:
        a = torch.randn(m, k, generator=gen).to(device, torch.bfloat16).requires_grad_()
        w = (torch.randn(e, n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16).requires_grad_()
        dy = torch.randn(m, n, generator=gen).to(device, torch.bfloat16)
        offs = _offsets(m, e, device, gen)
        shapes.append({"shape": f"{label}, {m} rows", "bf16": line(
            label, "bf16 torch._grouped_mm",
            _fwd_bwd(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), (a, w), dy))})
        base = shapes[-1]["bf16"][0]
        for mode, recipe in GEMM_MODES.items():
            shapes[-1][mode] = line("", "4/6 grouped " + mode, _fwd_bwd(
                lambda: four_over_six_grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe), (a, w), dy), base)
        del a, w, dy
    if args.docs:
        note = (f"{name}, GEMM backend: {backend}; fwd+bwd, mean of {args.iters} after {args.warmup} warm-up; "
                "ratio to the bf16 op in the same run; host syncs per fwd+bwd (torch's sync debug mode, GPU only) "
                "where any.")
        results_page.write_section(SPEED_PAGE, "gemm", gemm_table(shapes) + "\n" + note + "\n")


def gemm_table(shapes: list[dict]) -> str:
    """`gemm`'s figures as the markdown of speed.md's gemm section. shapes: one dict per shape, "shape" its label,
    "bf16" and each mode of GEMM_MODES (ms, host syncs) of its fwd+bwd."""
    def cell(ms, syncs, base):
        return f"{ms / base:.1f}x" + (f" ({syncs} syncs)" if syncs else "")

    lines = ["| shape | bf16 ms | " + " | ".join("4/6 " + mode for mode in GEMM_MODES) + " |",
             "| --- | --- |" + " --- |" * len(GEMM_MODES)]
    for row in shapes:
        base, syncs = row["bf16"]
        lines.append(f"| {row['shape']} | {base:.3f}" + (f" ({syncs} syncs)" if syncs else "") + " | "
                     + " | ".join(cell(*row[mode], base) if mode in row else "-" for mode in GEMM_MODES) + " |")
    return "\n".join(lines) + "\n"


# --- ops: the performance table's op rows --------------------------------------------------------------------

BACKWARD_MODES = ("quantized", "dequantized", "high_precision")


def cmd_ops(args):
    """1024^3 `four_over_six_linear` fwd+bwd per backward mode against bf16 `F.linear` (GPU time per iteration,
    queue kept full), the host time of one such call (after a sync, so nothing waits on the GPU), the same with
    the weight already quantized (a `cache_weights` micro-batch after the first), and the public
    `four_over_six_quantize` on 1024x1024 back to back (host and GPU time per call) and on 8192x5120 against the
    Triton kernel it launches. As in training: backward on the calling thread (the converters' setting, for the
    bf16 rows too), map-to-4 counting off (torchtitan counts it on logged steps only)."""
    from titan_fp4six.integration.backward_thread import run_backward_on_calling_thread
    from titan_fp4six.ops import quantize_linear_weight
    from titan_fp4six.quant.process_state import MAP4_STATS

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

    bf16 = _fwd_bwd(lambda: F.linear(x, w), (x, w), dy)
    cache = {}  # cache_weights_table's {mode: (ms, ms with the weight cached)}
    base = gpu_ms(bf16, args.iters)
    row(f"{n}^3 linear fwd+bwd bf16 (ms)", base, "ms", 1.0)
    row(f"{n}^3 linear fwd+bwd bf16 host (us)", host_us(bf16, args.iters), "us")
    for mode in BACKWARD_MODES:
        recipe = FourOverSixRecipe(backward=mode)
        fn = _fwd_bwd(lambda: four_over_six_linear(x, w, recipe=recipe), (x, w), dy)
        ms = gpu_ms(fn, args.iters)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode} (ms)", ms, "ms", ms / base)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode} host (us)", host_us(fn, args.iters), "us")
        qw = quantize_linear_weight(w, recipe=recipe)
        cached = gpu_ms(_fwd_bwd(lambda: four_over_six_linear(x, w, recipe=recipe, quantized_weight=qw), (x, w), dy),
                        args.iters)
        row(f"{n}^3 linear fwd+bwd 4/6 {mode}, weight cached (ms)", cached, "ms", cached / base)
        cache[mode] = ms, cached

    small = torch.randn(1024, 1024, generator=gen).to(device, torch.bfloat16)
    small_amax = tensor_amax(small)
    quantize = lambda: four_over_six_quantize(small, small_amax)  # noqa: E731
    row("public four_over_six_quantize 1024x1024 back to back (us/call)", gpu_ms(quantize, args.iters) * 1e3, "us")
    row("public four_over_six_quantize 1024x1024 host (us)", host_us(quantize, args.iters), "us")
    if device == "cuda":
        from titan_fp4six.kernels import quantize as kq

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
    if args.docs:
        results_page.write_section(SPEED_PAGE, "ops-cache-weights", cache_weights_table(n, cache))


def cache_weights_table(n: int, cache: dict) -> str:
    """speed.md's ops-cache-weights section: the n^3 linear's fwd+bwd per backward mode with the weight quantized in
    the forward and cached (cache: {mode: (ms, cached ms)}, from `ops`)."""
    modes = [mode for mode in BACKWARD_MODES if mode in cache]
    return "\n".join([
        f"| {n}^3 fwd+bwd | " + " | ".join(modes) + " |", "| --- |" + " --- |" * len(modes),
        "| weight quantized in the forward | " + " | ".join(f"{cache[mode][0]:.3f} ms" for mode in modes) + " |",
        "| weight cached (a micro-batch after the first) | "
        + " | ".join(f"{cached:.3f} ms ({cached / ms - 1:+.0%})" for ms, cached in map(cache.get, modes)) + " |",
    ]) + "\n"


# --- compare: `ops --json` runs of two trees (the least and range of each row) --------------------------------

def compare_table(before: list[dict], after: list[dict]) -> str:
    """Each row of `ops --json` files (the runs of one tree before, of another after, alternated on one machine):
    the least value and the range over each tree's runs, and after / before of the leasts (speed.md's
    ops-compare section). A row only one side has shows "-" for the other."""
    def values(runs):
        out = {}
        for run in runs:
            for r in run["rows"]:
                out.setdefault(r["name"], (r["unit"], []))[1].append(r["value"])
        return out

    def cell(side, name):
        if name not in side:
            return "-"
        unit, v = side[name]
        fmt = ".0f" if unit == "us" else ".3f"
        return f"{min(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"

    b, a = values(before), values(after)
    lines = [f"| row | before: least (range), {len(before)} runs | after: least (range), {len(after)} runs | "
             "after / before (least) |", "| --- | --- | --- | --- |"]
    for name in dict.fromkeys([*a, *b]):
        ratio = f"{min(a[name][1]) / min(b[name][1]):.2f}" if name in a and name in b else "-"
        lines.append(f"| {name} | {cell(b, name)} | {cell(a, name)} | {ratio} |")
    return "\n".join(lines) + "\n"


def cmd_compare(args):
    def load(paths):
        runs = []
        for path in paths:
            with open(path) as f:
                runs.append(json.load(f))
        return runs

    table = compare_table(load(args.before), load(args.after))
    print(table, end="")
    if args.docs:
        results_page.write_section(SPEED_PAGE, "ops-compare", table)


# --- warm: compile the quantizer variants that tests, benchmarks and training launch, in parallel --------------

DTYPES = ("bfloat16", "float16", "float32")
KNOBS = list(itertools.product(("mae", "mse"), (256, 448)))
# (dtype, kind, err_mode, bound, decode, amax per row, map4: "mask", "none" or "count", token groups: None,
# "group" or "row"). The public quantizers' (every knob, with and without decode, per tensor or per row, writing
# the map-to-4 mask), the columnwise ones (x^T read in place), then the ops' (map-to-4 counted on logged steps),
# grouped activations and the quantized backward's columnwise.
VARIANTS = [(dtype, block, *knobs, decode, row_amax, "mask", None) for dtype in DTYPES for row_amax in (False, True)
            for block, knobs, decode in itertools.product(("1x16", "16x16"), KNOBS, (False, True))]
VARIANTS += [(dtype, "nvfp4", None, 448, decode, row_amax, "mask", None) for dtype in DTYPES
             for row_amax in (False, True) for decode in (False, True)]
VARIANTS += [(dtype, "columnwise", *knobs, decode, False, "mask", None) for dtype in DTYPES for knobs in KNOBS
             for decode in (False, True)]
VARIANTS += [(dtype, "nvfp4_columnwise", None, 448, decode, False, "mask", None) for dtype in DTYPES
             for decode in (False, True)]
VARIANTS += [("bfloat16", block, *knobs, True, False, map4, None) for block in ("1x16", "16x16") for knobs in KNOBS
             for map4 in ("none", "count")]
VARIANTS += [("bfloat16", "1x16", *knobs, True, False, map4, groups) for knobs in KNOBS for map4 in ("none", "count")
             for groups in ("group", "row")]
VARIANTS += [("bfloat16", "columnwise", *knobs, True, False, "none", None) for knobs in KNOBS]


def _compile(variant) -> str:
    from titan_fp4six.kernels import quantize as kq
    from titan_fp4six.numerics.formats import map4_count_buffer
    from titan_fp4six.numerics.groups import RowGroups

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


def cmd_warm(args):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _needs_cuda("warm")
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_compile, VARIANTS))
    print(f"ran {len(done)} quantizer variants (those sharing a kernel, such as 1x16 with either amax, compile once)")


def docs_run_problem(args) -> str | None:
    """Why this run's figures must not replace the H200 tables of docs/results/ (None: they may): a smoke run on
    the CPU, `gemm --quick` or `ops --size` other than the table's would overwrite a GPU measurement."""
    import torch

    if not torch.cuda.is_available():
        return "the tables are GPU measurements and this machine has no CUDA device"
    if getattr(args, "quick", False):
        return "--quick shapes are a smoke test, not the table's shapes"
    if getattr(args, "size", 1024) != 1024:
        return f"--size {args.size}: the table is of the 1024^3 linear"
    return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, rep_ms, what in (("quantize", cmd_quantize, 200.0, "the 4/6 quantizer vs copy, reference, NVFP4"),
                                   ("kernels", cmd_kernels, 100.0, "operand kernels, epilogue and row amax")):
        s = sub.add_parser(name, help=what)
        s.add_argument("--rep-ms", type=float, default=rep_ms, help="timed milliseconds per measurement")
        s.add_argument("--rounds", type=int, default=3, help="rounds per case; each time is the least median")
        s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
        s.set_defaults(run=fn)
    sub.choices["kernels"].add_argument("--only", choices=("operands", "epilogue", "columns", "prologue", "layouts"),
                                        help="one part of the benchmark (columns: the columnwise launch sweep; "
                                             "prologue: what a decode-in-prologue GEMM would save and cost; "
                                             "layouts: each 4/6 layout against the plain NVFP4 recipe's; these "
                                             "three only when asked)")
    s = sub.add_parser("gemm", help="fwd+bwd of the 4/6 GEMMs at model shapes vs the bf16 op")
    s.add_argument("--iters", type=int, default=5)
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--quick", action="store_true", help="tiny shapes (smoke test on any device)")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s.set_defaults(run=cmd_gemm)
    s = sub.add_parser("ops", help="the performance table's op rows")
    s.add_argument("--iters", type=int, default=50)
    s.add_argument("--size", type=int, default=1024, help="M = K = N of the linear (small for a CPU smoke test)")
    s.add_argument("--json", help="also write the rows here")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s.set_defaults(run=cmd_ops)
    s = sub.add_parser("compare", help="`ops --json` files of two trees: each row's least and range, after / before")
    s.add_argument("--before", nargs="+", required=True, metavar="JSON", help="`ops --json` files of the first tree")
    s.add_argument("--after", nargs="+", required=True, metavar="JSON", help="`ops --json` files of the second tree")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s.set_defaults(run=cmd_compare)
    s = sub.add_parser("warm", help="compile the quantizer variants in parallel processes")
    s.add_argument("--jobs", type=int, default=16)
    s.set_defaults(run=cmd_warm)
    args = p.parse_args(argv)
    problem = getattr(args, "docs", False) and args.command != "compare" and docs_run_problem(args)
    if problem:
        p.error(f"--docs: {problem}")
    args.run(args)


if __name__ == "__main__":
    main()
