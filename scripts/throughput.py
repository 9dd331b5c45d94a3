"""End-to-end training throughput and peak memory of bf16 vs four-over-six recipes, eager and compiled, as ratios.

    python -m scripts.throughput --out docs --steps 25 --warmup 10 \\
        --run "bf16=configs/qwen3_moe_debug_bf16.toml" \\
        --run "4/6 experts=configs/qwen3_moe_debug_nvfp4_four_over_six.toml" \\
        -- --model.flavor 30B-A3B-4layers --experimental.custom_import titan_fp4six.integration.flavors --training.local_batch_size 4 --training.seq_len 2048
    python -m scripts.throughput --out docs --plot-only

Every run trains `--steps` steps through `python -m titan_fp4six.train` (one at a time, so runs do not share the
GPU), eager and then with `--compile.enable` (`--modes eager` or `--modes compiled` for one). tokens/s is the
median of torchtitan's per-step tps after the first `--warmup` steps (compilation and allocator warm-up);
memory is the largest per-step peak of reserved device memory torchtitan reports. Ratios are to the first
--run in the same mode and to the first --run eager; all numbers come from the same invocation.

`--repeat N` trains the list N times over, in turn (bf16, 4/6, bf16, 4/6, ...): on the H200 machine here the
host speed of a process varies from run to run (DeepSeek-V3 4/6, host-bound, gave 105k-147k tps in seven runs
of one recipe), so one pair can mislead. A repeated run's tps is the median over its trials, its memory the
largest, and "vs first same mode" the median of the ratios of trials run back to back (trial i against the
first run's trial i), with their range.
"""

import json
import statistics
import sys
import time
from pathlib import Path

from scripts.titan_runs import Run, parse_steps, runs_parser, start, wait

MODES = {"eager": [], "compiled": ["--compile.enable", "--compile.components", "model,loss"]}


def summarize(rows: list[dict], warmup: int) -> dict:
    """Median tps after warmup and peak memory over all steps (None when no step past warmup was logged)."""
    steady = [r for r in rows if r["step"] > warmup and "tps" in r]
    mem = [r["memory"] for r in rows if "memory" in r]
    return {"steps": len(rows), "tps": statistics.median(r["tps"] for r in steady) if steady else None,
            "memory_gib": max(mem) if mem else None,
            "mfu": statistics.median(r["mfu"] for r in steady if "mfu" in r) if steady else None,
            "losses": [r["loss"] for r in rows]}


def combine(trials: list[dict]) -> dict:
    """One run's trials as one entry: median tps and MFU, largest memory, the trials kept for paired ratios."""
    tps = [t["tps"] for t in trials if t["tps"]]
    mem = [t["memory_gib"] for t in trials if t["memory_gib"]]
    mfu = [t["mfu"] for t in trials if t.get("mfu")]
    return {**trials[0], "tps": statistics.median(tps) if tps else None, "memory_gib": max(mem) if mem else None,
            "mfu": statistics.median(mfu) if mfu else None,
            "exit_code": next((t["exit_code"] for t in trials if t["exit_code"]), 0), "trials": trials}


def pair_ratios(r: dict, ref: dict) -> list[float]:
    """tps / the reference's tps, trial by trial (same repetition, back to back)."""
    return [a["tps"] / b["tps"] for a, b in zip(r.get("trials", [r]), ref.get("trials", [ref]))
            if a["tps"] and b.get("tps")]


def paired_ratio(r: dict, ref: dict) -> str:
    """pair_ratios as text: the median and, with more than one pair, the range."""
    pairs = pair_ratios(r, ref)
    if not pairs:
        return "-"
    spread = f" ({min(pairs):.2f}-{max(pairs):.2f})" if len(pairs) > 1 else ""
    return f"{statistics.median(pairs):.2f}x{spread}"


