"""Training-run drivers: throughput, profiles, the performance table, parity and compile checks, RL signal.

    python -m scripts.runs throughput --out OUT --run "LABEL=CONFIG [overrides]" ... [-- trainer overrides]
    python -m scripts.runs profile OUT CONFIG.toml ... [-- trainer overrides]
    python -m scripts.runs perf OUT [kernels ops debug 30b profiles]     # docs/results/speed.md's table, then `table`
    python -m scripts.runs table OUT                                      # the table from what OUT holds
    python -m scripts.runs parity --global-batch 8 --out OUT -- --job.config_file CONFIG.toml ...
    python -m scripts.runs parity-table OUT ...                          # the table of one or more `parity` runs
    python -m scripts.runs compare-profiles TWIN.profile.json RECIPE.profile.json   # kernel time by kind, side by side
    python -m scripts.runs compile-parity OUT
    python -m scripts.runs rl-signal --mode grpo

With --docs, a command writes its table into its section of a results page (scripts/results_page.py): `table`
and `perf` the first tables of docs/results/speed.md, `throughput`, `compare-profiles` and `project` the later
sections of speed.md they name, `parity-table` docs/results/parity.md's, `compile-parity` docs/results/compile.md's,
`rl-signal` (the table's own rows) docs/results/rl.md's.

Every training is `python -m titan_fp4six.train` in a subprocess, started by the package's one launcher
(titan_fp4six/integration/launch.py, as `python -m titan_fp4six.compare` starts its runs): the trainer users run
(converters, data loader, optimizer, compile), not a re-implementation; its console step lines are read back with
the package's parser. Arguments after `--` go to every training. Run from the repository root (the recipes' paths are
relative to it).
"""

import argparse
import bisect
import gzip
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from scripts import results_page
from titan_fp4six.compare.runs import parse_steps
from titan_fp4six.integration.launch import run_training, start_training, stop, training_command

ROOT = Path(__file__).resolve().parents[1]
DS = "configs/deepseek_v3_debugmodel"
QW = "configs/qwen3_moe_debug"
SPEED, PARITY_PAGE, COMPILE = "speed.md", "parity.md", "compile.md"  # the results pages in docs/results/


@dataclass
class Run:
    """One training: a label, a TOML recipe and extra CLI overrides (`--section.key value` pairs)."""

    label: str
    config: str
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str) -> "Run":
        """'LABEL=CONFIG [--section.key value ...]' as given on the command line."""
        if "=" not in spec:
            raise ValueError(f"--run {spec!r}: expected 'LABEL=CONFIG [--section.key value ...]'")
        label, rest = spec.split("=", 1)
        parts = shlex.split(rest)
        if not parts or not parts[0].endswith(".toml"):
            raise ValueError(f"--run {spec!r}: the part after '=' must start with a .toml recipe path")
        return cls(label.strip(), parts[0], parts[1:])

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.label).strip("_")


def command(run: Run, common: list[str]) -> list[str]:
    return training_command(["--job.config_file", run.config, *common, *run.overrides])


def start(run: Run, common: list[str], log: Path) -> subprocess.Popen:
    """Start the training in the background, console to `log` (its command the first line), dump folder
    outputs/<log name> (runs of one recipe side by side must not share it)."""
    cmd = command(run, [*common, "--job.dump_folder", f"outputs/{log.stem}"])
    return start_training(cmd, log, header="# " + shlex.join(cmd) + "\n")


def wait(proc: subprocess.Popen, timeout: float | None) -> int:
    """Exit status; a run past `timeout` seconds is terminated (its steps so far still count)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return stop(proc, grace=20)


# --- throughput: tokens/s and peak memory of bf16 vs 4/6 recipes, eager and compiled, as ratios ----------------

MODES = {"eager": [], "compiled": ["--compile.enable", "--compile.components", "model,loss"]}
# speed.md's sections of a `throughput` table
THROUGHPUT_SECTIONS = ("full-vs-nearest", "full-vs-bf16", "choice-vs-nvfp4")


def steady_state(rows: list[dict], warmup: int) -> dict:
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


def throughput_table(results: dict) -> str:
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


def cmd_throughput(args, common):
    """Every run trains --steps steps, one at a time (runs do not share the GPU), eager and then compiled
    (--modes to choose). tokens/s is the median of torchtitan's per-step tps after --warmup steps; memory the
    largest per-step peak of reserved memory. Ratios are to the first --run in the same mode and to its eager
    run, all from this invocation. --repeat N trains the list N times over, in turn (bf16, 4/6, bf16, ...): a
    host-bound run's speed varies from process to process, so a run's tps is the median of its trials and
    "vs first same mode" the median (range) of the ratios of trials run back to back. --docs SECTION writes the
    table into that section of docs/results/speed.md."""
    args.out.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    if set(modes) - set(MODES) or not args.run:
        raise SystemExit(f"--modes must be from {sorted(MODES)} (got {modes}) and at least one --run given")
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
                code = wait(start(r, common, log), timeout)
                trial = {**steady_state(parse_steps(log.read_text()), args.warmup), "exit_code": code,
                         "log": log.name, "config": run.config, "overrides": r.overrides}
                trials.setdefault(r.label, []).append(trial)
                print(f"{r.label} ({rep + 1}/{args.repeat}): {trial['tps']} tps, exit {code}", file=sys.stderr,
                      flush=True)
    results = {label: combine(ts) for label, ts in trials.items()}
    (args.out / "throughput.json").write_text(json.dumps({"common": common, "results": results}, indent=1))
    md = throughput_table(results)
    print(md)
    (args.out / "throughput.md").write_text(md + "\n")
    if args.docs:
        results_page.write_section(SPEED, args.docs, md)


# --- profile: one profiled training step per recipe, where its time goes ----------------------------------------

def load_trace(path: Path) -> list[dict]:
    """The events of a torch.profiler chrome trace (gzipped or not)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


KERNEL_KINDS = (  # (kind, name patterns), first match wins; the plugin's Triton kernels by their function names
    ("RHT", ("_rht16", "hadamard")),
    ("quantize", ("_quantize_kernel", "_stochastic")),
    ("decode", ("_decode_kernel",)),
    ("amax", ("amax", "_token_groups_kernel", "_row_max")),
    ("epilogue", ("_scale_cast_kernel",)),
    ("attention", ("flash", "fmha", "attn", "cudnn")),
    ("GEMM", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "wgmma", "grouped_mm", "cublas", "Kernel2")),
    ("gathers/scatters", ("index", "gather", "scatter", "CatArray", "sort", "histc", "cumsum", "nonzero")),
    ("copies/casts", ("copy", "memcpy", "memset", "fill")),
    ("reductions", ("reduce", "norm", "softmax", "max", "sum")),
)


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel by its name (KERNEL_KINDS), 'elementwise/other' for the rest."""
    lowered = name.lower()
    return next((kind for kind, patterns in KERNEL_KINDS if any(p.lower() in lowered for p in patterns)),
                "elementwise/other")


def _innermost_ops(events: list[dict], t0: float, t1: float):
    """launch event -> the innermost op (cpu_op) enclosing it on its thread, or None; ops nest, so walking back
    from the last op started before the launch, the first that still runs is the innermost."""
    by_tid = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["ts"] < t1 and e["ts"] + e["dur"] >= t0:
            by_tid[e["tid"]].append(e)
    starts = {}
    for tid, ops in by_tid.items():
        ops.sort(key=lambda e: e["ts"])
        starts[tid] = [e["ts"] for e in ops]

    def innermost(launch: dict):
        ops = by_tid.get(launch["tid"], [])
        for i in range(bisect.bisect_right(starts.get(launch["tid"], []), launch["ts"]) - 1, -1, -1):
            if ops[i]["ts"] + ops[i]["dur"] >= launch["ts"]:
                return ops[i]
        return None
    return innermost


QUANTIZE_RANGE = "titan_fp4six quantize "  # the role quantizers' profiler ranges, the role after it


def _enclosing(spans: list[tuple], launch: dict | None, default):
    """The name of the (tid, begin, end, name) span on the launch's thread that was open at the launch."""
    return next((name for tid, b, f, name in spans if launch is not None and launch["tid"] == tid
                 and b <= launch["ts"] < f), default)


