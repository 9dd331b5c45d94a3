"""How far quantized rollouts sit from the bf16 policy: per-token KL(bf16 || quantized) and |logp difference| of a
bf16-trained checkpoint served with plain NVFP4 (scope none, B=448) and with 4/6, per activation scaling, on held-out
text and on responses sampled from the bf16 policy (docs/fidelity.md, "Rollouts against the bf16 policy").

    .venv-vllm/bin/python -m scripts.rollout_distance --checkpoint outputs/study/checkpoint/step-1500 --out DIR \
        [--window 128] [--prompt 32] [--response 64] [--seed 0] [--no-vllm]

The quantized models are the all-Linears recipe (attention projections and routed experts; router and LM head
bf16) with its knobs per variant; every model holds the checkpoint's weights rounded to bf16 (what a server holds)
and computes in FP32, one sequence per forward (per-tensor amaxes cover that sequence). Units: 128-token windows of
the embedded held-out split; each window's mean over its tokens is one sample, the variants paired by window.
With vLLM (run it in .venv-vllm), every variant is also exported (`--format nvfp4`, and the bf16 reference with
`--format bf16`) and scored by vLLM with the four_over_six plugin, one engine per subprocess: the actual tokens'
logprobs must agree with the package's forward, and the |logp difference| table is recomputed from vLLM's.
Writes DIR/rollout_distance.md and .json.
"""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
QUANTIZED = "configs/qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml"
BF16 = "configs/qwen3_moe_debug_bf16.toml"
SECTIONS = ("quantize.linear.four_over_six", "quantize.grouped_mm.four_over_six")
VARIANTS = {  # name: (scope, scale_bound, activation_scaling)
    "NVFP4, tensor": ("none", 448, "tensor"), "4/6, tensor": ("all", 256, "tensor"),
    "NVFP4, row": ("none", 448, "row"), "4/6, row": ("all", 256, "row")}


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


def windows(length: int) -> list[list[int]]:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from titan_fp4six.integration.data import EMBEDDED_DIR, load_documents

    tok = HuggingFaceTokenizer(str(EMBEDDED_DIR))
    out = []
    for text in load_documents(EMBEDDED_DIR, "validation")["text"]:
        ids = tok.encode(text, add_bos=True, add_eos=False)
        out += [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]
    return out


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


def summarize(per_seq: dict[str, list[dict]], metric: str) -> dict:
    """Per variant: mean over windows of the per-window mean, 95% interval; 4/6 against NVFP4 per scaling:
    the paired difference and the ratio of means (Fieller), i.e. the fraction of NVFP4's distance 4/6 removes."""
    from titan_fp4six.compare.stats import fieller_ratio, mean_interval

    means = {v: [sum(s[metric]) / len(s[metric]) for s in seqs] for v, seqs in per_seq.items()}
    table = {v: vars(mean_interval(m)) for v, m in means.items()}
    pairs = {}
    for scaling in ("tensor", "row"):
        a, b = means[f"4/6, {scaling}"], means[f"NVFP4, {scaling}"]
        diff = mean_interval([x - y for x, y in zip(a, b)])
        ratio = fieller_ratio(a, b)
        pairs[scaling] = {"difference": vars(diff), "ratio": vars(ratio)}
    return {"variants": table, "pairs": pairs}


def _fmt(e: dict, digits: int = 4) -> str:
    return f"{e['mean']:.{digits}g} [{e['low']:.{digits}g}, {e['high']:.{digits}g}]"


