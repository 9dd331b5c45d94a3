"""What a comparison found: per-run outcomes read from the logs, per-variant statistics, the table's intervals
read together (Holm), and the markdown table, JSON and plot written from them.

A run that crashed, timed out or diverged stays in every output with its status; the statistics use the seeds
whose runs finished (paired statistics: the seeds where both runs finished), and say how many that is.
"""

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .runs import Job, parse_steps
from .stats import Estimate, Ratio, fieller_ratio, final_loss, holm, mean_interval, paired_p, spikes
from .variants import BF16, NVFP4


@dataclass
class Outcome:
    """One (variant, seed) run as its log tells it."""

    variant: str
    seed: int
    status: str  # "ok", "diverged", "failed" or "not run"
    detail: str
    final: float | None
    losses: dict[int, float] = field(repr=False)
    grad_norms: dict[int, float] = field(repr=False)
    spike_steps: list[int]


def read_outcome(job: Job, steps: int, tail: int, spike_factor: float) -> Outcome:
    code = job.exit_code()
    rows = parse_steps(job.log.read_text(errors="replace")) if job.log.is_file() else []
    losses = {int(r["step"]): r["loss"] for r in rows if "loss" in r}
    norms = {int(r["step"]): r["grad_norm"] for r in rows if "grad_norm" in r}
    bad = [s for s in sorted(losses) if not math.isfinite(losses[s])]
    bad += [s for s in sorted(norms) if not math.isfinite(norms[s]) and s not in bad]
    spike_steps = spikes({s: g for s, g in norms.items() if math.isfinite(g)}, spike_factor)
    last = max(losses, default=0)
    final, status = None, "ok"
    if code is None:
        status, detail = "not run", "no exit file: not run yet, or interrupted"
    elif bad:
        status, detail = "diverged", f"non-finite loss or grad norm at step {min(bad)} (exit {code})"
    elif code != 0 or last < steps:
        status, detail = "failed", f"exit {code} after {last} of {steps} steps; see {job.log.name}"
    else:
        try:
            final, detail = final_loss(losses, steps, tail), ""
        except ValueError as e:  # e.g. metrics.log_freq > 1: the tail is not in the log
            status, detail = "failed", f"{e} in {job.log.name} (log every step: --metrics.log_freq 1)"
    return Outcome(job.variant, job.seed, status, detail, final, losses, norms, spike_steps)


@dataclass
class VariantSummary:
    name: str
    seeds: int
    ok: int
    final: Estimate | None
    gap_to_bf16: Estimate | None
    gap_to_nvfp4: Estimate | None
    nvfp4_gap_closed: Ratio | None
    spikes: int
    max_grad_norm: float | None
    problems: list[str]


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[list[float], list[int]]:
    seeds = sorted(set(a) & set(b))
    return [a[s] - b[s] for s in seeds], seeds


def _maybe(samples: list[float]) -> Estimate | None:
    return mean_interval(samples) if samples else None


def summarize(outcomes: list[Outcome], variants: list[str]) -> list[VariantSummary]:
    finals = {v: {o.seed: o.final for o in outcomes if o.variant == v and o.status == "ok"} for v in variants}
    out = []
    for v in variants:
        mine = [o for o in outcomes if o.variant == v]
        gap_bf16 = _maybe(_paired(finals[v], finals[BF16])[0]) if v != BF16 else None
        gap_nv = closed = None
        if v not in (BF16, NVFP4) and NVFP4 in finals:
            gap_nv = _maybe(_paired(finals[v], finals[NVFP4])[0])
            seeds = sorted(set(finals[v]) & set(finals[NVFP4]) & set(finals[BF16]))
            if len(seeds) >= 2:
                d_nv = [finals[NVFP4][s] - finals[BF16][s] for s in seeds]
                d_v = [finals[v][s] - finals[BF16][s] for s in seeds]
                closed = fieller_ratio([x - y for x, y in zip(d_nv, d_v)], d_nv)
        ended = [o for o in mine if o.status in ("ok", "diverged")]  # a partial run's spikes would skew the count
        norms = [g for o in ended for g in o.grad_norms.values() if math.isfinite(g)]
        out.append(VariantSummary(
            v, len(mine), len(finals[v]), _maybe(list(finals[v].values())), gap_bf16, gap_nv, closed,
            sum(len(o.spike_steps) for o in ended), max(norms, default=None),
            [f"seed {o.seed}: {o.status}, {o.detail}" for o in mine if o.status != "ok"]))
    return out