def profile_step(events: list[dict], top: int = 12) -> dict:
    """The last profiled step (ProfilerStep#N): wall time, GPU busy (union of kernel intervals inside the step /
    wall), kernel count and time, kernel time by kind (kernel_kind), by the plugin op that launched it and by the
    innermost op that did (its name and input shapes: which aten call a copy or a fill comes from), the top kernels
    by total time, each quantize launch (its op, the operand role it quantized, grid and time) and the host time
    per call of the plugin's ops (titan_fp4six::*: custom ops when compiled, record_function ranges in eager).
    The role comes from the range the role quantizers open while a profiler records ("titan_fp4six quantize
    x_t"; quant/operands.py); None for a launch outside one."""
    steps = [e for e in events if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))]
    if not steps:
        raise ValueError("no ProfilerStep#N span in the trace")
    step = max(steps, key=lambda e: e["ts"])
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and t0 <= e["ts"] < t1]
    busy, end = 0.0, t0
    for k in sorted(kernels, key=lambda e: e["ts"]):  # union of intervals
        begin, stop = max(k["ts"], end), k["ts"] + k["dur"]
        if stop > begin:
            busy += stop - begin
            end = stop
    by_name, by_kind = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    kinds = [kernel_kind(k["name"]) for k in kernels]
    for k, kind in zip(kernels, kinds):
        for table, key in ((by_name, k["name"]), (by_kind, kind)):
            table[key][0] += 1
            table[key][1] += k["dur"]
    ops, ranges, roles = defaultdict(list), [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "user_annotation") or not t0 <= e["ts"] < t1:
            continue
        if e.get("name", "").startswith("titan_fp4six::"):
            ops[e["name"]].append(e["dur"])
            ranges.append((e["tid"], e["ts"], e["ts"] + e["dur"], e["name"]))
        elif e.get("name", "").startswith(QUANTIZE_RANGE):
            roles.append((e["tid"], e["ts"], e["ts"] + e["dur"], e["name"].removeprefix(QUANTIZE_RANGE)))
    # kernel time launched from inside each of the plugin's ops (a runtime launch event in the op's host range,
    # linked to its kernel by the correlation id), by kind; the rest ran outside them (torchtitan, autograd)
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X"
                and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    under = defaultdict(lambda: defaultdict(float))
    innermost, by_op = _innermost_ops(events, t0, t1), defaultdict(lambda: [0, 0.0])
    quantize_launches = []
    for k, kind in zip(kernels, kinds):
        launch = launches.get(k.get("args", {}).get("correlation"))
        owner = _enclosing(ranges, launch, "outside the plugin's ops")
        under[owner][kind] += k["dur"] / 1e3
        if kind == "quantize":
            quantize_launches.append({"op": owner, "role": _enclosing(roles, launch, None),
                                      "grid": k.get("args", {}).get("grid"), "ts": k["ts"], "us": k["dur"]})
        op = innermost(launch) if launch is not None else None
        label = "no op" if op is None else f"{op['name']} {op.get('args', {}).get('Input Dims', '')}"[:120]
        by_op[(kind, label)][0] += 1
        by_op[(kind, label)][1] += k["dur"] / 1e3
    return {
        "step": step["name"], "wall_ms": step["dur"] / 1e3, "gpu_busy": busy / step["dur"], "kernels": len(kernels),
        "kernel_ms": sum(k["dur"] for k in kernels) / 1e3,
        "kinds": {kind: {"count": c, "ms": d / 1e3}
                  for kind, (c, d) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])},
        "top": [{"name": n[:90], "count": c, "ms": d / 1e3}
                for n, (c, d) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]],
        "host_ops": {n: {"calls": len(d), "mean_ms": sum(d) / len(d) / 1e3} for n, d in sorted(ops.items())},
        "kernel_ms_by_op": {op: dict(sorted(kinds.items(), key=lambda kv: -kv[1])) for op, kinds in under.items()},
        "top_launching_ops": [{"kind": kind, "op": label, "count": c, "ms": d}
                              for (kind, label), (c, d) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]],
        "quantize_launches": sorted(quantize_launches, key=lambda q: (q["op"], q["ts"])),
    }


def top_kernels_table(top: list[dict]) -> str:
    """Markdown: a profiled step's kernels by total time (profile_step's "top")."""
    return "\n".join(["| kernel | count | ms |", "| --- | --- | --- |",
                      *(f"| `{t['name']}` | {t['count']} | {t['ms']:.2f} |" for t in top)])


