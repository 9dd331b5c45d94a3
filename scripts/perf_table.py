"""Issue 18's table from one `scripts/perf_h200.sh` output directory: every row's figure, target and whether
it is met, each ratio against the bf16 twin measured in the same invocation, as markdown (OUT/table.md) and a
bar plot of figure / target (OUT/table.png). Rows whose part was not run say so.

    python3 -m scripts.perf_table OUT
"""

import argparse
import json
import statistics
from pathlib import Path

from scripts.throughput import pair_ratios

# (workload, file under OUT, figure, target, at least (True) or at most (False))
ROWS = (
    ("qwen3_moe_debug 4/6 / bf16", "debug_qwen3/throughput.json",
     ("tps", "Qwen3 MoE 4/6 | eager", "Qwen3 MoE bf16 | eager"), 0.90, True),
    ("30B-A3B-4layers experts / bf16, eager", "30b/throughput.json", ("tps", "4/6 experts | eager", "bf16 | eager"),
     0.95, True),
    ("30B-A3B-4layers experts / bf16, compiled", "30b/throughput.json",
     ("tps", "4/6 experts | compiled", "bf16 | compiled"), 0.92, True),
    ("1024^3 fwd+bwd / bf16, quantized", "ops.json", ("op", "1024^3 linear fwd+bwd 4/6 quantized (ms)"), 2.0, False),
    ("1024^3 fwd+bwd / bf16, dequantized", "ops.json", ("op", "1024^3 linear fwd+bwd 4/6 dequantized (ms)"), 1.5,
     False),
    ("1024^3 fwd+bwd / bf16, high_precision", "ops.json", ("op", "1024^3 linear fwd+bwd 4/6 high_precision (ms)"),
     1.3, False),
    ("deepseek_v3_debugmodel 4/6 all Linears / bf16", "debug/throughput.json",
     ("tps", "DeepSeek 4/6 all Linears | eager", "DeepSeek bf16 | eager"), 0.60, True),
    ("deepseek_v3_debugmodel 4/6 dequantized / bf16", "debug/throughput.json",
     ("tps", "DeepSeek 4/6 dequantized | eager", "DeepSeek bf16 | eager"), 0.85, True),
    ("GPU busy, DeepSeek-V3 4/6 step (profiler)", "profiles/deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears"
     ".profile.json", ("busy", ), 0.85, True),
    ("public quantize 1024x1024, host us per call", "ops.json",
     ("value", "public four_over_six_quantize 1024x1024 back to back (us/call)"), 20.0, False),
    ("peak memory / bf16 (largest of the recipes)", "", ("memory", ), 1.05, False),
)
THROUGHPUT_FILES = ("debug/throughput.json", "debug_qwen3/throughput.json", "30b/throughput.json")


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _results(data: dict) -> dict:
    return data["results"] if "results" in data else data


def _tps_ratio(data: dict, run: str, twin: str) -> tuple[float, str] | None:
    results = _results(data)
    if not (results.get(run, {}).get("tps") and results.get(twin, {}).get("tps")):
        return None
    pairs = pair_ratios(results[run], results[twin])
    spread = f" (pairs {', '.join(f'{p:.2f}' for p in pairs)})" if len(pairs) > 1 else ""
    return statistics.median(pairs), f"{statistics.median(pairs):.2f}{spread}"


def _op_value(data: dict, name: str, key: str) -> tuple[float, str] | None:
    row = next((r for r in data["rows"] if r["name"] == name), None)
    if row is None or row.get(key) is None:
        return None
    value = row[key]
    return value, (f"{value:.1f}x" if key == "ratio" else f"{value:.1f}")


def _memory(out: Path) -> tuple[float, str] | None:
    """The largest peak-memory ratio of a 4/6 run to its file's first run (the bf16 twin), same mode."""
    ratios = []
    for name in THROUGHPUT_FILES:
        data = _load(out / name)
        if data is None:
            continue
        results = _results(data)
        first = next(iter(results)).split(" | ")[0]
        for key, r in results.items():
            twin = results.get(f"{first} | {key.split(' | ')[1]}", {})
            if r.get("memory_gib") and twin.get("memory_gib") and not key.startswith(first):
                ratios.append(r["memory_gib"] / twin["memory_gib"])
    return (max(ratios), f"{max(ratios):.2f}") if ratios else None


def figure(out: Path, source: str, spec: tuple) -> tuple[float, str] | None:
    """(value, text) of one row, None when its part did not run or its runs failed."""
    if spec[0] == "memory":
        return _memory(out)
    data = _load(out / source)
    if data is None:
        return None
    if spec[0] == "tps":
        return _tps_ratio(data, *spec[1:])
    if spec[0] == "busy":
        return data["gpu_busy"], f"{data['gpu_busy']:.0%} ({data['kernels']:,} kernels, wall {data['wall_ms']:.1f} ms)"
    return _op_value(data, spec[1], "ratio" if spec[0] == "op" else "value")


def build(out: Path) -> tuple[str, list]:
    lines = ["| workload | measured | target | met |", "| --- | --- | --- | --- |"]
    bars = []
    for workload, source, spec, target, at_least in ROWS:
        got = figure(out, source, spec)
        bound = f"{'>=' if at_least else '<='} {target:g}"
        if got is None:
            lines.append(f"| {workload} | not measured | {bound} | - |")
            continue
        value, text = got
        met = value >= target if at_least else value <= target
        lines.append(f"| {workload} | {text} | {bound} | {'yes' if met else 'no'} |")
        bars.append((workload, value / target if at_least else target / value, met))
    return "\n".join(lines), bars


def plot(bars: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.2))
    names = [b[0] for b in bars]
    ax.barh(names, [b[1] for b in bars], color=["tab:green" if b[2] else "tab:red" for b in bars])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("figure / target (1 = target; right of it: met; time and memory rows inverted)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the output directory of scripts/perf_h200.sh")
    args = p.parse_args(argv)
    md, bars = build(args.out)
    print(md)
    (args.out / "table.md").write_text(md + "\n")
    try:
        plot(bars, args.out / "table.png")
    except ImportError:
        print("matplotlib missing: no PNG")


if __name__ == "__main__":
    main()