def family(summaries: list[VariantSummary]) -> list[dict]:
    """The table's paired intervals (each variant's gap to bf16, and to NVFP4) read as one family: each with its
    two-sided p-value and whether Holm's step-down at a family-wise 5% keeps "excludes 0"."""
    tests = [(f"{s.name} - {base}", e) for s in summaries
             for base, e in ((BF16, s.gap_to_bf16), (NVFP4, s.gap_to_nvfp4)) if e is not None and e.sd is not None]
    pvalues = [paired_p(e) for _, e in tests]
    return [{"comparison": name, "mean": e.mean, "n": e.n, "p": p, "excludes_zero": e.excludes_zero(),
             "holm_excludes_zero": kept} for (name, e), p, kept in zip(tests, pvalues, holm(pvalues))]


def _family_line(tests: list[dict]) -> str:
    kept = [f"{t['comparison']} (p = {t['p']:.2g})" for t in tests if t["holm_excludes_zero"]]
    lost = [t["comparison"] for t in tests if t["excludes_zero"] and not t["holm_excludes_zero"]]
    line = (f"Read together (Holm's step-down over the table's {len(tests)} paired intervals, family-wise 5%): "
            + (", ".join(kept) + " exclude 0" if kept else "none excludes 0"))
    if lost:
        line += f"; excluding 0 on its own interval only: {', '.join(lost)}"
    return line + "."


def verdict(e: Estimate | None, lower: str, higher: str) -> str:
    """`lower` when the interval lies below 0, `higher` above, else 'not distinguishable'."""
    if e is None or e.low is None:
        return "n/a (fewer than 2 paired seeds)"
    if e.high < 0:
        return lower
    if e.low > 0:
        return higher
    return "not distinguishable"


def _est(e: Estimate | None, signed: bool = True) -> str:
    if e is None:
        return "-"
    fmt = "{:+.4f}" if signed else "{:.4f}"
    if e.low is None:
        return fmt.format(e.mean) + f" (n={e.n})"
    return f"{fmt.format(e.mean)} [{fmt.format(e.low)}, {fmt.format(e.high)}] (n={e.n})"


