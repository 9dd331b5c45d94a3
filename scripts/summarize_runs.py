"""Summarize torchtitan training logs: final loss, mean tps and MFU after warm-up, and ratios to the bf16 twin.

Why: the bf16 twin of each recipe (same model, data, schedule and seed) is the baseline; ratios measured in the
same invocation on the same machine are the only speed figures worth quoting. The twin of `X_nvfp4_...` is the
log named `X_bf16`. Usage: python -m scripts.summarize_runs LOG... [--skip 10]
"""

import argparse
import sys
from pathlib import Path

from scripts.titan_runs import parse_steps


def parse(path: Path) -> dict[int, tuple[float, float, float]]:
    """{step: (loss, tps, mfu)} from torchtitan's console step lines."""
    return {row["step"]: (row["loss"], row["tps"], row["mfu"])
            for row in parse_steps(path.read_text(errors="replace"))}


def twin(name: str) -> str:
    return name.split("_nvfp4")[0] + "_bf16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--skip", type=int, default=10, help="steps excluded from the speed means (warm-up, compile)")
    args = parser.parse_args()
    stats = {}
    for log in args.logs:
        rows = parse(log)
        if not rows:
            print(f"{log.stem}: no step lines")
            continue
        last = max(rows)
        timed = [r for s, r in rows.items() if s > args.skip] or list(rows.values())
        stats[log.stem] = (last, rows[last][0], sum(r[1] for r in timed) / len(timed), sum(r[2] for r in timed) / len(timed))
    print(f"{'recipe':58} {'step':>4} {'loss':>8} {'tps':>10} {'mfu%':>6} {'tps/bf16':>8} {'mfu/bf16':>8} {'dloss':>7}")
    for name, (last, loss, tps, mfu) in stats.items():
        base = stats.get(twin(name)) if "_nvfp4" in name else None
        ratios = (f"{tps / base[2]:8.3f} {mfu / base[3] if base[3] else float('nan'):8.3f} {loss - base[1]:+7.3f}"
                  if base else f"{'':8} {'':8} {'':7}")
        print(f"{name:58} {last:4} {loss:8.4f} {tps:10.0f} {mfu:6.2f} {ratios}")


if __name__ == "__main__":
    main()
