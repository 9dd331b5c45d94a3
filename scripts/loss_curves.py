"""Loss curves: train a recipe next to its bf16 twin (same seed, same data order) and plot the gap.

    python -m scripts.loss_curves --name deepseek_v3 --out docs --steps 300 \\
        --run "bf16=configs/deepseek_v3_debugmodel_bf16.toml" \\
        --run "4/6=configs/deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml" \\
        [--parallel] [--timeout 600] [-- --training.seq_len 1024 ...common overrides]
    python -m scripts.loss_curves --name deepseek_v3 --out docs --plot-only   # re-plot from <name>_loss.json

The first --run is the baseline every gap is taken against. Each run is `python -m titan_fp4six.train` with
`--training.steps N --metrics.log_freq 1 --debug.seed 0` added; torchtitan's data loader does not shuffle, so
every run sees the same batches in the same order. --parallel starts all runs at once (small debug models
leave most of a GPU idle; the losses do not depend on it, the tps printed do).

Plain NVFP4: the recipes' `scope = "none"` with `scale_bound = 448` (configs/*_nvfp4*.toml without
four_over_six in the name); scripts/loss_curves_h200.sh runs bf16 / NVFP4 / 4/6 for both debug models.
"""

import json
import sys
import time
from pathlib import Path

from scripts.titan_runs import Run, parse_steps, runs_parser, start, wait

TAIL = 20  # steps averaged for the final-loss gap (a single step's loss is noisy)


def final_gap(baseline: dict, other: dict, tail: int = TAIL) -> dict:
    """Mean loss over the last `tail` steps both runs reached: other minus baseline, and both means."""
    common = sorted(set(baseline["loss"]) & set(other["loss"]))[-tail:]
    if not common:
        return {"steps": 0}
    base = sum(baseline["loss"][s] for s in common) / len(common)
    mean = sum(other["loss"][s] for s in common) / len(common)
    return {"steps": len(common), "last_step": common[-1], "baseline": base, "loss": mean, "gap": mean - base}


def collect(runs: list[Run], logs: dict[str, Path], codes: dict[str, int]) -> dict:
    out = {}
    for run in runs:
        rows = parse_steps(logs[run.label].read_text())
        out[run.label] = {"config": run.config, "overrides": run.overrides, "exit_code": codes[run.label],
                          "log": logs[run.label].name, "loss": {r["step"]: r["loss"] for r in rows},
                          "tps": {r["step"]: r.get("tps") for r in rows},
                          "map4": {r["step"]: r["map4"] for r in rows if "map4" in r}}
    return out


def markdown(name: str, results: dict) -> str:
    labels = list(results)
    lines = [f"| {name} run | steps | exit | mean loss, last {TAIL} steps | gap to {labels[0]} | map-to-4 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label in labels:
        g = final_gap(results[labels[0]], results[label])
        map4 = list(results[label].get("map4", {}).values())
        share = f"{100 * sum(map4) / len(map4):.1f}%" if map4 else "-"
        if not g["steps"]:
            lines.append(f"| {label} | 0 | {results[label]['exit_code']} | - | - | {share} |")
            continue
        lines.append(f"| {label} | {g['last_step']} | {results[label]['exit_code']} | {g['loss']:.4f} | "
                     f"{g['gap']:+.4f} | {share} |")
    return "\n".join(lines)


def plot(name: str, results: dict, path: Path, smooth: int = 10) -> None:
    """Loss vs step (raw, faint; moving average, solid) and the moving-average gap to the first run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def moving(steps, values):
        return [sum(values[max(0, i - smooth + 1): i + 1]) / len(values[max(0, i - smooth + 1): i + 1])
                for i in range(len(steps))]

    labels = list(results)
    base = {int(k): v for k, v in results[labels[0]]["loss"].items()}
    fig, (ax, gap_ax) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for label in labels:
        loss = {int(k): v for k, v in results[label]["loss"].items()}
        steps = sorted(loss)
        if not steps:
            continue
        values = [loss[s] for s in steps]
        line, = ax.plot(steps, moving(steps, values), label=label)
        ax.plot(steps, values, color=line.get_color(), alpha=0.25, lw=0.7)
        if label != labels[0]:
            both = [s for s in steps if s in base]
            diff = [loss[s] - base[s] for s in both]
            gap_ax.plot(both, moving(both, diff), color=line.get_color(), label=f"{label} - {labels[0]}")
    ax.set_ylabel("training loss")
    ax.set_title(f"{name}: loss vs step ({smooth}-step moving average; raw faint)")
    ax.legend()
    gap_ax.axhline(0.0, color="k", lw=0.8)
    gap_ax.set_xlabel("step")
    gap_ax.set_ylabel(f"loss gap to {labels[0]}")
    gap_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p, argv, common = runs_parser(list(sys.argv[1:] if argv is None else argv), __doc__)
    p.add_argument("--name", required=True, help="model name used in file names and titles")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--parallel", action="store_true", help="start every run at once")
    p.add_argument("--timeout", type=float, default=None, help="seconds before unfinished runs are stopped")
    p.add_argument("--plot-only", action="store_true", help="re-plot <out>/<name>_loss.json")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{args.name}_loss.json"
    if args.plot_only:
        results = json.loads(json_path.read_text())
        for result in results.values():  # JSON keys are strings; the steps are ints (sorted, tabled as ints)
            result["loss"] = {int(k): v for k, v in result["loss"].items()}
    else:
        if len(args.run) < 2:
            p.error("give at least two --run (the first is the baseline)")
        common = ["--training.steps", str(args.steps), "--metrics.log_freq", "1", "--debug.seed", "0", *common]
        procs, logs, codes = {}, {}, {}
        for run in args.run:
            logs[run.label] = args.out / f"{args.name}_{run.slug}.log"
            procs[run.label] = start(run, common, logs[run.label])
            if not args.parallel:
                codes[run.label] = wait(procs[run.label], args.timeout)
        started = time.monotonic()  # parallel runs share one deadline
        for run in args.run:
            if run.label not in codes:
                left = None if args.timeout is None else max(1.0, args.timeout - (time.monotonic() - started))
                codes[run.label] = wait(procs[run.label], left)
        results = collect(args.run, logs, codes)
        json_path.write_text(json.dumps(results, indent=1))
    table = markdown(args.name, results)
    print(table)
    (args.out / f"{args.name}_loss.md").write_text(table + "\n")
    try:
        plot(args.name, results, args.out / f"{args.name}_loss.png")
    except ImportError:
        print("matplotlib missing (pip install titan_fp4six[plots]): no PNG; re-run with --plot-only",
              file=sys.stderr)


if __name__ == "__main__":
    main()
