"""How far quantized rollouts sit from the bf16 policy: per-token KL(bf16 || quantized) and |logp difference| of
bf16-trained checkpoints served with plain NVFP4 (scope none, B=448) and with 4/6, per activation scaling, on
held-out text and on responses sampled from the bf16 policy (docs/fidelity.md, "Rollouts against the bf16 policy").

    .venv-vllm/bin/python -m scripts.rollout_distance --checkpoint [REGIME=]CHECKPOINT ... --out DIR \
        [--window 128] [--prompt 32] [--response 64] [--seed 0] [--max-windows N] [--vllm first|all|none] \
        [--docs [PATH]]

--checkpoint is a torchtitan DCP step folder or a glob of them, repeatable; REGIME= names the group it belongs to
(default: the `regime` of the run.json that scripts/rollout_study.py writes beside the run's checkpoint folder,
else "all"). The quantized models are the all-Linears recipe (attention projections and routed experts; router and
LM head bf16) with its knobs per variant; every model holds the checkpoint's weights rounded to bf16 (what a server
holds) and computes in FP32, one sequence per forward (per-tensor amaxes cover that sequence). Units: 128-token
windows of the embedded held-out split; each window's mean over its tokens is one sample, the variants paired by
window. Per regime the page gives intervals OVER TRAINING RUNS (each checkpoint one unit: its windows averaged, a
95% Student-t interval across checkpoints, the 4/6 / NVFP4 ratio of the run means with Fieller's interval, the
fraction of NVFP4's distance that 4/6 removes as 1 - that ratio) and, labelled, the per-window intervals of each
checkpoint and of all its windows pooled (these ignore how much another training run moves the numbers).
Each checkpoint also gets the bf16 model's held-out loss (the held-out split cut into training-length sequences
as the trainer cuts its data), beside the final training loss that run.json records.
With vLLM (run it in .venv-vllm; --vllm picks the checkpoints: the first of each regime by default), the
checkpoint's variants are also exported (`--format nvfp4`, and the bf16 reference with `--format bf16`) and scored
by vLLM with the four_over_six plugin, one engine per subprocess: the actual tokens' logprobs are compared with the
package's forward, and the held-out |logp difference| is recomputed from vLLM's.
Each checkpoint's scores are kept in DIR/scores/<label>.json and reused by a later call with the same settings
(--score-only scores and stops: scripts/rollout_study.py scores checkpoints in parallel that way). Writes
DIR/rollout_distance.md and .json; --docs also writes the page to PATH (default docs/results/rollout_distance.md),
marked as this script's (scripts/results_page.py: a re-run replaces it, no hand edits), and, where a fidelity.md
lies beside it (docs/results/fidelity.md), the study's summary into its section "rollout-distance".
"""

import argparse
import datetime
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from scripts.provenance import commit, machine
from scripts.results_page import write_page, write_section

REPO = Path(__file__).resolve().parents[1]
QUANTIZED = "configs/qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml"
BF16 = "configs/qwen3_moe_debug_bf16.toml"
SECTIONS = ("quantize.linear.four_over_six", "quantize.grouped_mm.four_over_six")
VARIANTS = {  # name: (scope, scale_bound, activation_scaling)
    "NVFP4, tensor": ("none", 448, "tensor"), "4/6, tensor": ("all", 256, "tensor"),
    "NVFP4, row": ("none", 448, "row"), "4/6, row": ("all", 256, "row")}
DATA = ("held-out text", "sampled responses")
METRICS = {"kl": "KL(bf16 || quantized), nats/token", "dlogp": "mean |logp difference|"}
SCALINGS = ("tensor", "row")
DOCS_PAGE = "docs/results/rollout_distance.md"
SCORE_FORMAT = 2  # bump when a score file's content changes meaning


def job(recipe: str, *extra: str):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", str(REPO / recipe), "--model.flavor", "small",
                                       "--training.seq_len", "512", *extra])


def variant_job(name: str):
    scope, bound, scaling = VARIANTS[name]
    knobs = [a for s in SECTIONS for a in (f"--{s}.scope", scope, f"--{s}.scale_bound", str(bound),
                                           f"--{s}.activation_scaling", scaling, f"--{s}.cache_weights")]
    return job(QUANTIZED, *knobs)