def report(result: dict) -> str:
    lines = []
    for data in ("held-out text", "sampled responses"):
        for metric, label in (("kl", "KL(bf16 || quantized), nats/token"), ("dlogp", "mean |logp difference|")):
            s = result["summary"][data][metric]
            lines += [f"**{data}: {label}** (n = {s['variants']['4/6, tensor']['n']} windows, 95% intervals)", "",
                      "| activation scaling | NVFP4 | 4/6 | 4/6 - NVFP4 | 4/6 / NVFP4 |",
                      "| --- | --- | --- | --- | --- |"]
            for scaling in ("tensor", "row"):
                p = s["pairs"][scaling]
                r = p["ratio"]
                ratio = (f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if r["bounded"]
                         else f"{r['value']:.3f} (unbounded)")
                lines.append(f"| {scaling} | {_fmt(s['variants'][f'NVFP4, {scaling}'])} | "
                             f"{_fmt(s['variants'][f'4/6, {scaling}'])} | {_fmt(p['difference'], 3)} | {ratio} |")
            lines.append("")
    if "vllm" in result:
        v = result["vllm"]
        lines += ["**through vLLM with the four_over_six plugin** (held-out text and sampled responses):", "",
                  "| variant | max \\|vLLM - package\\| logp | mean \\|logp difference\\| from vLLM's bf16, held-out | "
                  "same, package |", "| --- | --- | --- | --- |"]
        for name in VARIANTS:
            lines.append(f"| {name} | {v['agreement'][name]:.2g} | {v['dlogp'][name]:.5g} | "
                         f"{result['pooled_dlogp'][name]:.5g} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.rollout_distance", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--vllm-worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.vllm_worker:
        vllm_worker(*a.vllm_worker)
        return 0
    if a.checkpoint is None or a.out is None:
        parser.error("--checkpoint and --out are required")
    if not 1 <= a.prompt < a.window:
        parser.error(f"--prompt {a.prompt}: it must be in [1, --window {a.window})")
    a.out.mkdir(parents=True, exist_ok=True)
    import titan_fp4six.integration.cpu as cpu

    cpu.apply()
    held = windows(a.window)
    ref = build(job(BF16), a.checkpoint)
    prompts = [w[:a.prompt] for w in held]
    sampled = sample(ref, prompts, a.response, a.seed)
    data = {"held-out text": (held, 0), "sampled responses": (sampled, a.prompt - 1)}
    ref_lp = {d: [log_probs(ref, s) for s in seqs] for d, (seqs, _) in data.items()}
    per = {d: {} for d in data}
    for name in VARIANTS:
        model = build(variant_job(name), a.checkpoint)
        for d, (seqs, first) in data.items():
            per[d][name] = [distances(r, log_probs(model, s), s, first) for r, s in zip(ref_lp[d], seqs)]
        print(f"{name}: KL held-out {sum(sum(x['kl']) for x in per['held-out text'][name]):.4g} (sum)", flush=True)
    result = {"checkpoint": str(a.checkpoint), "windows": len(held), "window": a.window, "prompt": a.prompt,
              "response": a.response, "seed": a.seed,
              "summary": {d: {m: summarize(per[d], m) for m in ("kl", "dlogp")} for d in data},
              "pooled_dlogp": {n: float(torch.tensor([t for s in per["held-out text"][n] for t in s["dlogp"]]).mean())
                               for n in VARIANTS}}
    if not a.no_vllm:
        from titan_fp4six.integration.export import export

        exports = a.out / "exports"
        seqs = held + sampled
        first = [0] * len(held) + [a.prompt - 1] * len(sampled)
        bf16 = vllm_logprobs(export(job(BF16), a.checkpoint, exports / "bf16", "bf16"), seqs, first,
                             a.out / "vllm_bf16.json")
        agreement, dlogp = {}, {}
        for i, name in enumerate(VARIANTS):
            got = vllm_logprobs(export(variant_job(name), a.checkpoint, exports / f"v{i}", "nvfp4"), seqs, first,
                                a.out / f"vllm_v{i}.json")
            ours = [s["logp"] for d in data for s in per[d][name]]
            agreement[name] = max(abs(x - y) for g, o in zip(got, ours) for x, y in zip(g, o))
            dlogp[name] = float(torch.tensor([abs(x - y) for g, b in zip(got[:len(held)], bf16[:len(held)])
                                              for x, y in zip(g, b)]).mean())
        result["vllm"] = {"agreement": agreement, "dlogp": dlogp}
    (a.out / "rollout_distance.json").write_text(json.dumps(result, indent=1))
    (a.out / "rollout_distance.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