def table(results: dict) -> str:
    """Markdown: one row per (run, mode) with tps, memory and the two ratios."""
    labels = list(dict.fromkeys(k.split(" | ")[0] for k in results))
    modes = list(dict.fromkeys(k.split(" | ")[1] for k in results))
    first = labels[0]
    ref_eager = results.get(f"{first} | eager", {}).get("tps")
    lines = [f"| run | mode | tokens/s | vs {first} same mode | vs {first} eager | peak reserved GiB | "
             f"memory vs {first} same mode | MFU % |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    for label in labels:
        for mode in modes:
            r = results.get(f"{label} | {mode}")
            if r is None:
                continue
            ref = results.get(f"{first} | {mode}", {})
            tps = f"{r['tps']:,.0f}" if r["tps"] else f"failed (exit {r['exit_code']})"
            measured = [t["tps"] for t in r.get("trials", ()) if t["tps"]]
            if len(measured) > 1:
                tps += f" (trials {min(measured):,.0f}-{max(measured):,.0f})"
            mem = f"{r['memory_gib']:.1f}" if r["memory_gib"] else "-"
            mfu = f"{r['mfu']:.1f}" if r.get("mfu") else "-"
            lines.append(f"| {label} | {mode} | {tps} | {paired_ratio(r, ref)} | "
                         f"{ratio(r['tps'], ref_eager)} | {mem} | {ratio(r['memory_gib'], ref.get('memory_gib'))} | "
                         f"{mfu} |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in results if results[k]["tps"]]
    first = next(iter(results)).split(" | ")[0]
    fig, (ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for key in keys:
        mode = key.split(" | ")[1]
        ref = results.get(f"{first} | {mode}", {})
        if ref.get("tps"):
            ax.bar(key.replace(" | ", "\n"), results[key]["tps"] / ref["tps"])
            mem_ax.bar(key.replace(" | ", "\n"), results[key]["memory_gib"] / ref["memory_gib"])
    for a, what in ((ax, "tokens/s"), (mem_ax, "peak reserved memory")):
        a.axhline(1.0, color="k", lw=0.8)
        a.set_ylabel(f"{what} / {first} (same mode)")
        a.tick_params(axis="x", labelsize=7)
    ax.axhline(0.75, color="r", lw=0.8, ls="--")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p, argv, common = runs_parser(list(sys.argv[1:] if argv is None else argv), __doc__)
    p.add_argument("--modes", default="eager,compiled", help="comma list of: " + ", ".join(MODES))
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1, help="train the list of runs this many times, in turn")
    p.add_argument("--timeout", type=float, default=None, help="seconds per training before it is stopped")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all trainings together; a run that would start with under 15 s left is skipped")
    p.add_argument("--plot-only", action="store_true", help="re-plot <out>/throughput.json")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "throughput.json"
    if args.plot_only:
        results = json.loads(json_path.read_text())
    else:
        modes = args.modes.split(",")
        unknown = set(modes) - set(MODES)
        if unknown or not args.run:
            p.error(f"--modes must be from {sorted(MODES)} (got {sorted(unknown)}) and at least one --run given")
        common = ["--training.steps", str(args.steps), "--metrics.log_freq", "1", *common]
        trials = {}
        deadline = time.monotonic() + args.budget if args.budget else None
        for mode in modes:  # eager runs first: they are the ones the budget must not cut
            for rep in range(args.repeat):
                for run in args.run:
                    r = Run(f"{run.label} | {mode}", run.config, run.overrides + MODES[mode])
                    timeout = args.timeout
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left < 15:
                            print(f"{r.label}: skipped, budget spent", file=sys.stderr)
                            continue
                        timeout = min(timeout or left, left)
                    log = args.out / f"throughput_{r.slug}{f'_{rep + 1}' if args.repeat > 1 else ''}.log"
                    proc = start(r, common, log)
                    code = wait(proc, timeout)
                    trial = {**summarize(parse_steps(log.read_text()), args.warmup), "exit_code": code,
                             "log": log.name, "config": run.config, "overrides": r.overrides}
                    trials.setdefault(r.label, []).append(trial)
                    print(f"{r.label} ({rep + 1}/{args.repeat}): {trial['tps']} tps, exit {code}", file=sys.stderr,
                          flush=True)
        results = {label: combine(ts) for label, ts in trials.items()}
        json_path.write_text(json.dumps({"common": common, "results": results}, indent=1))
    results = results["results"] if "results" in results else results
    md = table(results)
    print(md)
    (args.out / "throughput.md").write_text(md + "\n")
    try:
        plot(results, args.out / "throughput.png")
    except ImportError:
        print("matplotlib missing (pip install titan_fp4six[plots]): no PNG; re-run with --plot-only",
              file=sys.stderr)


if __name__ == "__main__":
    main()