def build(job_config, checkpoint: Path) -> torch.nn.Module:
    """The recipe's model (converted when the recipe converts) holding the checkpoint rounded to bf16, in FP32."""
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_fp4six.integration.export import converted_model, load_checkpoint

    spec = get_train_spec(job_config.model.name)
    args = spec.model_args[job_config.model.flavor]
    args.update_from_config(job_config)
    state = {k: v.to(torch.bfloat16).float() for k, v in load_checkpoint(job_config, spec, args, checkpoint).items()}
    return converted_model(job_config, spec, args, state).eval()


def _held_out_texts() -> tuple[object, list[str]]:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from titan_fp4six.integration.data import EMBEDDED_DIR, load_documents

    return HuggingFaceTokenizer(str(EMBEDDED_DIR)), list(load_documents(EMBEDDED_DIR, "validation")["text"])


def windows(length: int) -> list[list[int]]:
    """The non-overlapping `length`-token windows of each held-out document (BOS first)."""
    tok, texts = _held_out_texts()
    out = []
    for text in texts:
        ids = tok.encode(text, add_bos=True, add_eos=False)
        out += [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]
    return out


def training_sequences(seq_len: int) -> list[list[int]]:
    """The held-out split cut as torchtitan's text dataset cuts training data: documents with BOS and EOS joined,
    consecutive sequences of seq_len + 1 tokens (inputs and shifted labels)."""
    tok, texts = _held_out_texts()
    ids = [t for text in texts for t in tok.encode(text, add_bos=True, add_eos=True)]
    return [ids[i:i + seq_len + 1] for i in range(0, len(ids) - seq_len, seq_len + 1)]


@torch.no_grad()
def held_out_loss(model, seq_len: int) -> float:
    """Mean next-token cross entropy over the held-out split cut into training-length sequences."""
    losses = []
    for seq in training_sequences(seq_len):
        logits = model(torch.tensor([seq[:-1]])).double()[0]
        losses.append(torch.nn.functional.cross_entropy(logits, torch.tensor(seq[1:]), reduction="sum"))
    return float(sum(losses) / (len(losses) * seq_len))


@torch.no_grad()
def sample(model, prompts: list[list[int]], steps: int, seed: int) -> list[list[int]]:
    """Responses of `steps` tokens sampled at temperature 1 from `model` (the bf16 policy), all prompts one batch."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.tensor(prompts)
    for _ in range(steps):
        probs = torch.softmax(model(tokens)[:, -1].double(), -1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=g)], 1)
    return tokens.tolist()


@torch.no_grad()
def log_probs(model, seq: list[int]) -> torch.Tensor:
    """(T-1, V) float64 log-distributions of each next token, one sequence per forward."""
    return torch.log_softmax(model(torch.tensor([seq])).double()[0, :-1], -1)


def distances(ref: torch.Tensor, q: torch.Tensor, seq: list[int], first: int) -> dict:
    """Per-token KL(ref || q) and |logp_ref - logp_q| of the actual tokens, from position `first` on."""
    ref, q = ref[first:], q[first:]
    target = torch.tensor(seq[first + 1:])[:, None]
    kl = (ref.exp() * (ref - q)).sum(-1)
    dlogp = (ref.gather(-1, target) - q.gather(-1, target)).squeeze(-1)
    return {"kl": kl.tolist(), "dlogp": dlogp.abs().tolist(), "logp": q.gather(-1, target).squeeze(-1).tolist()}


def vllm_logprobs(folder: Path, seqs: list[list[int]], first: list[int], out: Path) -> list[list[float]]:
    """The actual tokens' logprobs from vLLM (an engine on `folder` in a subprocess: one engine per process)."""
    job_file = out.with_suffix(".in.json")
    job_file.write_text(json.dumps({"folder": str(folder), "seqs": seqs, "first": first}))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "scripts.rollout_distance", "--vllm-worker", str(job_file),
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"vLLM scoring of {folder} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def vllm_worker(job_file: Path, out: Path) -> None:
    import vllm

    spec = json.loads(job_file.read_text())
    llm = vllm.LLM(model=spec["folder"], dtype="float32", max_model_len=512, max_num_seqs=1, enforce_eager=True,
                   enable_prefix_caching=False, kv_cache_memory_bytes=1 << 27, seed=0)
    result = []
    for seq, first in zip(spec["seqs"], spec["first"]):  # one sequence per call: per-tensor amaxes cover it alone
        got = llm.generate([{"prompt_token_ids": seq}], vllm.SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)[0].prompt_logprobs
        result.append([got[i + 1][seq[i + 1]].logprob for i in range(first, len(seq) - 1)])
    out.write_text(json.dumps(result))
    llm.llm_engine.engine_core.shutdown()