def _ratio(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if not r.bounded:
        return f"not estimable: NVFP4's gap not distinguishable from 0 (n={r.n})"
    return f"{100 * r.value:.0f}% [{100 * r.low:.0f}%, {100 * r.high:.0f}%] (n={r.n})"


def markdown(summaries: list[VariantSummary], outcomes: list[Outcome], setup: str) -> str:
    lines = [setup, "",
             "| variant | runs ok | final loss, mean [95% CI] | gap to bf16 (paired) | vs NVFP4 (paired) | "
             "NVFP4 gap closed | grad-norm spikes, max norm (finished runs) | verdict vs bf16 | verdict vs NVFP4 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summaries:
        norm = f"{s.spikes}, {s.max_grad_norm:.2f}" if s.max_grad_norm is not None else f"{s.spikes}, -"
        vs_bf16 = verdict(s.gap_to_bf16, "lower loss", "higher loss") if s.name != BF16 else "-"
        vs_nv = verdict(s.gap_to_nvfp4, "helps", "hurts") if s.gap_to_nvfp4 is not None else "-"
        lines.append(f"| {s.name} | {s.ok}/{s.seeds} | {_est(s.final, signed=False)} | {_est(s.gap_to_bf16)} | "
                     f"{_est(s.gap_to_nvfp4)} | {_ratio(s.nvfp4_gap_closed)} | {norm} | {vs_bf16} | {vs_nv} |")
    tests = family(summaries)
    if len(tests) > 1:
        lines += ["", _family_line(tests)]
    bf16 = next((s for s in summaries if s.name == BF16), None)
    if bf16 and bf16.final and bf16.final.sd is not None:
        lines += ["", f"bf16 seed-to-seed standard deviation of the final loss: {bf16.final.sd:.4f} nats."]
    seeds = sorted({o.seed for o in outcomes})
    names = [s.name for s in summaries]
    lines += ["", "Final loss per seed (status where a run did not finish):", "",
              "| seed | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    by = {(o.variant, o.seed): o for o in outcomes}
    for seed in seeds:
        cells = []
        for n in names:
            o = by.get((n, seed))
            cells.append("-" if o is None else f"{o.final:.4f}" if o.status == "ok" else f"**{o.status}**")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    problems = [f"- {s.name} {p}" for s in summaries for p in s.problems]
    if problems:
        lines += ["", "Runs that did not finish (kept out of the statistics, never dropped from the report):", *problems]
    return "\n".join(lines) + "\n"


def to_json(summaries: list[VariantSummary], outcomes: list[Outcome], meta: dict) -> str:
    runs = [{"variant": o.variant, "seed": o.seed, "status": o.status, "detail": o.detail, "final": o.final,
             "spike_steps": o.spike_steps, "loss": o.losses, "grad_norm": o.grad_norms} for o in outcomes]
    return json.dumps({"meta": meta, "variants": [asdict(s) for s in summaries], "family": family(summaries),
                       "runs": runs}, indent=1, allow_nan=True)


def _smooth(values: list[float], width: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= width:
            acc -= values[i - width]
        out.append(acc / min(i + 1, width))
    return out


def plot(outcomes: list[Outcome], variants: list[str], steps: int, path: Path, title: str) -> None:
    """Two panels: each variant's mean loss (20-step moving average) with a band of +-1 seed sd, and its paired
    gap to bf16 per step (same smoothing) with a 95% band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [o for o in outcomes if o.status == "ok"]
    width = max(1, min(20, steps // 10))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    xs = list(range(1, steps + 1))
    late, shown = max(1, steps // 5), []
    base = {o.seed: _smooth([o.losses[s] for s in xs], width) for o in ok if o.variant == BF16}
    for v in variants:
        curves = {o.seed: _smooth([o.losses[s] for s in xs], width) for o in ok if o.variant == v}
        if not curves:
            continue
        cols = list(zip(*curves.values()))
        mean = [statistics.fmean(c) for c in cols]
        sd = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in cols]
        line, = top.plot(xs, mean, label=f"{v} (n={len(curves)})", lw=1.2)
        top.fill_between(xs, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                         color=line.get_color(), alpha=0.2)
        seeds = sorted(set(curves) & set(base))
        if v == BF16 or len(seeds) < 2:
            continue
        gaps = [mean_interval([curves[s][i] - base[s][i] for s in seeds]) for i in range(steps)]
        shown += [g.mean for g in gaps[late:]]
        bottom.plot(xs, [g.mean for g in gaps], color=line.get_color(), lw=1.2, label=f"{v} - bf16 (n={len(seeds)})")
        bottom.fill_between(xs, [g.low for g in gaps], [g.high for g in gaps], color=line.get_color(), alpha=0.2)
    top.set_ylabel(f"loss ({width}-step mean), band: +-1 sd over seeds")
    top.set_title(title)
    top.legend()
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_ylabel("paired gap to bf16, band: 95% CI")
    bottom.set_xlabel("step")
    bottom.legend()
    if shown:  # the first steps' gaps are large and would flatten the rest
        pad = 0.2 * (max(shown) - min(shown) + 1e-3)
        bottom.set_ylim(min(min(shown), 0) - pad, max(max(shown), 0) + pad)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