def profile_summary_table(profiles: dict[str, dict]) -> str:
    """Markdown: one row per profiled step (label -> profile_step's summary): wall, GPU busy, kernels, kernel time,
    and the quantize kernels' time (launches)."""
    lines = ["| step | wall | GPU busy | kernels | kernel time | quantize kernel |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, s in profiles.items():
        q = s.get("kinds", {}).get("quantize")
        quantize = f"{q['ms']:.1f} ms ({q['count']})" if q else ""
        lines.append(f"| {label} | {s['wall_ms']:.1f} ms | {s['gpu_busy']:.0%} | {s['kernels']:,} | "
                     f"{s['kernel_ms']:.1f} ms | {quantize} |")
    return "\n".join(lines)


def _signed(x: float) -> str:
    return "0" if round(x, 1) == 0 else f"{x:+.1f}"


def kinds_table(twin: dict, recipe: dict, labels: tuple[str, str] = ("bf16 twin", "4/6 recipe")) -> str:
    """Markdown: two profiled steps (profile_step's summaries) side by side, kernel time (kernels) by kind, the
    recipe's extra ms, largest first, and a last row of wall, kernel time, GPU busy and kernel count."""
    a, b = twin.get("kinds", {}), recipe.get("kinds", {})
    kinds = sorted({*a, *b}, key=lambda k: (-max(a.get(k, {}).get("ms", 0.0), b.get(k, {}).get("ms", 0.0)), k))

    def cell(v):
        return f"{v['ms']:.1f} ({v['count']:,})" if v else ""

    def step(s):
        return (f"**{s['wall_ms']:.1f} ms wall, {s['kernel_ms']:.1f} ms kernels, {s['gpu_busy']:.0%} GPU busy, "
                f"{s['kernels']:,} kernels**")

    lines = [f"| kernel kind | {labels[0]}: ms (kernels) | {labels[1]}: ms (kernels) | extra ms |",
             "| --- | --- | --- | --- |"]
    for k in kinds:
        extra = b.get(k, {}).get("ms", 0.0) - a.get(k, {}).get("ms", 0.0)
        lines.append(f"| {k} | {cell(a.get(k))} | {cell(b.get(k))} | {_signed(extra)} |")
    lines.append(f"| **step** | {step(twin)} | {step(recipe)} | "
                 f"**{_signed(recipe['kernel_ms'] - twin['kernel_ms'])} ms kernels** |")
    return "\n".join(lines)


def launches_table(twin: dict, recipe: dict, labels: tuple[str, str], top: int = 12) -> str:
    """Markdown: the two steps' quantize launches paired in launch order within each plugin op (the same
    operands in the same order when both recipes launch as many), summed by op, operand role and grid (the 4/6
    kernel's grid: the layout and shape), the recipe's extra time largest first; '' when the launches do not
    pair. The role is '-' for profiles recorded before the role quantizers named their launches."""
    def by_op(s):
        out = defaultdict(list)
        for q in s.get("quantize_launches", []):
            out[q["op"]].append(q)
        return out

    a, b = by_op(twin), by_op(recipe)
    if not b or {op: len(v) for op, v in a.items()} != {op: len(v) for op, v in b.items()}:
        return ""
    rows = defaultdict(lambda: [0, 0.0, 0.0])
    for op in b:
        for qa, qb in zip(a[op], b[op]):
            row = rows[(op.removeprefix("titan_fp4six::"), qb.get("role") or "-", str(qb["grid"]))]
            row[0] += 1
            row[1] += qa["us"] / 1e3
            row[2] += qb["us"] / 1e3
    lines = [f"| op | operand | grid | launches | {labels[0]} ms | {labels[1]} ms | extra ms | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (op, role, grid), (n, ta, tb) in sorted(rows.items(), key=lambda kv: kv[1][1] - kv[1][2])[:top]:
        lines.append(f"| {op} | {role} | {grid} | {n} | {ta:.2f} | {tb:.2f} | {_signed(tb - ta)} | {tb / ta:.2f}x |")
    return "\n".join(lines)


def launched_by_table(s: dict) -> str:
    """Markdown: a profiled step's kernel time by the plugin op whose host range launched it (calls), by kind."""
    lines = ["| kernels launched by | ms by kind |", "| --- | --- |"]
    for op, kinds in sorted(s.get("kernel_ms_by_op", {}).items(), key=lambda kv: -sum(kv[1].values())):
        calls = s.get("host_ops", {}).get(op, {}).get("calls")
        name = (f"`{op}`" if op.startswith("titan_fp4six::") else op) + (f" ({calls} calls)" if calls else "")
        lines.append(f"| {name} | " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items())
                     + f" ({sum(kinds.values()):.1f} ms) |")
    return "\n".join(lines)


def profile_markdown(s: dict, label: str) -> str:
    lines = [f"**{label}** ({s['step']}): wall {s['wall_ms']:.1f} ms, GPU busy {s['gpu_busy']:.0%}, "
             f"{s['kernels']} kernels, kernel time {s['kernel_ms']:.1f} ms", "",
             "| kernel kind | count | ms |", "| --- | --- | --- |"]
    lines += [f"| {kind} | {v['count']} | {v['ms']:.2f} |" for kind, v in s.get("kinds", {}).items()]
    lines += ["", top_kernels_table(s["top"])]
    if s.get("kernel_ms_by_op"):
        lines += ["", launched_by_table(s)]
    if s.get("top_launching_ops"):
        lines += ["", "| kind | innermost op that launched it (input shapes) | kernels | ms |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {t['kind']} | `{t['op']}` | {t['count']} | {t['ms']:.2f} |" for t in s["top_launching_ops"]]
    if s["host_ops"]:
        lines += ["", "| op (host) | calls | mean ms |", "| --- | --- | --- |"]
        lines += [f"| `{n}` | {v['calls']} | {v['mean_ms']:.3f} |" for n, v in s["host_ops"].items()]
    return "\n".join(lines)


def cmd_profile(args, common):
    """Trains 11 steps of each recipe, profiles step 10 (after warm-up) with torch.profiler and writes
    OUT/<recipe>.log, .profile.md and .profile.json."""
    args.out.mkdir(parents=True, exist_ok=True)
    for config in args.configs:
        name = Path(config).stem
        dump = Path(os.environ.get("TMPDIR", "/tmp")) / "profile_recipes" / name
        log = args.out / f"{name}.log"
        run = Run(name, config, ["--training.steps", "11", "--profiling.enable_profiling", "--profiling.profile_freq",
                                 "10", "--profiling.profiler_warmup", "2", "--profiling.profiler_active", "1",
                                 "--metrics.log_freq", "1", "--metrics.disable_color_printing",
                                 "--job.dump_folder", str(dump), *common])
        try:
            code, _ = run_training(command(run, []), log, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = "timeout"
        trace = dump / "profile_traces" / "iteration_10" / "rank0_trace.json"
        if code != 0 or not trace.is_file():
            print(f"{name} failed ({code}):\n" + "\n".join(log.read_text().splitlines()[-20:]))
            continue
        s = profile_step(load_trace(trace))
        md = profile_markdown(s, name)
        print(md)
        (args.out / f"{name}.profile.md").write_text(md + "\n")
        (args.out / f"{name}.profile.json").write_text(json.dumps(s, indent=1))


# --- compare-profiles: two profiled steps side by side ------------------------------------------------------------

# `compare-profiles --docs PAIR`: speed.md's sections of that pair of profiles and the table each one shows
PROFILE_SECTIONS = {"full": {"full-kinds": "kinds", "full-by-op": "by-op"}, "compiled": {"compiled-kinds": "kinds"},
                    "choice": {"choice-kinds": "kinds"}}


def _profile_label(path: Path) -> str:
    return path.name.removesuffix(".json").removesuffix(".profile")


def cmd_compare_profiles(args, common):
    """Two profiles of `profile` (the bf16 twin's .profile.json, then the recipe's) side by side: kernel time and
    kernels by kind and the recipe's extra ms, the recipe's kernel time by the plugin op that launched it, and
    the quantize launches paired one by one (launches_table), printed. --docs full writes the first two tables
    into docs/results/speed.md's sections of the full recipe's step, --docs compiled the first into the compiled
    experts recipe's, --docs choice the first into the full 4/6 recipe's against plain NVFP4's (the NVFP4
    profile given as the twin)."""
    twin, recipe = (json.loads(Path(p).read_text()) for p in (args.twin, args.recipe))
    labels = tuple(args.labels) if args.labels else (_profile_label(args.twin), _profile_label(args.recipe))
    tables = {"kinds": kinds_table(twin, recipe, labels), "by-op": launched_by_table(recipe),
              "launches": launches_table(twin, recipe, labels)}
    print("\n\n".join(t for t in tables.values() if t))
    for name, table in PROFILE_SECTIONS.get(args.docs, {}).items():
        results_page.write_section(SPEED, name, tables[table])


# --- project: a profiled Hopper step projected onto Blackwell (B200) --------------------------------------------

# Published dense tensor throughput (TFLOPS) and HBM bandwidth (TB/s): H200 SXM; B200 (HGX, per GPU).
H200 = {"bf16": 989.0, "bandwidth": 4.8}
B200 = {"bf16": 2250.0, "fp4": 9000.0, "bandwidth": 8.0}
COMPUTE_KINDS = ("GEMM", "attention")
FP4_FED_OPS = ("titan_fp4six::dense_fwd", "titan_fp4six::dense_bwd", "titan_fp4six::grouped_fwd")
DECODE_SHARE = 2.0 / (2.0 + 0.5 + 1 / 16 + 2.0)  # of a bf16 quantize-with-decode's bytes: the bf16 decode written


def dgrad_quantize_share(profile: dict) -> float:
    """The share of the grouped backward's quantize time that feeds its FP4 dgrad (operand dy), from the profile's
    quantize launches by role; a third (dy of dy, dy^T, x^T) for a profile that predates the roles."""
    launches = [q for q in profile.get("quantize_launches", []) if q["op"] == "titan_fp4six::grouped_bwd"]
    total = sum(q["us"] for q in launches)
    if not total or any(q.get("role") is None for q in launches):
        return 1 / 3
    return sum(q["us"] for q in launches if q["role"] == "dy") / total


def project_step(kernel_ms_by_op: dict, dgrad_share: float = 1 / 3) -> dict:
    """A profiled H200 step's kernel time by op and kind -> the same step on a B200, in ms by kind (a projection
    at equal efficiency: each kernel's time scaled by the ratio of the resource that bounds it).

    Compute-bound kinds (GEMM, attention) scale by tensor throughput: bf16 by B200/H200 bf16, and the GEMMs that
    run in FP4 on Blackwell (the plugin's dense forward and backward, the grouped forward, and half the grouped
    backward's GEMM FLOPs, its dgrad; the grouped wgrad stays emulated in bf16, docs/ops.md) by FP4 over H200
    bf16. Every other kernel is memory-bound and scales by bandwidth; the quantize kernels of operands that feed
    an FP4 GEMM also drop the bf16 decode they write on Hopper (DECODE_SHARE of their bytes; the grouped
    backward's: its dy for the dgrad, dgrad_share of its quantize time, dgrad_quantize_share). Host time is not
    projected."""
    bf16, fp4 = H200["bf16"] / B200["bf16"], H200["bf16"] / B200["fp4"]
    memory = H200["bandwidth"] / B200["bandwidth"]
    out: dict[str, float] = {}
    for op, kinds in kernel_ms_by_op.items():
        for kind, ms in kinds.items():
            if kind in COMPUTE_KINDS:
                if op in FP4_FED_OPS:
                    scaled = ms * fp4
                elif op == "titan_fp4six::grouped_bwd":
                    scaled = ms / 2 * fp4 + ms / 2 * bf16
                else:
                    scaled = ms * bf16
                key = "plugin GEMMs (FP4, the grouped wgrad bf16)" if op.startswith("titan_fp4six::") else kind
            else:
                scaled = ms * memory
                if kind == "quantize" and (op in FP4_FED_OPS or op == "titan_fp4six::grouped_bwd"):
                    dropped = DECODE_SHARE if op in FP4_FED_OPS else DECODE_SHARE * dgrad_share
                    scaled *= 1 - dropped
                key = kind
            out[key] = out.get(key, 0.0) + scaled
    return out


def projection_table(twin: dict, recipe: dict) -> str:
    """Markdown: kernel ms by kind of two profiled steps (the bf16 twin's, the 4/6 recipe's), H200 measured and
    B200 projected by project_step, and the 4/6 / bf16 speed ratio of both."""
    rows = {}
    for label, prof in (("bf16", twin), ("4/6", recipe)):
        measured: dict[str, float] = {}
        for kinds in prof["kernel_ms_by_op"].values():
            for kind, ms in kinds.items():
                measured[kind] = measured.get(kind, 0.0) + ms
        rows[label] = (measured, project_step(prof["kernel_ms_by_op"], dgrad_quantize_share(prof)))
    kinds = sorted({k for m, p in rows.values() for k in (*m, *p)}, key=lambda k: -rows["4/6"][1].get(k, 0.0))
    lines = ["| kernel kind | bf16 H200 ms | bf16 B200 ms (projected) | 4/6 H200 ms | 4/6 B200 ms (projected) |",
             "| --- | --- | --- | --- | --- |"]
    for k in kinds:
        cells = [f"{rows[label][i].get(k, 0.0):.1f}" for label in ("bf16", "4/6") for i in (0, 1)]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    totals = [sum(rows[label][i].values()) for label in ("bf16", "4/6") for i in (0, 1)]
    lines.append("| **kernel time** | " + " | ".join(f"**{t:.1f}**" for t in totals) + " |")
    lines.append(f"\n4/6 / bf16 speed (kernel time): H200 {totals[0] / totals[2]:.2f}x measured, B200 "
                 f"{totals[1] / totals[3]:.2f}x projected")
    return "\n".join(lines)


def cmd_project(args, common):
    """Projects two profiles of `profile` (the bf16 twin's, then the 4/6 recipe's .profile.json) onto a B200 by
    project_step and prints a table of kernel ms by kind: H200 measured, B200 projected, for both (--docs: into
    docs/results/speed.md's section)."""
    twin, recipe = (json.loads(Path(p).read_text()) for p in (args.twin, args.recipe))
    md = projection_table(twin, recipe)
    print(md)
    if args.docs:
        results_page.write_section(SPEED, "b200-projection", md)


# --- perf and table: docs/results/speed.md's table in one sitting on one GPU ----------------------------------

PERF_PARTS = ("kernels", "ops", "debug", "30b", "profiles")


def _tee(cmd: list[str], path: Path) -> None:
    """Run `cmd` in the repository root, its output to the console and to `path` (a failed part is reported
    and the next one runs)."""
    print("$ " + shlex.join(cmd), flush=True)
    with open(path, "w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                cwd=ROOT) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
    if proc.returncode:
        print(f"exit {proc.returncode}: {shlex.join(cmd)}", flush=True)


def cmd_perf(args, common):
    """The parts named (default all), every ratio against a twin measured in the same invocation, then the
    table (OUT/table.md, OUT/table.png): kernels (the GEMM epilogue and row amax against a copy of their bytes),
    ops (1024^3 linear fwd+bwd per backward mode vs bf16, public quantize host time), debug (DeepSeek-V3 debug
    bf16 / 4/6 all Linears / 4/6 dequantized, then the Qwen3 MoE debug pair, eager, each list --repeat times
    over), 30b (the Qwen3-30B-A3B-shaped 4-layer flavor, experts 4/6 vs bf16, eager and with --compiled
    compiled), profiles (one profiled step of the DeepSeek-V3 all-Linears and Qwen3 4/6 recipes; with
    --profile-twins their bf16 twins too). About 18 minutes on an H200: where a call may run 10 minutes, run
    `kernels ops debug` then `30b profiles` with the same OUT. --docs: as `table --docs`, after the parts."""
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts or PERF_PARTS
    me = [sys.executable, "-m", "scripts.runs"]
    tp = [*me, "throughput", "--modes", "eager", "--steps", str(args.steps), "--warmup", "10", "--repeat",
          str(args.repeat)]
    if "kernels" in parts:
        _tee([sys.executable, "-m", "scripts.bench", "kernels", "--only", "epilogue", "--rounds", "2"],
             out / "kernels.md")
    if "ops" in parts:
        _tee([sys.executable, "-m", "scripts.bench", "ops", "--json", str(out / "ops.json")], out / "ops.txt")
    if "debug" in parts:  # DeepSeek takes 3/5 of the budget, Qwen3 the rest; one table (and twin) per model
        _tee([*tp, "--out", str(out / "debug"), "--budget", str(args.debug_budget * 3 // 5),
              "--run", f"DeepSeek bf16={DS}_bf16.toml",
              "--run", f"DeepSeek 4/6 all Linears={DS}_nvfp4_four_over_six_all_linears.toml",
              "--run", f"DeepSeek 4/6 dequantized={DS}_nvfp4_four_over_six_dequantized.toml", "--", *common],
             out / "debug.txt")
        _tee([*tp, "--out", str(out / "debug_qwen3"), "--budget", str(args.debug_budget * 2 // 5),
              "--run", f"Qwen3 MoE bf16={QW}_bf16.toml", "--run", f"Qwen3 MoE 4/6={QW}_nvfp4_four_over_six.toml",
              "--", *common], out / "debug_qwen3.txt")
    if "30b" in parts:
        _tee([*me, "throughput", "--out", str(out / "30b"), "--modes", "eager,compiled" if args.compiled else "eager",
              "--steps", "20", "--warmup", "8", "--budget", str(args.big_budget),
              "--run", f"bf16={QW}_bf16.toml", "--run", f"4/6 experts={QW}_nvfp4_four_over_six.toml", "--",
              "--model.flavor", "30B-A3B-4layers", "--experimental.custom_import", "titan_fp4six.integration.flavors",
              "--training.local_batch_size", "4", "--training.seq_len", "2048", *common], out / "30b.txt")
    if "profiles" in parts:
        twins = [f"{DS}_bf16.toml", f"{QW}_bf16.toml"] if args.profile_twins else []
        _tee([*me, "profile", str(out / "profiles"), f"{DS}_nvfp4_four_over_six_all_linears.toml",
              f"{QW}_nvfp4_four_over_six.toml", *twins, "--", *common], out / "profiles.txt")
    cmd_table(args, common)


# (workload, file under OUT, figure, target, at least (True) or at most (False))
TABLE_ROWS = (
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


def _tps_ratio(results: dict, run: str, twin: str) -> tuple[float, str] | None:
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
        results = data["results"]
        first = next(iter(results)).split(" | ")[0]
        for key, r in results.items():
            twin = results.get(f"{first} | {key.split(' | ')[1]}", {})
            if r.get("memory_gib") and twin.get("memory_gib") and not key.startswith(first):
                ratios.append(r["memory_gib"] / twin["memory_gib"])
    return (max(ratios), f"{max(ratios):.2f}") if ratios else None


def figure(out: Path, source: str, spec: tuple) -> tuple[float, str] | None:
    """(value, text) of one table row, None when its part did not run or its runs failed."""
    if spec[0] == "memory":
        return _memory(out)
    data = _load(out / source)
    if data is None:
        return None
    if spec[0] == "tps":
        return _tps_ratio(data["results"], *spec[1:])
    if spec[0] == "busy":
        return data["gpu_busy"], f"{data['gpu_busy']:.0%} ({data['kernels']:,} kernels, wall {data['wall_ms']:.1f} ms)"
    return _op_value(data, spec[1], "ratio" if spec[0] == "op" else "value")


def build_table(out: Path) -> tuple[str, list]:
    """Markdown of every row's figure, target and whether it is met; bars of figure / target for the plot."""
    lines = ["| workload | measured | target | met |", "| --- | --- | --- | --- |"]
    bars = []
    for workload, source, spec, target, at_least in TABLE_ROWS:
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


def plot_table(bars: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.2))
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color=["tab:green" if b[2] else "tab:red" for b in bars])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("figure / target (1 = target; right of it: met; time and memory rows inverted)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speed_sections(out: Path) -> dict[str, str]:
    """docs/results/speed.md's sections a `perf` output directory fills: the table (build_table), and with its
    profiles part a row per profiled step and the DeepSeek-V3 4/6 step's top kernels."""
    sections = {"targets": build_table(out)[0]}
    profiles = {p.name.removesuffix(".profile.json"): json.loads(p.read_text())
                for p in sorted((out / "profiles").glob("*.profile.json"))}
    if profiles:
        sections["debug-profiles"] = profile_summary_table(profiles)
    deepseek = profiles.get(Path(f"{DS}_nvfp4_four_over_six_all_linears.toml").stem)
    if deepseek:
        sections["debug-top-kernels"] = top_kernels_table(deepseek["top"])
    return sections


def cmd_table(args, common):
    """docs/results/speed.md's table from a `perf` output directory: each ratio against the bf16 twin measured in
    the same invocation; rows whose part was not run say so. --docs writes it, and the profiled steps of the
    profiles part, into their sections of speed.md (speed_sections)."""
    args.out.mkdir(parents=True, exist_ok=True)
    md, bars = build_table(args.out)
    print(md)
    (args.out / "table.md").write_text(md + "\n")
    if args.docs:
        for name, table in speed_sections(args.out).items():
            results_page.write_section(SPEED, name, table)
    try:
        plot_table(bars, args.out / "table.png")
    except ImportError:
        print("matplotlib missing: no PNG")


# --- parity: one recipe on 1 and on N processes, same global batch and initial weights -------------------------

PARITY_IMPORT = "scripts.parity_batches"  # run from the repository root (launch's cwd)


def launch(nproc: int, args: list[str], dump: Path, *, env: dict | None = None, timeout: float = 600) -> str:
    """Run `titan_fp4six.train` under torchrun with `nproc` local processes, in the repository root; return rank
    0's log (raises on failure)."""
    dump = dump.resolve()
    dump.mkdir(parents=True, exist_ok=True)
    cmd = training_command([*args, "--job.dump_folder", str(dump), "--metrics.disable_color_printing"], nproc)
    code, out = run_training(cmd, timeout=timeout, env=env, cwd=ROOT)
    (dump / "log.txt").write_text(out)
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited with {code}; log tail:\n{out[-4000:]}")
    return out


def losses(log: str) -> dict[int, float]:
    """step -> global average loss, from torchtitan's step lines."""
    return {row["step"]: row["loss"] for row in parse_steps(log)}


def seed_checkpoint(args: list[str], dump: Path, **kw) -> Path:
    """One process writes the initial weights (step 0) that both runs load (DTensor-sharded initialization does
    not reproduce single-device initialization)."""
    launch(1, [*args, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--checkpoint.folder", "seed",
               "--parallelism.data_parallel_shard_degree", "1", "--parallelism.expert_parallel_degree", "1"],
           dump, **kw)
    path = dump.resolve() / "seed" / "step-0"
    if not path.is_dir():
        raise RuntimeError(f"no seed checkpoint at {path}; see {dump / 'log.txt'}")
    return path


def from_seed(seed: Path) -> list[str]:
    """Arguments that start a run from `seed` and save only the final model (fp32), in `<dump>/final`."""
    return ["--checkpoint.enable", "--checkpoint.initial_load_path", str(seed), "--checkpoint.folder", "final",
            "--checkpoint.interval", str(10**9), "--checkpoint.last_save_model_only", "--checkpoint.export_dtype",
            "float32"]


def model_weights(checkpoint: Path) -> dict:
    """The model tensors of a torchtitan DCP checkpoint, loaded whole in this process."""
    import torch
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        state = _load_state_dict_from_keys(checkpoint_id=str(checkpoint))
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def weight_drift(a: dict, b: dict, init: dict) -> float:
    """||a - b|| / ||a - init|| over all model tensors: how far apart two runs ended, relative to how far they moved."""
    apart = sum((a[k].double() - b[k].double()).square().sum() for k in a)
    moved = sum((a[k].double() - init[k].double()).square().sum() for k in a)
    return float((apart / moved).sqrt())


@dataclass
class Comparison:
    losses_1: dict[int, float]
    losses_n: dict[int, float]
    drift: float
    """weight_drift of the final models (one process vs N)."""


def compare_processes(args: list[str], parallel_args: list[str], *, nproc: int, global_batch: int, steps: int,
                      out: Path, custom_import: str = PARITY_IMPORT, seed: Path | None = None, **kw) -> Comparison:
    """Train `steps` steps on 1 and on `nproc` processes from one seed checkpoint (made unless given) on the same
    global batches (`custom_import` must import PARITY_IMPORT: every rank trains on its rows of the one-process
    batch) with local_batch_size = global / nproc."""
    if global_batch % nproc:
        raise ValueError(f"--global-batch {global_batch} must be a multiple of --nproc {nproc}")
    common = [*args, "--training.steps", str(steps), "--metrics.log_freq", "1",
              "--experimental.custom_import", custom_import]
    if seed is None:
        seed = seed_checkpoint([*common, "--training.local_batch_size", str(global_batch)], out / "seed_run", **kw)
    one = launch(1, [*common, *from_seed(seed), "--training.local_batch_size", str(global_batch)], out / "nproc1", **kw)
    many = launch(nproc, [*common, *from_seed(seed), "--training.local_batch_size", str(global_batch // nproc),
                          *parallel_args], out / f"nproc{nproc}", **kw)
    out = out.resolve()
    final = [model_weights(out / d / "final" / f"step-{steps}") for d in ("nproc1", f"nproc{nproc}")]
    return Comparison(losses(one), losses(many), weight_drift(*final, model_weights(seed)))


def parity_rows(losses_1: dict[int, float], losses_n: dict[int, float], nproc: int) -> list[dict]:
    """Per step: both losses, their absolute and relative difference (NaN where the N-process run has no step)."""
    rows = []
    for step in sorted(losses_1):
        a, b = losses_1[step], losses_n.get(step, float("nan"))
        rows.append({"step": step, "loss_1": a, f"loss_{nproc}": b, "abs_diff": abs(a - b),
                     "rel_diff": abs(a - b) / abs(a)})
    return rows


def _default_label(common: list[str], parallel: list[str], nproc: int) -> str:
    config = next((b for a, b in zip(common, common[1:]) if a == "--job.config_file"), "the recipe")
    return f"{Path(config).stem}, {nproc} processes: {' '.join(parallel)}"


def cmd_parity(args, common):
    """Prints one line per step and how far apart the final weights ended relative to how far they moved
    (||W_1 - W_N|| / ||W_1 - W_init||); writes OUT/losses.json (with --label, the run's name in `parity-table`).
    --parallel-args are added to the N-process run only (default `--parallelism.data_parallel_shard_degree N`).
    tests/test_distributed_parity.py drives the same functions on the CPU."""
    parallel = (args.parallel_args.split() if args.parallel_args is not None
                else ["--parallelism.data_parallel_shard_degree", str(args.nproc)])
    result = compare_processes(common, parallel, nproc=args.nproc, global_batch=args.global_batch, steps=args.steps,
                               out=args.out)
    rows = parity_rows(result.losses_1, result.losses_n, args.nproc)
    for r in rows:
        a, b = r["loss_1"], r[f"loss_{args.nproc}"]
        print(f"step {r['step']:3d}  1 proc {a:.5f}  {args.nproc} procs {b:.5f}  |diff| {r['abs_diff']:.5f}  "
              f"rel {r['rel_diff']:.2e}")
    worst = max(rows, key=lambda r: r["rel_diff"])
    print(f"max rel diff {worst['rel_diff']:.2e} at step {worst['step']}; final weights: "
          f"||W_1 - W_{args.nproc}|| / ||W_1 - W_init|| = {result.drift:.2e}")
    label = args.label or _default_label(common, parallel, args.nproc)
    (args.out / "losses.json").write_text(json.dumps({"label": label, "nproc": args.nproc, "steps": rows,
                                                      "weight_drift": result.drift}, indent=1))


# parity.md's sections written by `parity-table --docs NAME`
PARITY_SECTIONS = ("two-h200", "cpu-gloo")


def parity_table(results: list[dict], first: int = 10) -> str:
    """Markdown: one row per `parity` run (its losses.json: label, steps, weight_drift): the largest relative loss
    difference |L_1 - L_N| / L_1 over the first `first` steps and over all, and the final weights' drift."""
    first = min(first, max((len(r["steps"]) for r in results), default=first))
    lines = [f"| run | steps | max relative loss difference, steps 1-{first} | max over all steps (step) | "
             "final weights drift |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        steps = r["steps"]
        early = max((s["rel_diff"] for s in steps if s["step"] <= first), default=float("nan"))
        worst = max(steps, key=lambda s: s["rel_diff"])
        lines.append(f"| {r.get('label', '-')} | {len(steps)} | {early:.1e} | {worst['rel_diff']:.1e} "
                     f"({worst['step']}) | {r['weight_drift']:.2g} |")
    return "\n".join(lines)


def cmd_parity_table(args, common):
    """The table of one or more `parity` output directories (their losses.json), in the order given; --docs NAME
    writes it into that section of docs/results/parity.md."""
    results = results_page.read_records(args.outs, "losses.json", "python -m scripts.runs parity --out DIR ...")
    md = parity_table(results)
    print(md)
    if args.docs:
        results_page.write_section(PARITY_PAGE, args.docs, md)


# --- compile-parity: eager vs torch.compile training, against the same for bf16 and an eager repeat ------------

def cmd_compile_parity(args, common):
    """The DeepSeek-V3 debugmodel, 4/6 all Linears (eager, an eager repeat, compiled) and bf16 (eager, compiled),
    side by side on one GPU: does the converted model compile and train, and how far do compiled losses move from
    eager ones, against bf16 (where only Inductor's fusions of the unquantized ops move them) and against a repeat
    of the eager run (GPU atomics in the MoE scatter/gather backward)? Prints compile_parity_table; --docs writes
    it into docs/results/compile.md's section."""
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--training.steps", str(args.steps), "--metrics.log_freq", "1", "--training.seq_len", "512",
              "--training.local_batch_size", "4", "--lr_scheduler.warmup_steps", "2", "--debug.seed", "0",
              "--metrics.disable_color_printing", *common]
    four_six, bf16 = f"{DS}_nvfp4_four_over_six_all_linears.toml", f"{DS}_bf16.toml"
    runs = [Run("nvfp4_eager", four_six, ["--compile.no-enable"]),
            Run("nvfp4_eager_repeat", four_six, ["--compile.no-enable"]),
            Run("nvfp4_compile", four_six, ["--compile.enable"]),
            Run("bf16_eager", bf16, ["--compile.no-enable"]), Run("bf16_compile", bf16, ["--compile.enable"])]
    procs = {run.label: start(run, common, args.out / f"{run.label}.log") for run in runs}
    loss = {}
    for label, proc in procs.items():
        print(f"{label} exit {wait(proc, None)}")
        loss[label] = [r["loss"] for r in parse_steps((args.out / f"{label}.log").read_text())]
    for a, b in (("nvfp4_eager", "nvfp4_eager_repeat"), ("nvfp4_eager", "nvfp4_compile"),
                 ("bf16_eager", "bf16_compile")):
        d = [abs(x - y) for x, y in zip(loss[a], loss[b])]
        print(f"{a} vs {b}: steps {len(d)}, identical {sum(x == 0 for x in d)}, "
              f"max |dloss| {max(d) if d else float('nan'):.6f}")
    md = compile_parity_table(loss)
    print(md)
    if args.docs:
        results_page.write_section(COMPILE, "compile-vs-eager", md)


def compile_parity_table(loss: dict[str, list[float]]) -> str:
    """Markdown: per step (steps 1, 2, ...: every step is logged), the 4/6 model's eager and compiled losses and
    their absolute difference, the eager repeat's difference to the eager run, the same for the bf16 twin, then
    the largest differences over all steps (a run that failed or stopped early counts to its last step)."""
    def diffs(a, b):
        return [abs(x - y) for x, y in zip(loss.get(a, []), loss.get(b, []))]

    def num(values, i, fmt):
        return format(values[i], fmt) if i < len(values) else ""

    def diff(d):
        return "0" if d == 0 else f"{d:.1e}"

    pairs = {"4/6": diffs("nvfp4_eager", "nvfp4_compile"), "repeat": diffs("nvfp4_eager", "nvfp4_eager_repeat"),
             "bf16": diffs("bf16_eager", "bf16_compile")}
    lines = ["| step | 4/6 eager | 4/6 compiled | abs diff | 4/6 eager repeat: abs diff to eager | bf16 eager | "
             "bf16 compiled | abs diff |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i in range(max(map(len, loss.values()), default=0)):
        cells = [num(loss.get("nvfp4_eager", []), i, ".5f"), num(loss.get("nvfp4_compile", []), i, ".5f"),
                 *(diff(pairs[k][i]) if i < len(pairs[k]) else "" for k in ("4/6", "repeat")),
                 num(loss.get("bf16_eager", []), i, ".5f"), num(loss.get("bf16_compile", []), i, ".5f"),
                 diff(pairs["bf16"][i]) if i < len(pairs["bf16"]) else ""]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    worst = {k: diff(max(d)) if d else "" for k, d in pairs.items()}
    lines.append(f"| **largest** | | | {worst['4/6']} | {worst['repeat']} | | | {worst['bf16']} |")
    return "\n".join(lines)


# --- rl-signal: is the copy task learnable from its reward? --------------------------------------------------

RL_SIGNAL_OPTIONS = {"mode": None, "alphabet": "0123", "lr": 1e-3, "steps": 100, "prompts": 32, "group_size": 8,
                     "entropy_coef": 0.0}  # one run's options and their defaults; --docs takes the rows' own


RL_SIGNAL_ROWS = (  # rl.md's table, `rl-signal --docs`: (mode, alphabet, entropy bonus, steps), 64 prompts x 8
    ("supervised", "0123", 0.0, 50),
    ("grpo", "0123", 0.0, 150),
    ("grpo", "0123", 0.01, 150),
    ("grpo", "0123456789", 0.01, 200),
)
RL_SIGNAL_AT = (10, 25, 50, 100, 150, 200)  # the steps whose accuracy the table shows


def rl_signal(mode: str, *, flavor: str, alphabet: str, lr: float, steps: int, prompts: int, group_size: int,
              entropy_coef: float) -> list[tuple[int, float, float]]:
    """Supervised vs policy-gradient updates of a fresh model on the one-symbol copy task (`<bos> s =` -> `s`),
    on the CPU: the model's own forward (titan_fp4six.rl.forward, fast kernels) on the prompt only, no generator
    or trainer, so what it isolates is the learning signal. Returns and prints (step, mean reward, greedy copy
    accuracy) every 5 steps (chance: 1 / len(alphabet)). Modes: supervised (cross-entropy on the right symbol),
    grpo (sampled answers, group-relative advantages), baseline (sampled answers, batch-mean baseline)."""
    import copy
    import random

    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_fp4six.integration import flavors  # noqa: F401  (registers the "tiny" flavor)
    from titan_fp4six.integration.cpu import apply as cpu_patches
    from titan_fp4six.rl import grpo
    from titan_fp4six.rl.forward import forward, kernels
    from titan_fp4six.rl.task import CopyTask, Vocabulary

    cpu_patches()
    torch.manual_seed(0)
    spec = get_train_spec("qwen3")
    model_args = copy.deepcopy(spec.model_args[flavor])
    model_args.moe_args.use_grouped_mm = False  # CPU
    model = spec.model_cls(model_args)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    task = CopyTask(Vocabulary.from_tokenizer("titan_fp4six/integration/embedded", alphabet), 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng, ops = random.Random(0), kernels(False)
    trace = []
    for step in range(steps):
        examples = [e for e in task.examples(prompts, rng) for _ in range(group_size)]
        tokens = torch.tensor([e.tokens for e in examples])
        logprobs = forward(model, tokens, torch.arange(tokens.shape[1]).expand(len(examples), -1), ops)[:, -1]
        if mode == "supervised":
            answers, weights = tokens[:, 1], torch.ones(len(examples))
        else:
            answers = torch.multinomial(logprobs.detach().exp(), 1).squeeze(-1)
        rewards = torch.tensor([task.reward(e, [int(a)]) for e, a in zip(examples, answers)])
        if mode == "grpo":
            weights = grpo.group_advantages(rewards, group_size)
        elif mode == "baseline":
            weights = rewards - rewards.mean()
        loss = -(weights * logprobs.gather(-1, answers[:, None]).squeeze(-1)).mean()
        loss = loss - entropy_coef * grpo.entropy(logprobs).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 5 == 0 or step == steps - 1:
            accuracy = float((logprobs.argmax(-1) == tokens[:, 1]).float().mean())
            trace.append((step, float(rewards.mean()), accuracy))
            print(f"step {step:4d}  reward {trace[-1][1]:.3f}  greedy copy accuracy {accuracy:.3f}", flush=True)
    return trace


def rl_signal_table(rows: list[tuple[str, str, float, int, list[tuple[int, float, float]]]]) -> str:
    """rl.md's table: per (mode, alphabet, entropy bonus, steps, trace) the greedy copy accuracy at RL_SIGNAL_AT
    (the print at or just before each step) and its mean over the last quarter of the steps."""
    def at(trace, step):
        return max((t for t in trace if t[0] <= step), key=lambda t: t[0])[2]

    head = ["mode", "alphabet (chance)", "entropy bonus", *(f"step {s}" for s in RL_SIGNAL_AT), "last quarter"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- | ---: |" + " ---: |" * (len(RL_SIGNAL_AT) + 1)]
    for mode, alphabet, entropy, steps, trace in rows:
        late = [t[2] for t in trace if t[0] >= steps * 3 // 4]
        cells = [f"{at(trace, s):.2f}" if s <= steps else "" for s in RL_SIGNAL_AT]
        lines.append(f"| {mode} | `{alphabet}` (1/{len(alphabet)}) | {entropy:g} | " + " | ".join(cells)
                     + f" | {sum(late) / len(late):.2f} |")
    return "\n".join(lines)


def cmd_rl_signal(args, common):
    """Is the copy task learnable from its reward (CPU)? One run with --mode, or with --docs every row of
    docs/results/rl.md's table (RL_SIGNAL_ROWS: 64 prompts x 8 answers a step, lr 1e-3), written to its section."""
    if args.docs:
        given = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                 if k in RL_SIGNAL_OPTIONS and v != RL_SIGNAL_OPTIONS[k]]
        if given:
            raise SystemExit(f"rl-signal --docs runs the table's own rows (RL_SIGNAL_ROWS); drop {', '.join(given)}")
    else:
        if args.mode is None:
            raise SystemExit("rl-signal: give --mode (one run) or --docs (the rows of docs/results/rl.md's table)")
        rl_signal(args.mode, flavor=args.flavor, alphabet=args.alphabet, lr=args.lr, steps=args.steps,
                  prompts=args.prompts, group_size=args.group_size, entropy_coef=args.entropy_coef)
        return
    rows = []
    for mode, alphabet, entropy, steps in RL_SIGNAL_ROWS:
        print(f"# {mode}, alphabet {alphabet}, entropy bonus {entropy:g}, {steps} steps", flush=True)
        trace = rl_signal(mode, flavor=args.flavor, alphabet=alphabet, lr=RL_SIGNAL_OPTIONS["lr"], steps=steps,
                          prompts=64, group_size=RL_SIGNAL_OPTIONS["group_size"], entropy_coef=entropy)
        rows.append((mode, alphabet, entropy, steps, trace))
    text = rl_signal_table(rows)
    print(text)
    results_page.write_section("rl.md", "rl-signal", text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.runs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, fn, what):
        s = sub.add_parser(name, help=what, description=fn.__doc__)
        s.set_defaults(handler=fn)
        return s

    s = add("project", cmd_project, "two profiles (bf16 twin, 4/6 recipe) projected onto a B200")
    s.add_argument("twin", type=Path, help="the bf16 twin's .profile.json")
    s.add_argument("recipe", type=Path, help="the 4/6 recipe's .profile.json")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s = add("compare-profiles", cmd_compare_profiles, "two profiles (bf16 twin, recipe): kernel time by kind and op")
    s.add_argument("twin", type=Path, help="the bf16 twin's .profile.json")
    s.add_argument("recipe", type=Path, help="the recipe's .profile.json")
    s.add_argument("--labels", nargs=2, metavar=("TWIN", "RECIPE"), help="column names (default: the file names)")
    s.add_argument("--docs", choices=sorted(PROFILE_SECTIONS), default=None,
                   help=f"{results_page.DOCS_HELP} (speed.md's sections: "
                   + "; ".join(f"{k}: {', '.join(v)}" for k, v in PROFILE_SECTIONS.items()) + ")")
    s = add("throughput", cmd_throughput, "tokens/s and peak memory of recipes against the first, eager and compiled")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--run", action="append", default=[], type=Run.parse, help="'LABEL=CONFIG [overrides]'")
    s.add_argument("--modes", default="eager,compiled", help="comma list of: " + ", ".join(MODES))
    s.add_argument("--steps", type=int, default=25)
    s.add_argument("--warmup", type=int, default=10)
    s.add_argument("--repeat", type=int, default=1, help="train the list of runs this many times, in turn")
    s.add_argument("--timeout", type=float, default=None, help="seconds per training before it is stopped")
    s.add_argument("--budget", type=float, default=None,
                   help="seconds for all trainings together; a run that would start with under 15 s left is skipped")
    s.add_argument("--docs", choices=THROUGHPUT_SECTIONS, default=None, metavar="SECTION",
                   help=f"{results_page.DOCS_HELP} (speed.md's section: {', '.join(THROUGHPUT_SECTIONS)})")
    s = add("profile", cmd_profile, "one profiled training step per recipe: where its time goes")
    s.add_argument("out", type=Path)
    s.add_argument("configs", nargs="+")
    s.add_argument("--timeout", type=float, default=240, help="seconds per recipe")
    s = add("perf", cmd_perf, "docs/results/speed.md's table in one sitting on one GPU")
    s.add_argument("out", type=Path)
    s.add_argument("parts", nargs="*", metavar="PART", help=f"parts to run, from {', '.join(PERF_PARTS)} (default all)")
    s.add_argument("--steps", type=int, default=30, help="steps of each debug-recipe training")
    s.add_argument("--repeat", type=int, default=2, help="times the debug lists are trained over")
    s.add_argument("--debug-budget", type=int, default=440, help="seconds for all debug-recipe trainings")
    s.add_argument("--big-budget", type=int, default=420, help="seconds for the 30B-shaped trainings")
    s.add_argument("--compiled", action="store_true", help="also the compiled 30B pair")
    s.add_argument("--profile-twins", action="store_true", help="also profile the bf16 twins")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s = add("table", cmd_table, "the performance table from what a `perf` output directory holds")
    s.add_argument("out", type=Path, help="the output directory of `perf`")
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s = add("parity", cmd_parity, "a recipe on 1 and on N processes, same global batches and initial weights")
    s.add_argument("--nproc", type=int, default=2)
    s.add_argument("--global-batch", type=int, required=True)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--parallel-args", default=None, help="extra arguments of the N-process run (one string)")
    s.add_argument("--label", default=None, help="the run's name in `parity-table` (default: recipe and parallelism)")
    s = add("parity-table", cmd_parity_table, "the table of one or more `parity` output directories")
    s.add_argument("outs", type=Path, nargs="+", metavar="OUT", help="output directories of `parity`")
    s.add_argument("--docs", choices=PARITY_SECTIONS, default=None, metavar="SECTION",
                   help=f"{results_page.DOCS_HELP} (parity.md's section: {', '.join(PARITY_SECTIONS)})")
    s = add("compile-parity", cmd_compile_parity, "eager vs compiled losses, 4/6 against bf16")
    s.add_argument("out", type=Path)
    s.add_argument("--steps", type=int, default=6)
    s.add_argument("--docs", action="store_true", help=results_page.DOCS_HELP)
    s = add("rl-signal", cmd_rl_signal, "is the copy task learnable from its reward (CPU)")
    s.add_argument("--mode", choices=("supervised", "grpo", "baseline"))
    s.add_argument("--flavor", default="tiny", help="tiny: the package's 2-layer flavor; debugmodel_moe: the recipe's")
    for option, default in RL_SIGNAL_OPTIONS.items():
        if option != "mode":
            s.add_argument(f"--{option.replace('_', '-')}", type=type(default), default=default)
    s.add_argument("--docs", action="store_true", help=f"{results_page.DOCS_HELP} (every row of rl.md's table)")
    return p


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, common = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = parser()
    args = p.parse_args(own)
    if args.command == "perf" and set(args.parts) - set(PERF_PARTS):
        p.error(f"perf parts must be from {', '.join(PERF_PARTS)}; got {' '.join(args.parts)}")
    args.handler(args, common)


if __name__ == "__main__":
    main()