# ---------------------------------------------------------------------------------------------------- statistics

def window_means(per_seq: dict[str, list[dict]], metric: str) -> dict[str, list[float]]:
    """Per variant, each window's mean over its tokens."""
    return {v: [sum(s[metric]) / len(s[metric]) for s in seqs] for v, seqs in per_seq.items()}


def _pair(a: list[float], b: list[float]) -> dict:
    """4/6 (a) against NVFP4 (b), paired: the mean difference (Student t), the ratio of means (Fieller) and the
    fraction of NVFP4's distance that 4/6 removes, 1 - ratio (its interval is the ratio's, mirrored)."""
    from titan_fp4six.compare.stats import fieller_ratio, mean_interval

    diff = mean_interval([x - y for x, y in zip(a, b)])
    ratio = vars(fieller_ratio(a, b)) if len(a) >= 2 else {"value": sum(a) / sum(b), "n": len(a), "low": None,
                                                           "high": None, "bounded": False}
    fraction = {"value": 1 - ratio["value"], "low": None if ratio["low"] is None else 1 - ratio["high"],
                "high": None if ratio["high"] is None else 1 - ratio["low"], "bounded": ratio["bounded"]}
    return {"difference": vars(diff), "ratio": ratio, "fraction_removed": fraction}


def summarize_means(means: dict[str, list[float]]) -> dict:
    """Per variant: mean over the units (windows or runs) with its 95% interval; per scaling, 4/6 against NVFP4
    paired by unit (_pair)."""
    from titan_fp4six.compare.stats import mean_interval

    table = {v: vars(mean_interval(m)) for v, m in means.items()}
    pairs = {s: _pair(means[f"4/6, {s}"], means[f"NVFP4, {s}"]) for s in SCALINGS}
    return {"variants": table, "pairs": pairs}


def summarize(per_seq: dict[str, list[dict]], metric: str) -> dict:
    """One checkpoint's per-window summary: windows are the units."""
    return summarize_means(window_means(per_seq, metric))


def over_runs(units: list[dict[str, list[float]]]) -> dict:
    """Intervals over training runs: `units` holds one dict per checkpoint (variant -> its per-window means); each
    checkpoint becomes one sample, the mean of its windows, and the interval is taken across checkpoints."""
    return summarize_means({v: [sum(u[v]) / len(u[v]) for u in units] for v in units[0]})


def pooled(units: list[dict[str, list[float]]]) -> dict:
    """Every window of every checkpoint as one sample (paired by checkpoint and window): narrower than over_runs
    because it ignores the run-to-run variation."""
    return summarize_means({v: [x for u in units for x in u[v]] for v in units[0]})


