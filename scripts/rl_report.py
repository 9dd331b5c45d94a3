"""Figures and table of docs/rl.md from the runs of scripts/rl_runs.sh.

    python scripts/rl_report.py OUT_DIR [--docs docs]

Reads OUT_DIR/<run>/rl_metrics.jsonl (one JSON line per GRPO step, written by `python -m titan_fp4six.rl`) for
the runs nvfp4_consistent, nvfp4_fast and bf16_fast; writes <docs>/rl_reward.png (reward per step, 10-step
moving average), <docs>/rl_mismatch.png (max and mean |trainer - rollout| logprob per step, symlog scale so
exact zeros show) and replaces the text between the report markers of <docs>/rl.md with the tokens/s and
mismatch table.
"""

import argparse
import json
import statistics
from pathlib import Path

RUNS = {"nvfp4_consistent": "4/6 row-scaled, consistent", "nvfp4_fast": "4/6 row-scaled, fast",
        "bf16_fast": "bf16, fast"}
BEGIN, END = "<!-- rl_report:begin -->", "<!-- rl_report:end -->"
TAIL = 20


def load(out: Path) -> dict[str, list[dict]]:
    runs = {}
    for name in RUNS:
        path = out / name / "rl_metrics.jsonl"
        if path.is_file():
            runs[name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not runs:
        raise SystemExit(f"no {', '.join(f'{n}/rl_metrics.jsonl' for n in RUNS)} under {out}")
    return runs


def moving_average(values: list[float], window: int = 10) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def summary(steps: list[dict], wall: float | None) -> dict:
    """Tokens/s are medians over steps after the first (start-up and first quantization excluded)."""
    body = steps[1:] or steps
    return {
        "steps": len(steps),
        "reward_first": statistics.fmean(s["reward"] for s in steps[:TAIL]),
        "reward_last": statistics.fmean(s["reward"] for s in steps[-TAIL:]),
        "mismatch_max": max(s["mismatch_max"] for s in steps),
        "mismatch_mean": statistics.fmean(s["mismatch_mean"] for s in steps),
        "kl": statistics.fmean(s["mismatch_kl"] for s in steps),
        "zero_steps": sum(s["mismatch_max"] == 0 for s in steps),
        "gen_tps": statistics.median(s["gen_tps"] for s in body),
        "train_tps": statistics.median(s["train_tps"] for s in body),
        "wall_s": wall,
    }


def table(runs: dict[str, list[dict]], out: Path) -> str:
    rows = []
    stats = {}
    for name, steps in runs.items():
        wall_file = out / name / "wall.json"
        wall = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else None
        stats[name] = s = summary(steps, wall)
        rows.append(f"| {RUNS[name]} | {s['steps']} | {s['reward_first']:.3f} -> {s['reward_last']:.3f} | "
                    f"{s['mismatch_max']:.3g} | {s['mismatch_mean']:.3g} | {s['kl']:.3g} | "
                    f"{s['zero_steps']}/{s['steps']} | {s['gen_tps']:,.0f} | {s['train_tps']:,.0f} | "
                    f"{'' if wall is None else wall} |")
    text = ["| run | steps | reward (first -> last 20 steps) | max mismatch | mean mismatch | KL(rollout, trainer) "
            "| steps with mismatch 0 | generation tok/s | training tok/s | wall s |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]
    if "nvfp4_consistent" in stats and "nvfp4_fast" in stats:
        c, f = stats["nvfp4_consistent"], stats["nvfp4_fast"]
        text.append("")
        text.append(f"Consistent mode costs: generation {c['gen_tps'] / f['gen_tps']:.2f}x and training "
                    f"{c['train_tps'] / f['train_tps']:.2f}x the fast mode's tokens/s (medians over steps 2..N).")
    return "\n".join(text)


def plot(runs: dict[str, list[dict]], docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps in runs.items():
        ax.plot([s["step"] for s in steps], moving_average([s["reward"] for s in steps]), label=RUNS[name])
    ax.set(xlabel="GRPO step", ylabel="reward (10-step mean)", title="Copy task, Qwen3 MoE debugmodel")
    ax.legend()
    fig.tight_layout()
    fig.savefig(docs / "rl_reward.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps in runs.items():
        x = [s["step"] for s in steps]
        (line,) = ax.plot(x, [s["mismatch_max"] for s in steps], label=f"{RUNS[name]}: max")
        ax.plot(x, [s["mismatch_mean"] for s in steps], linestyle="--", color=line.get_color(),
                label=f"{RUNS[name]}: mean")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set(xlabel="GRPO step", ylabel="|trainer - rollout| logprob",
           title="Trainer/rollout mismatch (0 = bitwise equal)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(docs / "rl_mismatch.png", dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the OUT_DIR given to scripts/rl_runs.sh")
    parser.add_argument("--docs", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = parser.parse_args()
    runs = load(args.out)
    plot(runs, args.docs)
    report = table(runs, args.out)
    doc = args.docs / "rl.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} lacks the {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    body = f"{report}\n\n![reward](rl_reward.png)\n\n![mismatch](rl_mismatch.png)\n"
    doc.write_text(f"{head}{BEGIN}\n{body}{END}{rest.split(END, 1)[1]}")
    print(report)


if __name__ == "__main__":
    main()
