"""Where one training step's time goes, from a torch.profiler chrome trace (torchtitan's
`--profiling.enable_profiling` writes them under <dump_folder>/profile_traces/iteration_N/rank0_trace.json).

    python scripts/profile_summary.py TRACE.json [--top 12] [--label NAME] [--json OUT.json]

Prints, for the last profiled step (ProfilerStep#N): its wall time, GPU busy fraction (union of kernel
intervals inside the step / wall), kernel count, total kernel time, the top kernels by total time, and the host
time per call of the plugin's ops (titan_fp4six::*: custom ops when compiled, record_function ranges in eager).
"""

import argparse
import gzip
import json
import re
from collections import defaultdict


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize(events: list[dict], top: int = 12) -> dict:
    steps = [e for e in events if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))]
    if not steps:
        raise ValueError("no ProfilerStep#N span in the trace")
    step = max(steps, key=lambda e: e["ts"])
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and t0 <= e["ts"] < t1]
    busy, end = 0.0, t0
    for k in sorted(kernels, key=lambda e: e["ts"]):  # union of intervals
        start, stop = max(k["ts"], end), k["ts"] + k["dur"]
        if stop > start:
            busy += stop - start
            end = stop
    by_name = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        by_name[k["name"]][0] += 1
        by_name[k["name"]][1] += k["dur"]
    ops = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") \
                and e.get("name", "").startswith("titan_fp4six::") \
                and t0 <= e["ts"] < t1:
            ops[e["name"]].append(e["dur"])
    return {
        "step": step["name"], "wall_ms": step["dur"] / 1e3, "gpu_busy": busy / step["dur"], "kernels": len(kernels),
        "kernel_ms": sum(k["dur"] for k in kernels) / 1e3,
        "top": [{"name": n[:90], "count": c, "ms": d / 1e3}
                for n, (c, d) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]],
        "host_ops": {n: {"calls": len(d), "mean_ms": sum(d) / len(d) / 1e3} for n, d in sorted(ops.items())},
    }


def markdown(s: dict, label: str) -> str:
    lines = [f"**{label}** ({s['step']}): wall {s['wall_ms']:.1f} ms, GPU busy {s['gpu_busy']:.0%}, "
             f"{s['kernels']} kernels, kernel time {s['kernel_ms']:.1f} ms", "",
             "| kernel | count | ms |", "| --- | --- | --- |"]
    lines += [f"| `{t['name']}` | {t['count']} | {t['ms']:.2f} |" for t in s["top"]]
    if s["host_ops"]:
        lines += ["", "| op (host) | calls | mean ms |", "| --- | --- | --- |"]
        lines += [f"| `{n}` | {v['calls']} | {v['mean_ms']:.3f} |" for n, v in s["host_ops"].items()]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--label", default="step")
    p.add_argument("--json")
    args = p.parse_args()
    s = summarize(load(args.trace), args.top)
    print(markdown(s, args.label))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()