def _covers_zero(e: dict) -> bool:
    return e["low"] is None or e["low"] <= 0 <= e["high"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def row_verdict(pair: dict) -> str:
    """One row's verdict in words, from the paired difference and the fraction removed."""
    d, f = pair["difference"], pair["fraction_removed"]
    if d["low"] is None:
        return "one unit: no interval"
    if _covers_zero(d):
        ratio = pair["ratio"]
        covers = (f"ratio [{ratio['low']:.3f}, {ratio['high']:.3f}] covers 1" if ratio["bounded"]
                  else "ratio unbounded")
        return f"not distinguishable (difference [{d['low']:+.3g}, {d['high']:+.3g}] covers 0; {covers})"
    if d["high"] < 0:
        frac = f"[{_pct(f['low'])}, {_pct(f['high'])}]" if f["bounded"] else "(interval unbounded)"
        return f"4/6 closer: removes {_pct(f['value'])} {frac} of NVFP4's distance"
    frac = f"[{_pct(-f['high'])}, {_pct(-f['low'])}]" if f["bounded"] else "(interval unbounded)"
    return f"4/6 farther: its distance is {_pct(-f['value'])} {frac} above NVFP4's"


# ---------------------------------------------------------------------------------------------------- checkpoints

@dataclass
class Checkpoint:
    path: Path
    regime: str
    label: str
    run: dict | None  # the run.json of scripts/rollout_study.py beside the checkpoint folder, if any


def read_run(path: Path) -> dict | None:
    """The run.json two folders up (DUMP/checkpoint/step-N -> DUMP/run.json), written by scripts/rollout_study.py."""
    f = path.parent.parent / "run.json"
    return json.loads(f.read_text()) if f.is_file() else None


def resolve_checkpoints(specs: list[str]) -> list[Checkpoint]:
    """`[REGIME=]PATH` specs, PATH a step folder or a glob of them, in order; duplicates dropped."""
    out, seen = [], set()
    for spec in specs:
        regime, _, pattern = spec.rpartition("=") if "=" in spec else ("", "", spec)
        paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not paths:
            raise ValueError(f"--checkpoint {spec}: the glob matches nothing")
        for p in map(Path, paths):
            if p.resolve() in seen:
                continue
            seen.add(p.resolve())
            run = read_run(p)
            reg = regime or (run or {}).get("regime") or "all"
            label = (f"{run['regime']}-seed{run['seed']}" if run and not regime else
                     re.sub(r"[^\w.-]+", "_", "-".join(p.resolve().parts[-3:])))
            out.append(Checkpoint(p, reg, label, run))
    labels = [c.label for c in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"two checkpoints share the label(s) {dup}: give them REGIME= prefixes or distinct folders")
    return out


def pick_vllm(checkpoints: list[Checkpoint], which: str) -> set[str]:
    """Labels of the checkpoints that go through vLLM: none, all, or the first of each regime."""
    if which == "none":
        return set()
    if which == "all":
        return {c.label for c in checkpoints}
    firsts: dict[str, str] = {}
    for c in checkpoints:
        firsts.setdefault(c.regime, c.label)
    return set(firsts.values())


# ---------------------------------------------------------------------------------------------------- scoring

def settings(a, checkpoint: Checkpoint, seq_len: int, out: Path) -> dict:
    """What a score file depends on; the checkpoint named relative to OUT when it lies there (OUT can move)."""
    path = checkpoint.path.resolve()
    where = str(path.relative_to(out.resolve())) if path.is_relative_to(out.resolve()) else str(path)
    return {"format": SCORE_FORMAT, "checkpoint": where, "window": a.window,
            "prompt": a.prompt, "response": a.response, "seed": a.seed, "max_windows": a.max_windows,
            "seq_len": seq_len}


def cached(file: Path, want: dict, need_vllm: bool) -> dict | None:
    """A score file made with the same settings (and through vLLM when that is needed now), else None."""
    if not file.is_file():
        return None
    try:
        s = json.loads(file.read_text())
    except ValueError:
        return None
    if s.get("settings") != want or (need_vllm and "vllm" not in s):
        return None
    return s


def score(a, checkpoint: Checkpoint, with_vllm: bool, folder: Path) -> dict:
    """Every variant's per-window distances of one checkpoint (and vLLM's when asked), the bf16 held-out loss."""
    import titan_fp4six.integration.cpu as cpu

    cpu.apply()  # torchtitan's MoE on the CPU (idempotent)
    started = time.monotonic()
    seq_len = int((checkpoint.run or {}).get("seq_len", 512))
    held = windows(a.window)[:a.max_windows or None]
    ref = build(job(BF16), checkpoint.path)
    loss = held_out_loss(ref, seq_len)
    prompts = [w[:a.prompt] for w in held]
    sampled = sample(ref, prompts, a.response, a.seed)
    data = {"held-out text": (held, 0), "sampled responses": (sampled, a.prompt - 1)}
    ref_lp = {d: [log_probs(ref, s) for s in seqs] for d, (seqs, _) in data.items()}
    per = {d: {} for d in data}
    for name in VARIANTS:
        model = build(variant_job(name), checkpoint.path)
        for d, (seqs, first) in data.items():
            per[d][name] = [distances(r, log_probs(model, s), s, first) for r, s in zip(ref_lp[d], seqs)]
        print(f"[rollout_distance] {checkpoint.label} {name}: held-out KL "
              f"{sum(sum(x['kl']) for x in per['held-out text'][name]):.4g} (sum)", flush=True)
    result = {"settings": settings(a, checkpoint, seq_len, folder.parent), "label": checkpoint.label,
              "regime": checkpoint.regime, "run": checkpoint.run, "windows": len(held), "held_out_loss": loss,
              "window_means": {d: {m: window_means(per[d], m) for m in METRICS} for d in data},
              "pooled_dlogp": {n: float(torch.tensor([t for s in per["held-out text"][n] for t in s["dlogp"]]).mean())
                               for n in VARIANTS},
              "seconds": time.monotonic() - started, "command": a.command}
    if with_vllm:
        started = time.monotonic()
        result["vllm"] = through_vllm(checkpoint, held, sampled, a.prompt, per, folder / f"{checkpoint.label}-vllm")
        result["vllm"]["seconds"] = time.monotonic() - started
    return result


def through_vllm(checkpoint: Checkpoint, held, sampled, prompt: int, per: dict, work: Path) -> dict:
    """Every variant exported and scored by vLLM: the largest |vLLM - package| logprob over all scored tokens and
    the held-out mean |logp difference| against vLLM's bf16 export."""
    from titan_fp4six.integration.export import export

    shutil.rmtree(work, ignore_errors=True)  # an earlier, interrupted call's exports: the exporter wants new folders
    work.mkdir(parents=True)
    seqs = held + sampled
    first = [0] * len(held) + [prompt - 1] * len(sampled)
    bf16 = vllm_logprobs(export(job(BF16), checkpoint.path, work / "bf16", "bf16"), seqs, first,
                         work / "vllm_bf16.json")
    agreement, dlogp = {}, {}
    for i, name in enumerate(VARIANTS):
        got = vllm_logprobs(export(variant_job(name), checkpoint.path, work / f"v{i}", "nvfp4"), seqs, first,
                            work / f"vllm_v{i}.json")
        ours = [s["logp"] for d in DATA for s in per[d][name]]
        agreement[name] = max(abs(x - y) for g, o in zip(got, ours) for x, y in zip(g, o))
        dlogp[name] = float(torch.tensor([abs(x - y) for g, b in zip(got[:len(held)], bf16[:len(held)])
                                          for x, y in zip(g, b)]).mean())
    return {"agreement": agreement, "dlogp": dlogp}


# ---------------------------------------------------------------------------------------------------- report

def _fmt(e: dict, digits: int = 4) -> str:
    if e.get("low") is None:
        return f"{e['mean']:.{digits}g}"
    return f"{e['mean']:.{digits}g} [{e['low']:.{digits}g}, {e['high']:.{digits}g}]"


def _ratio(r: dict) -> str:
    return f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if r["bounded"] else f"{r['value']:.3f} (unbounded)"


def _fraction(f: dict) -> str:
    return (f"{_pct(f['value'])} [{_pct(f['low'])}, {_pct(f['high'])}]" if f["bounded"]
            else f"{_pct(f['value'])} (unbounded)")


def _rows(summaries: dict) -> list[tuple[str, str, str, dict, dict]]:
    """(data, metric, scaling, summary of that data and metric, pair) in the page's order."""
    return [(d, m, s, summaries[d][m], summaries[d][m]["pairs"][s]) for d in DATA for m in METRICS for s in SCALINGS]


def table(summaries: dict, verdicts: bool) -> list[str]:
    head = "| data | metric | scaling | NVFP4 | 4/6 | 4/6 - NVFP4 | 4/6 / NVFP4 (Fieller) | fraction removed |"
    lines = [head + (" verdict |" if verdicts else ""), "| --- " * (9 if verdicts else 8) + "|"]
    for d, m, s, summ, p in _rows(summaries):
        cells = [d, "KL" if m == "kl" else "mean \\|dlogp\\|", s, _fmt(summ["variants"][f"NVFP4, {s}"]),
                 _fmt(summ["variants"][f"4/6, {s}"]), _fmt(p["difference"], 3), _ratio(p["ratio"]),
                 _fraction(p["fraction_removed"])] + ([row_verdict(p)] if verdicts else [])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def regime_summary(scores: list[dict]) -> dict:
    """A regime's intervals: over runs, pooled windows, and per checkpoint (windows as units)."""
    out = {"checkpoints": [s["label"] for s in scores], "per_checkpoint": {}, "pooled": {}, "over_runs": {}}
    for d in DATA:
        out["over_runs"][d], out["pooled"][d] = {}, {}
        for m in METRICS:
            units = [s["window_means"][d][m] for s in scores]
            out["over_runs"][d][m] = over_runs(units)
            out["pooled"][d][m] = pooled(units)
    for s in scores:
        out["per_checkpoint"][s["label"]] = {d: {m: summarize_means(s["window_means"][d][m]) for m in METRICS}
                                             for d in DATA}
    from titan_fp4six.compare.stats import mean_interval

    out["losses"] = {"held_out_loss": vars(mean_interval([s["held_out_loss"] for s in scores]))}
    train = [s["run"]["train_loss"] for s in scores if (s.get("run") or {}).get("train_loss") is not None]
    if len(train) == len(scores):
        out["losses"]["train_loss"] = vars(mean_interval(train))
    return out


def regime_verdict(name: str, summary: dict) -> list[str]:
    n = len(summary["checkpoints"])
    rows = _rows(summary["over_runs"])
    lines = []
    loss = summary["losses"]
    if "train_loss" in loss:
        gap = loss["held_out_loss"]["mean"] - loss["train_loss"]["mean"]
        lines.append(f"Final training loss {_fmt(loss['train_loss'], 3)}, held-out loss "
                     f"{_fmt(loss['held_out_loss'], 3)} (means over the runs): held-out minus training {gap:+.3g} "
                     "nats" + (": the runs memorized their training split." if gap > 1 else "."))
    if n < 2:
        lines.append(f"One checkpoint in regime {name}: no interval over training runs; the per-window intervals "
                     "below cover its windows only.")
        return lines + [""]
    closer = [r for r in rows if not _covers_zero(r[4]["difference"]) and r[4]["difference"]["high"] < 0]
    farther = [r for r in rows if not _covers_zero(r[4]["difference"]) and r[4]["difference"]["low"] > 0]
    lines.append(f"Over {n} training runs (each checkpoint one unit; 95% Student-t intervals across runs, the ratio "
                 f"and the fraction removed by Fieller's interval): 4/6 sits closer to the bf16 policy than NVFP4 in "
                 f"{len(closer)} of {len(rows)} rows, farther in {len(farther)}, and is not distinguishable from "
                 f"NVFP4 in {len(rows) - len(closer) - len(farther)}.")
    for d, m, s, _, p in rows:
        lines.append(f"- {d}, {'KL' if m == 'kl' else 'mean |dlogp|'}, per {s}: {row_verdict(p)}")
    per_window = [r for summ in summary["per_checkpoint"].values() for r in _rows(summ)]
    excl = sum(not _covers_zero(r[4]["difference"]) for r in per_window)
    pooled_rows = _rows(summary["pooled"])
    pooled_excl = sum(not _covers_zero(r[4]["difference"]) for r in pooled_rows)
    only_windows = sum(not _covers_zero(p[4]["difference"]) and _covers_zero(r[4]["difference"])
                       for p, r in zip(pooled_rows, rows))
    lines += ["", f"Per-window intervals (a checkpoint's windows as units) exclude 0 in {excl} of {len(per_window)} "
                  f"checkpoint-rows and the pooled windows in {pooled_excl} of {len(rows)} rows, against "
                  f"{len(closer) + len(farther)} of {len(rows)} over runs"
              + (f"; in {only_windows} row{'s' * (only_windows != 1)} the pooled windows exclude 0 where the runs "
                 "do not: there another training run moves the numbers more than the windows' spread says."
                 if only_windows else "."), ""]
    return lines


def header(result: dict) -> list[str]:
    lines = ["# Rollouts against the bf16 policy: NVFP4 and 4/6 over training runs", "",
             f"Generated {result['date']} at commit {result['commit']} on {result['machine']}.", "",
             "Method: docs/fidelity.md, \"Rollouts against the bf16 policy\" (post-training quantization of each "
             "bf16 checkpoint; KL and mean |logp difference| per token, per window; variants paired). Over runs: "
             "each checkpoint is one unit (its windows averaged), 95% Student-t intervals across checkpoints; the "
             "ratio 4/6 / NVFP4 of the run means with Fieller's interval; fraction removed = 1 - ratio. Per window: "
             "the windows of one checkpoint (or of all, pooled) as units; they ignore run-to-run variation. "
             f"{result['windows']} windows of {result['window']} tokens; responses of {result['response']} tokens "
             f"after {result['prompt']}-token prompts.", "", "## Commands as run", "", "```"]
    for phase in result.get("phases", []):
        lines.append(f"# {phase['phase']}: {phase['seconds']:.0f} s")
        lines.append(phase["command"])
    for s in result["scores"]:
        extra = f" (+ vLLM {s['vllm']['seconds']:.0f} s)" if "vllm" in s and "seconds" in s["vllm"] else ""
        lines.append(f"# score {s['label']}: {s['seconds']:.0f} s{extra}")
        lines.append(s["command"])
    lines += [f"# report: {result['report_seconds']:.0f} s", result["command"], "```", ""]
    return lines


def runs_table(scores: list[dict]) -> list[str]:
    lines = ["| checkpoint | seed | steps | batch x seq_len | final training loss | held-out loss | training s | "
             "scoring s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in scores:
        r = s.get("run") or {}
        loss = f"{r['train_loss']:.4f} (last {r['tail']} steps)" if r.get("train_loss") is not None else "-"
        shape = f"{r['batch']} x {r['seq_len']}" if r else "-"
        trained = f"{r['seconds']:.0f}" if r.get("seconds") is not None else "-"
        lines.append(f"| {s['label']} | {r.get('seed', '-')} | {r.get('steps', '-')} | {shape} | {loss} | "
                     f"{s['held_out_loss']:.4f} | {trained} | {s['seconds']:.0f} |")
    return lines + [""]


def vllm_table(scores: list[dict]) -> list[str]:
    through = [s for s in scores if "vllm" in s]
    if not through:
        return ["Not run through vLLM (no checkpoint chosen, or vLLM not installed).", ""]
    lines = ["| checkpoint | variant | max \\|vLLM - package\\| logp | held-out mean \\|logp difference\\| from "
             "vLLM's bf16 | same, package | relative difference |", "| --- | --- | --- | --- | --- | --- |"]
    for s in through:
        v = s["vllm"]
        for name in VARIANTS:
            ours = s["pooled_dlogp"][name]
            lines.append(f"| {s['label']} | {name} | {v['agreement'][name]:.2g} | {v['dlogp'][name]:.5g} | "
                         f"{ours:.5g} | {_pct(v['dlogp'][name] / ours - 1)} |")
    return lines + [""]


def page(result: dict) -> str:
    lines = header(result)
    for name, summary in result["regimes"].items():
        scores = [s for s in result["scores"] if s["regime"] == name]
        lines += [f"## Regime: {name} ({len(scores)} checkpoint{'s' * (len(scores) != 1)})", ""]
        lines += runs_table(scores)
        lines += regime_verdict(name, summary)
        if len(scores) >= 2:
            lines += [f"**Over training runs** (n = {len(scores)} checkpoints)", ""] + table(summary["over_runs"], True)
            lines += [f"**Pooled windows** (all {sum(s['windows'] for s in scores)} windows of the {len(scores)} "
                      "checkpoints as units: ignores run-to-run variation)", ""] + table(summary["pooled"], False)
        for label, summ in summary["per_checkpoint"].items():
            n = next(s["windows"] for s in scores if s["label"] == label)
            lines += [f"**Per window, {label}** (n = {n} windows of this checkpoint)", ""] + table(summ, False)
        lines += ["**Through vLLM with the four_over_six plugin**", ""] + vllm_table(scores)
    return "\n".join(lines)


def fidelity_summary(result: dict, page_name: str) -> str:
    """The summary docs/results/fidelity.md shows: per regime, the table over training runs with its verdicts (one
    checkpoint: its per-window table), and a link to the whole page."""
    lines = []
    for name, summary in result["regimes"].items():
        n = len(summary["checkpoints"])
        if n >= 2:
            lines += [f"**Regime {name}**, over {n} training runs (each checkpoint one unit):", ""]
            lines += table(summary["over_runs"], True)
        else:
            label, per_window = next(iter(summary["per_checkpoint"].items()))
            lines += [f"**Regime {name}**, one checkpoint ({label}), its windows as units:", ""]
            lines += table(per_window, False)
    lines.append(f"The whole study (the runs, pooled and per-checkpoint intervals, vLLM): [{page_name}]({page_name}).")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- main

def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.rollout_distance", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", action="append", default=[], metavar="[REGIME=]PATH",
                        help="a torchtitan step folder or a glob of them (repeatable)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-windows", type=int, default=0, help="score the first N windows only (0: all)")
    parser.add_argument("--vllm", choices=("first", "all", "none"), default="first",
                        help="checkpoints scored through vLLM too: the first of each regime (default), all, none")
    parser.add_argument("--no-vllm", dest="vllm", action="store_const", const="none", help="= --vllm none")
    parser.add_argument("--score-only", action="store_true", help="score the checkpoints into OUT/scores, no page")
    parser.add_argument("--report-only", action="store_true",
                        help="no scoring: the page from every score file in OUT/scores (no --checkpoint needed)")
    parser.add_argument("--phases", action="append", default=[], metavar="FILE",
                        help="a JSON list of {phase, command, seconds} (or a glob of such files) to head the page "
                             "with (scripts/rollout_study.py's phases files); repeatable")
    parser.add_argument("--docs", nargs="?", const=DOCS_PAGE, metavar="PATH",
                        help=f"also write the page to PATH in the repository (default {DOCS_PAGE})")
    parser.add_argument("--vllm-worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    a.command = shlex.join(["python", "-m", "scripts.rollout_distance", *(sys.argv[1:] if argv is None else argv)])
    if a.vllm_worker:
        return a
    if a.out is None or not (a.checkpoint or a.report_only):
        parser.error("--out and --checkpoint (or --report-only) are required")
    if not 1 <= a.prompt < a.window:
        parser.error(f"--prompt {a.prompt}: it must be in [1, --window {a.window})")
    if a.max_windows < 0:
        parser.error("--max-windows: 0 (all) or a positive number")
    try:
        a.checkpoints = [] if a.report_only else resolve_checkpoints(a.checkpoint)
    except ValueError as e:
        parser.error(str(e))
    a.through_vllm = pick_vllm(a.checkpoints, a.vllm)
    if a.through_vllm and importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed in this Python: run in .venv-vllm (scripts/setup_vllm.sh) or pass "
                     "--vllm none")
    return a


def stored_scores(folder: Path) -> list[dict]:
    """Every score file of OUT/scores, ordered by regime (first seen) and seed."""
    scores = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    first = {}
    for s in scores:
        first.setdefault(s["regime"], len(first))
    return sorted(scores, key=lambda s: (first[s["regime"]], (s.get("run") or {}).get("seed", 0), s["label"]))


def main(argv=None) -> int:
    started = time.monotonic()
    a = parse(argv)
    if a.vllm_worker:
        vllm_worker(*a.vllm_worker)
        return 0
    folder = a.out / "scores"
    folder.mkdir(parents=True, exist_ok=True)
    scores = [] if not a.report_only else stored_scores(folder)
    for c in a.checkpoints:
        file = folder / f"{c.label}.json"
        want = settings(a, c, int((c.run or {}).get("seq_len", 512)), a.out)
        s = cached(file, want, c.label in a.through_vllm)
        if s is None:
            s = score(a, c, c.label in a.through_vllm, folder)
            tmp = file.with_suffix(".tmp")
            tmp.write_text(json.dumps(s, indent=1))
            tmp.replace(file)
        else:
            print(f"[rollout_distance] {c.label}: scored by an earlier call ({file})", flush=True)
        s["regime"], s["run"] = c.regime, c.run  # the grouping and run record of this call
        scores.append(s)
    if a.score_only:
        return 0
    if not scores:
        raise SystemExit(f"no score files in {folder}")
    kinds = {json.dumps({k: v for k, v in s["settings"].items() if k not in ("checkpoint", "seq_len")})
             for s in scores}
    if len(kinds) > 1:
        raise SystemExit(f"the score files were made with different settings ({sorted(kinds)}): one page needs one")
    regimes = {}
    for s in scores:
        regimes.setdefault(s["regime"], []).append(s)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "commit": commit(os.environ.get("ROLLOUT_COMMIT", "unknown (not a git checkout)")),
              "machine": machine(), "command": a.command,
              "phases": [x for f in a.phases for g in (sorted(glob.glob(f)) or [f]) for x in json.loads(
                  Path(g).read_text())],
              "windows": scores[0]["windows"], **{k: scores[0]["settings"][k] for k in ("window", "prompt",
                                                                                       "response", "seed")},
              "regimes": {name: regime_summary(group) for name, group in regimes.items()},
              "scores": scores}
    result["report_seconds"] = time.monotonic() - started
    text = page(result)
    (a.out / "rollout_distance.json").write_text(json.dumps(result, indent=1))
    (a.out / "rollout_distance.md").write_text(text)
    if a.docs:  # the page of docs/results is this script's alone (scripts/results_page.py)
        target = write_page(REPO / a.docs, "scripts.rollout_distance", text)
        if (target.parent / "fidelity.md").is_file():
            write_section(target.parent / "fidelity.md", "rollout-distance", fidelity_summary(result, target.name),
                          command=a.command)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
