"""Reports behind the docs: the quantization-error tables of docs/results/quant_error.md, the RL table and figures
of docs/results/rl.md, the training-fidelity study's verdict and slice tables and per-layer metrics
(docs/results/fidelity.md) and its verdicts as one figure (docs/fidelity/verdicts.png).

    python -m scripts.report quant-error --out OUT [--docs]  # markdown table on stdout; JSON and PNGs in OUT
    python -m scripts.report quant-error --no-capture --out OUT   # synthetic distributions only (seconds)
    python -m scripts.report rl OUT_DIR [--docs]          # after `bash scripts/rl_runs.sh OUT_DIR`
    python -m scripts.report fidelity OUT_DIR [--docs]    # after `bash scripts/fidelity_study.sh OUT_DIR ...`
    python -m scripts.report per-layer DIR... [--docs]    # after `python -m titan_fp4six.fidelity ... --out DIR`

Without --docs the tables go to stdout and the files to OUT; --docs writes the tables into their sections of the
results pages (scripts/results_page.py) and the figures and records beside them.

quant-error: relative MSE of standard NVFP4 and every four-over-six knob setting, and the map-to-4 share, on
synthetic distributions and on GEMM operands (activations, weights, output gradients) captured with hooks from a
short unquantized training of torchtitan's debug models: users choose the knobs by what each costs in accuracy,
on the distributions 4/6 meets in training. relative MSE = sum((dequant(quant(x)) - x)^2) / sum(x^2), per
tensor, then averaged over the tensors of a source. Every quantization goes through the public numerics API.
"""

import argparse
import contextlib
import copy
import gzip
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import torch
from torch import nn

from scripts.results_page import DOCS_HELP, read_records, write_section
from titan_fp4six import four_over_six_quantize, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax
from titan_fp4six.modules.fidelity import relative_mse

DOCS = Path(__file__).resolve().parents[1] / "docs"

# --- capture: GEMM operands from a short training of a debug model ----------------------------------------------
# The model comes from torchtitan's registry and trains unquantized (so the captured tensors are what a quantizer
# would receive; bf16 autocast on CUDA like torchtitan's single-GPU AMP, FP32 on CPU) with AdamW on the embedded
# corpus. Hooks copy the inputs, weights and output gradients of the decoder layers' Linears (router gates
# excluded: the recipes keep them in bf16) and of the routed experts (their input tokens, w1/w2/w3 with one amax
# per expert, and the gradient of their output). The experts' inner w2 input is not reachable by a module hook.

BLOCK = 16


@dataclass
class Sample:
    """A 2-D tensor to quantize. `group_rows` > 0: rows come in groups (experts) with one amax each."""

    source: str  # e.g. "gaussian", "activation", "weight", "gradient"
    name: str
    step: int
    x: torch.Tensor
    group_rows: int = 0


def _rows(x: torch.Tensor, max_rows: int) -> torch.Tensor | None:
    """(rows, cols) FP32 copy of the first max_rows rows (a multiple of 16), or None if not quantizable."""
    x = x.detach().reshape(-1, x.shape[-1])
    rows = min(x.shape[0], max_rows) // BLOCK * BLOCK
    if rows == 0 or x.shape[1] % BLOCK:
        return None
    return x[:rows].float().clone().cpu()


def build_model(name: str, flavor: str, seq_len: int, device: torch.device) -> nn.Module:
    """torchtitan model `name`/`flavor` with its own init; grouped GEMMs only on CUDA (CPU takes the loop)."""
    from torchtitan.config import JobConfig
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(name)
    args = copy.deepcopy(spec.model_args[flavor])
    job = JobConfig()
    job.training.seq_len = seq_len
    args.update_from_config(job)
    if getattr(args, "moe_enabled", True) and hasattr(args, "moe_args"):
        args.moe_args.use_grouped_mm = device.type == "cuda"
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def corpus_batches(batch: int, seq_len: int, vocab: int):
    """Endless (inputs, labels) batches of consecutive windows of the embedded training corpus."""
    from tokenizers import Tokenizer

    from titan_fp4six.integration.data import EMBEDDED_DIR, load_documents

    tokenizer = Tokenizer.from_file(str(EMBEDDED_DIR / "tokenizer.json"))
    need = batch * (seq_len + 1)
    buf: list[int] = []
    while True:
        for text in load_documents(EMBEDDED_DIR, "train")["text"]:
            buf.extend(i for i in tokenizer.encode(text).ids if i < vocab)
            while len(buf) >= need:
                chunk = torch.tensor(buf[:need]).view(batch, seq_len + 1)
                del buf[:need]
                yield chunk[:, :-1], chunk[:, 1:]


class _Recorder:
    """Forward hooks that copy operands (and hook the output's gradient) while `active` is set."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.active = False
        self.step = 0
        self.samples: list[Sample] = []

    def _add(self, source: str, name: str, x: torch.Tensor, group_rows: int = 0) -> None:
        x = _rows(x, self.max_rows) if not group_rows else x.detach().float().clone().cpu()
        if x is not None:
            self.samples.append(Sample(source, name, self.step, x, group_rows))

    def _grad_hook(self, name: str):
        def hook(grad):
            if self.active:
                self._add("gradient", name, grad)
        return hook

    def linear(self, name: str):
        def hook(module, args, output):
            if self.active:
                self._add("activation", name, args[0])
                self._add("weight", name, module.weight)
                output.register_hook(self._grad_hook(name))
        return hook

    def experts(self, name: str):
        def hook(module, args, output):
            if not self.active:
                return
            self._add("activation", name, args[0])
            for w in ("w1", "w2", "w3"):
                weight = getattr(module, w).detach()
                kept = max(2, self.max_rows // weight.shape[1])  # whole experts, each with its own amax
                self._add("weight", f"{name}.{w}", weight[:kept].reshape(-1, weight.shape[2]), weight.shape[1])
            output.register_hook(self._grad_hook(name))
        return hook


def attach(model: nn.Module, layers: list[str], recorder: _Recorder) -> None:
    """Hook the quantizable GEMM modules of the given decoder layers."""
    for layer in layers:
        block = model.layers[layer]
        for name, module in block.named_modules():
            fqn = f"layers.{layer}.{name}"
            if isinstance(module, nn.Linear) and "router" not in name.split("."):
                module.register_forward_hook(recorder.linear(fqn))
            elif name.endswith("experts") and not name.endswith("shared_experts") and hasattr(module, "w1"):
                module.register_forward_hook(recorder.experts(fqn))


def capture_training_tensors(name: str, flavor: str, *, steps: int, capture_steps: list[int], batch: int,
                             seq_len: int, max_rows: int, lr: float = 8e-4, seed: int = 0,
                             device: torch.device | None = None) -> tuple[list[Sample], list[float]]:
    """Train `steps` steps and return (captured samples, loss per step). Hooks the second and the last
    decoder layer (the first of DeepSeek-V3's debugmodel is dense)."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        from titan_fp4six.integration import cpu

        cpu.apply()  # torchtitan's router counts tokens with an integer histc, which has no CPU kernel
    torch.manual_seed(seed)
    model = build_model(name, flavor, seq_len, device)
    layer_ids = list(model.layers.keys())
    recorder = _Recorder(max_rows)
    attach(model, [layer_ids[1], layer_ids[-1]], recorder)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8, weight_decay=0.1)
    losses = []
    vocab = model.tok_embeddings.num_embeddings
    # on CUDA the operands are what torchtitan's single-GPU AMP feeds the GEMMs (bf16); the CPU run stays FP32
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    start = time.perf_counter()
    for step, (inputs, labels) in enumerate(islice(corpus_batches(batch, seq_len, vocab), steps), start=1):
        recorder.step, recorder.active = step, step in capture_steps
        with amp():
            logits = model(inputs.to(device))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.to(device).flatten())
        loss.backward()
        recorder.active = False
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"{name} step {step} loss {losses[-1]:.4f} ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return recorder.samples, losses


# --- quant-error: the report ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantConfig:
    """One quantizer setting. method "nvfp4" is standard NVFP4 (B=448, 1x16, no candidate choice)."""

    method: str  # "nvfp4" or "4/6"
    scaling: str = "tensor"  # "tensor" (one amax per tensor, or per expert) or "row"
    block: str = "1x16"
    err_mode: str = "mse"
    scale_bound: int = 448

    @property
    def label(self) -> str:
        scaling = "row" if self.scaling == "row" else "tensor"
        if self.method == "nvfp4":
            return f"NVFP4 {scaling}"
        return f"4/6 {self.err_mode} B{self.scale_bound} {self.block} {scaling}"


def default_configs() -> list[QuantConfig]:
    """Standard NVFP4 (per-tensor, per-row) and every valid four-over-six knob combination.

    Row scaling is 1x16 only (a per-row amax is not uniform over a 16x16 tile), as docs/numerics.md requires.
    """
    configs = [QuantConfig("nvfp4"), QuantConfig("nvfp4", scaling="row")]
    for scaling, block in (("tensor", "1x16"), ("tensor", "16x16"), ("row", "1x16")):
        for err_mode in ("mse", "mae"):
            for bound in (256, 448):
                configs.append(QuantConfig("4/6", scaling, block, err_mode, bound))
    return configs


def amax_for(x: torch.Tensor, scaling: str, group_rows: int = 0) -> torch.Tensor:
    """FP32 amax: per tensor (per row group when `group_rows`, expanded to rows) or per row."""
    if scaling == "row":
        return row_amax(x)
    if group_rows:
        per_group = x.abs().view(-1, group_rows, x.shape[1]).amax(dim=(1, 2)).float()
        return per_group.repeat_interleave(group_rows)
    return tensor_amax(x)


def quantize_dequantize(x: torch.Tensor, cfg: QuantConfig, group_rows: int = 0) -> tuple[torch.Tensor, float]:
    """(FP32 dequantized x, fraction of 1x16 blocks that stored map-to-4; NaN for standard NVFP4)."""
    amax = amax_for(x, cfg.scaling, group_rows)
    if cfg.method == "nvfp4":
        codes, scales = nvfp4_quantize(x, amax)
        return nvfp4_dequantize(codes, scales, amax, scale_bound=448), math.nan
    blocks = four_over_six_quantize(x, amax, block=cfg.block, err_mode=cfg.err_mode, scale_bound=cfg.scale_bound)
    xq = nvfp4_dequantize(blocks.codes, blocks.scales, amax, scale_bound=cfg.scale_bound)
    return xq, blocks.map4.float().mean().item()


def synthetic_samples(rows: int = 1024, cols: int = 1024, seed: int = 0) -> list[Sample]:
    """Gaussian; heavy-tailed (Student-t, 3 degrees of freedom); outlier-rich (Gaussian with 1% of the
    columns scaled 30x, the channel outliers of LLM activations, plus 0.01% scattered 100x spikes)."""
    g = torch.Generator().manual_seed(seed)
    gauss = torch.randn(rows, cols, generator=g)
    normal = torch.randn(rows, cols, generator=g)
    chi2 = torch.randn(3, rows, cols, generator=g).pow(2).sum(0)
    student = normal / (chi2 / 3).sqrt()
    outlier = torch.randn(rows, cols, generator=g)
    channels = torch.randperm(cols, generator=g)[: max(1, cols // 100)]
    outlier[:, channels] *= 30
    spikes = torch.rand(rows, cols, generator=g) < 1e-4
    outlier = torch.where(spikes, outlier * 100, outlier)
    return [Sample("gaussian", "N(0,1)", 0, gauss), Sample("heavy-tailed", "student-t(3)", 0, student),
            Sample("outlier-rich", "channels x30 + spikes x100", 0, outlier)]


def evaluate(samples: list[Sample], configs: list[QuantConfig], device: str | None = None) -> list[dict]:
    """One record per (sample, config): relative MSE and map-to-4 fraction (quantized on the GPU if any)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    records = []
    for s in samples:
        x = s.x.to(device)
        checksum = s.x.double().sum().item()  # tells input differences from quantizer differences across machines
        for cfg in configs:
            xq, map4 = quantize_dequantize(x, cfg, s.group_rows)
            records.append({"source": s.source, "name": s.name, "step": s.step, "shape": list(s.x.shape),
                            "checksum": checksum, "config": cfg.label, **asdict(cfg),
                            "rel_mse": relative_mse(x, xq), "map4": map4})
    return records


def summarize(records: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """{config label: {source: (mean relative MSE, mean map-to-4 fraction)}} in first-seen order."""
    acc: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in records:
        acc.setdefault(r["config"], {}).setdefault(r["source"], []).append((r["rel_mse"], r["map4"]))
    return {c: {s: (sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals))
                for s, vals in by_source.items()} for c, by_source in acc.items()}


def markdown_table(summary: dict[str, dict[str, tuple[float, float]]], baseline: str = "NVFP4 tensor") -> str:
    """Rows: configs; columns: sources. Cell: relative MSE x1e3, its ratio to the baseline, map-to-4 %."""
    sources = list(next(iter(summary.values())).keys())
    lines = ["| config | " + " | ".join(sources) + " |", "| --- |" + " --- |" * len(sources)]
    for cfg, by_source in summary.items():
        cells = []
        for src in sources:
            mse, map4 = by_source[src]
            ratio = mse / summary[baseline][src][0]
            cell = f"{mse * 1e3:.3f} ({ratio:.2f}x)"
            cells.append(cell if math.isnan(map4) else f"{cell} m4 {map4 * 100:.0f}%")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_quant_error(summary: dict[str, dict[str, tuple[float, float]]], records: list[dict], out: Path,
         baseline: str = "NVFP4 tensor") -> list[Path]:
    """quant_error_ratio.png (relative MSE / baseline per source) and, with captured tensors, the
    per-step relative MSE of NVFP4 vs the default four-over-six (quant_error_steps.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(summary)
    sources = list(summary[configs[0]])
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(sources)
    for i, src in enumerate(sources):
        ratios = [summary[c][src][0] / summary[baseline][src][0] for c in configs]
        ax.bar([k + i * width for k in range(len(configs))], ratios, width, label=src)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(configs))], configs, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(f"relative MSE / {baseline}")
    ax.set_title("Quantization error vs standard NVFP4 (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "quant_error_ratio.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    captured = [r for r in records if r["step"] > 0]
    if captured:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=False)
        shown = (baseline, "4/6 mse B256 1x16 tensor", "4/6 mse B256 16x16 tensor", "4/6 mse B256 1x16 row")
        for ax, src in zip(axes, ("activation", "weight", "gradient")):
            for cfg in shown:
                pts = {}
                for r in captured:
                    if r["source"] == src and r["config"] == cfg:
                        pts.setdefault(r["step"], []).append(r["rel_mse"])
                steps = sorted(pts)
                ax.plot(steps, [sum(pts[s]) / len(pts[s]) for s in steps], marker="o", label=cfg)
            ax.set_title(src)
            ax.set_xlabel("training step")
        axes[0].set_ylabel("mean relative MSE")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "quant_error_steps.png")
        fig.savefig(paths[1], dpi=120)
        plt.close(fig)
    return paths

def cmd_quant_error(args):
    """quant_error.json/.md and the PNGs in OUT; --docs: the table into docs/results/quant_error.md's section of this
    machine (quant-error-gpu with CUDA, else quant-error-cpu), the records beside it as quant_error_{gpu,cpu}.json.gz,
    and on a GPU the figures (the page's figures are the GPU run's)."""
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    samples = synthetic_samples(args.synthetic_size, args.synthetic_size)
    meta = {"synthetic_shape": [args.synthetic_size] * 2, "torch": torch.__version__}
    if not args.no_capture:
        capture_steps = [int(s) for s in args.capture_steps.split(",")]
        for spec in args.models.split(","):
            name, flavor = spec.split(":")
            captured, losses = capture_training_tensors(name, flavor, steps=args.steps, capture_steps=capture_steps,
                                                        batch=args.batch, seq_len=args.seq_len,
                                                        max_rows=args.max_rows)
            samples += captured
            meta[f"{name}:{flavor} losses"] = losses
            print(f"{name} {flavor}: {len(captured)} tensors, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
                  file=sys.stderr)
    records = evaluate(samples, default_configs())
    summary = summarize(records)
    table = markdown_table(summary)
    print(table)
    record = json.dumps({"meta": meta, "records": records}, indent=1)
    (args.out / "quant_error.json").write_text(record)
    (args.out / "quant_error.md").write_text(table + "\n")
    figures = plot_quant_error(summary, records, args.out)
    for path in figures:
        print(f"wrote {path}", file=sys.stderr)
    if args.docs:
        gpu = torch.cuda.is_available()
        results = DOCS / "results"
        kind = "gpu" if gpu else "cpu"
        (results / f"quant_error_{kind}.json.gz").write_bytes(gzip.compress(record.encode(), mtime=0))
        if gpu:
            for path in figures:
                shutil.copyfile(path, results / path.name)
        write_section(results / "quant_error.md", "quant-error-gpu" if gpu else "quant-error-cpu", table)


# --- rl: docs/results/rl.md's table and figures from the runs of scripts/rl_runs.sh -------------------------------
# Reads OUT_DIR/<run>/rl_metrics.jsonl (one JSON line per GRPO step, written by `python -m titan_fp4six.rl`) for
# the runs nvfp4_consistent, nvfp4_fast and bf16_fast; writes rl_reward.png (reward per step, 10-step moving
# average) and rl_mismatch.png (max and mean |trainer - rollout| logprob per step, symlog scale so exact zeros show)
# to OUT_DIR, or with --docs to docs/results/ with the table in rl.md's section rl-h200.

RL_RUNS = {"nvfp4_consistent": "4/6 row-scaled, consistent", "nvfp4_fast": "4/6 row-scaled, fast",
           "bf16_fast": "bf16, fast"}
RL_TAIL = 20


def rl_load(out: Path) -> dict[str, list[dict]]:
    runs = {}
    for name in RL_RUNS:
        path = out / name / "rl_metrics.jsonl"
        if path.is_file():
            runs[name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not runs:
        raise SystemExit(f"no {', '.join(f'{n}/rl_metrics.jsonl' for n in RL_RUNS)} under {out}")
    return runs


def moving_average(values: list[float], window: int = 10) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def rl_summary(steps: list[dict], wall: float | None) -> dict:
    """Tokens/s are medians over steps after the first (start-up and first quantization excluded)."""
    body = steps[1:] or steps
    return {
        "steps": len(steps),
        "reward_first": statistics.fmean(s["reward"] for s in steps[:RL_TAIL]),
        "reward_last": statistics.fmean(s["reward"] for s in steps[-RL_TAIL:]),
        "mismatch_max": max(s["mismatch_max"] for s in steps),
        "mismatch_mean": statistics.fmean(s["mismatch_mean"] for s in steps),
        "kl": statistics.fmean(s["mismatch_kl"] for s in steps),
        "zero_steps": sum(s["mismatch_max"] == 0 for s in steps),
        "gen_tps": statistics.median(s["gen_tps"] for s in body),
        "train_tps": statistics.median(s["train_tps"] for s in body),
        "wall_s": wall,
    }


def rl_table(runs: dict[str, list[dict]], out: Path) -> str:
    rows = []
    stats = {}
    for name, steps in runs.items():
        wall_file = out / name / "wall.json"
        wall = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else None
        stats[name] = s = rl_summary(steps, wall)
        rows.append(f"| {RL_RUNS[name]} | {s['steps']} | {s['reward_first']:.3f} -> {s['reward_last']:.3f} | "
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


def rl_plot(runs: dict[str, list[dict]], docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps in runs.items():
        ax.plot([s["step"] for s in steps], moving_average([s["reward"] for s in steps]), label=RL_RUNS[name])
    ax.set(xlabel="GRPO step", ylabel="reward (10-step mean)", title="Copy task, Qwen3 MoE debugmodel")
    ax.legend()
    fig.tight_layout()
    fig.savefig(docs / "rl_reward.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps in runs.items():
        x = [s["step"] for s in steps]
        (line,) = ax.plot(x, [s["mismatch_max"] for s in steps], label=f"{RL_RUNS[name]}: max")
        ax.plot(x, [s["mismatch_mean"] for s in steps], linestyle="--", color=line.get_color(),
                label=f"{RL_RUNS[name]}: mean")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set(xlabel="GRPO step", ylabel="|trainer - rollout| logprob",
           title="Trainer/rollout mismatch (0 = bitwise equal)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(docs / "rl_mismatch.png", dpi=120)
    plt.close(fig)

def cmd_rl(args):
    runs = rl_load(args.out)
    rl_plot(runs, DOCS / "results" if args.docs else args.out)
    report = rl_table(runs, args.out)
    print(report)
    if args.docs:
        write_section(DOCS / "results" / "rl.md", "rl-h200",
                      f"{report}\n\n![reward](rl_reward.png)\n\n![mismatch](rl_mismatch.png)\n")


# --- fidelity: the study's verdict table, every slice's table, and the paired gaps in one forest plot -------------
# The slices of scripts/fidelity_study.sh, in the order of the verdict table (each slice's name is also its section
# of docs/results/fidelity.md), and the three paired gaps each compare.json holds (variant, field, label).
FIDELITY_SLICES = {"qwen3_base": "Qwen3 MoE, RL base point", "deepseek_base": "DeepSeek-V3, RL base point",
                   "qwen3_all": "Qwen3 MoE, all Linears", "deepseek_all": "DeepSeek-V3, all Linears",
                   "qwen3_full": "Qwen3 MoE, full recipe", "deepseek_full": "DeepSeek-V3, full recipe"}
FIDELITY_GAPS = (("4/6", "gap_to_nvfp4", "4/6 - NVFP4"), ("nvfp4", "gap_to_bf16", "NVFP4 - bf16"),
                 ("4/6", "gap_to_bf16", "4/6 - bf16"))


def fidelity_intervals(study: Path) -> list[dict]:
    """The paired gaps with a 95% interval (2 seeds or more) of every slice folder under `study` that holds a
    compare.json (`python -m titan_fp4six.compare` writes it), in FIDELITY_SLICES order."""
    rows = []
    for name, label in FIDELITY_SLICES.items():
        path = study / name / "compare.json"
        if not path.exists():
            continue
        summaries = {v["name"]: v for v in json.loads(path.read_text())["variants"]}
        for variant, key, gap in FIDELITY_GAPS:
            e = summaries.get(variant, {}).get(key)
            if e and e.get("low") is not None:
                rows.append({"slice": label, "gap": gap, "mean": e["mean"], "low": e["low"], "high": e["high"],
                             "n": e["n"]})
    return rows


def fidelity_plot(rows: list[dict], path: Path) -> None:
    """One row per slice, the three gaps side by side with their intervals, a line at 0 (no difference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slices = list(dict.fromkeys(r["slice"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.7 * len(slices)))
    for k, (_, _, gap) in enumerate(FIDELITY_GAPS):
        mine = [r for r in rows if r["gap"] == gap]
        y = [slices.index(r["slice"]) + 0.22 * (k - 1) for r in mine]
        x = [r["mean"] for r in mine]
        err = [[r["mean"] - r["low"] for r in mine], [r["high"] - r["mean"] for r in mine]]
        ax.errorbar(x, y, xerr=err, fmt="o" if k == 0 else ".", capsize=3, label=gap,
                    linewidth=2 if k == 0 else 1)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(slices)), [f"{s} (n={max(r['n'] for r in rows if r['slice'] == s)})" for s in slices])
    ax.invert_yaxis()
    ax.set(xlabel="paired final-loss difference, nats (95% interval over seeds; < 0: lower loss)",
           title="Training fidelity: 4/6 against NVFP4 and both against bf16")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _gap(e: dict | None) -> str:
    """A paired difference as compare.md writes it: signed, 4 decimals, its interval where n >= 2, and n."""
    if not e:
        return "-"
    if e.get("low") is None:
        return f"{e['mean']:+.4f} (n={e['n']})"
    return f"{e['mean']:+.4f} [{e['low']:+.4f}, {e['high']:+.4f}] (n={e['n']})"


def _excludes_zero(e: dict | None) -> bool:
    return bool(e) and e.get("low") is not None and (e["low"] > 0 or e["high"] < 0)


def fidelity_slice(path: Path) -> dict:
    """One slice's compare.json as the verdict table reads it: {"main": [(comparison, estimate)] (4/6 - nvfp4,
    nvfp4 - bf16, 4/6 - bf16), "bounds": [(comparison, estimate)] (a variant "<base> <suffix>" against its base
    variant, e.g. the scale-bound variants "nvfp4 B256 - nvfp4"), "family": [{comparison, p, holm, estimate}]}:
    the paired intervals of compare's Holm family plus the bound comparisons it lacks, Holm's step-down redone over
    all of them (family-wise 5%). Comparisons are named by compare's variant names, as compare.json names them."""
    from titan_fp4six.compare.stats import Estimate, holm, mean_interval, paired_p

    data = json.loads(path.read_text())
    variants = {v["name"]: v for v in data["variants"]}
    main = [(f"{name} - {'nvfp4' if key == 'gap_to_nvfp4' else 'bf16'}", variants.get(name, {}).get(key))
            for name, key, _ in FIDELITY_GAPS]
    finals = {}
    for run in data["runs"]:
        if run["status"] == "ok":
            finals.setdefault(run["variant"], {})[run["seed"]] = run["final"]
    bounds = []
    for name in variants:
        base = name.rsplit(" ", 1)[0]
        if base != name and base in variants and base != "bf16":
            seeds = sorted(set(finals.get(name, {})) & set(finals.get(base, {})))
            if seeds:
                e = mean_interval([finals[name][s] - finals[base][s] for s in seeds])
                bounds.append((f"{name} - {base}", vars(e)))
    tests = [dict(t) for t in data.get("family", [])]
    known = {t["comparison"] for t in tests}
    for label, e in bounds:
        if label not in known and e.get("sd") is not None:
            tests.append({"comparison": label, "mean": e["mean"], "n": e["n"], "p": paired_p(Estimate(**e))})
    estimates = {label: e for label, e in bounds}
    estimates.update({f"{name} - {base}": variants[name].get(key) for name in variants
                      for base, key in (("bf16", "gap_to_bf16"), ("nvfp4", "gap_to_nvfp4"))})
    for t, kept in zip(tests, holm([t["p"] for t in tests])):
        t["holm"], t["estimate"] = kept, estimates.get(t["comparison"])
    return {"main": main, "bounds": bounds, "family": tests}


def _verdict(row: list[tuple[str, dict | None]], family: list[dict]) -> str:
    """"not distinguishable" when every interval of the row covers 0; else each one that does not, with its p and
    whether Holm's step-down over the slice's intervals keeps it."""
    tests = {t["comparison"]: t for t in family}
    notes = []
    for comparison, e in row:
        if _excludes_zero(e):
            t = tests.get(comparison)
            held = "" if t is None else (f" (p = {t['p']:.2g}), {'kept' if t['holm'] else 'not kept'} by Holm "
                                        f"over the slice's {len(family)} intervals")
            notes.append(f"{comparison}: {'lower' if e['high'] < 0 else 'higher'}{held}")
    return "; ".join(notes) if notes else "not distinguishable"


def fidelity_verdicts(study: Path) -> str:
    """The verdict table: per slice with a compare.json under `study` (FIDELITY_SLICES order), its three paired
    gaps and a verdict, a row for its bound comparisons where it has any, then every other paired interval of a
    slice that excludes 0 on its own."""
    lines = ["| slice | 4/6 - NVFP4, paired final-loss difference [95% CI] | NVFP4 - bf16 | 4/6 - bf16 | verdict |",
             "| --- | --- | --- | --- | --- |"]
    others = []
    for name, label in FIDELITY_SLICES.items():
        path = study / name / "compare.json"
        if not path.exists():
            continue
        s = fidelity_slice(path)
        shown = {c for c, _ in s["main"] + s["bounds"]}
        lines.append(f"| {label} | " + " | ".join(_gap(e) for _, e in s["main"])
                     + f" | {_verdict(s['main'], s['family'])} |")
        if s["bounds"]:
            gaps = "; ".join(f"{b}: {_gap(e)}" for b, e in s["bounds"])
            lines.append(f"| {label}, variants against their base | {gaps} | | | "
                         f"{_verdict(s['bounds'], s['family'])} |")
        for t in s["family"]:
            if t["comparison"] not in shown and _excludes_zero(t.get("estimate")):
                others.append(f"{label}: {t['comparison']} {_gap(t['estimate'])}, p = {t['p']:.2g}, "
                              f"{'kept' if t['holm'] else 'not kept'} by Holm over the slice's {len(s['family'])} "
                              "intervals")
    lines += ["", "Negative: lower loss. Verdict: \"not distinguishable\" when the row's intervals all cover 0; else "
              "each interval that does not, with its p and whether Holm's step-down over the slice's paired "
              "intervals (family-wise 5%) keeps it."]
    if others:
        lines += ["", "Other paired intervals that exclude 0 on their own:", *(f"- {o}" for o in others)]
    return "\n".join(lines) + "\n"


def cmd_fidelity(args):
    """The forest plot (OUT/verdicts.png, or with --docs docs/fidelity/verdicts.png); --docs also writes the
    verdict table and each slice's compare.md into their sections of docs/results/fidelity.md."""
    rows = fidelity_intervals(args.out)
    if not rows:
        raise SystemExit(f"no slice under {args.out} has a compare.json with paired intervals "
                         f"(slices: {', '.join(FIDELITY_SLICES)})")
    fidelity_plot(rows, (DOCS / "fidelity" if args.docs else args.out) / "verdicts.png")
    for r in rows:
        print(f"{r['slice']:28} {r['gap']:13} {r['mean']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}] (n={r['n']})")
    if args.docs:
        page = DOCS / "results" / "fidelity.md"
        write_section(page, "fidelity-verdicts", fidelity_verdicts(args.out))
        for name in FIDELITY_SLICES:
            if (args.out / name / "compare.md").is_file():
                write_section(page, name, (args.out / name / "compare.md").read_text())


# --- per-layer: docs/results/fidelity.md's per-layer metrics from `python -m titan_fp4six.fidelity` --------------
# Reads DIR/fidelity.json of each run (one recipe each); one row per recipe: the mean over its converted GEMMs of
# each metric, `NVFP4 / 4/6`.

PER_LAYER_COLUMNS = (("fwd SNR dB", "fwd_snr_db", ".2f"), ("map-to-4", "map4_fraction", ".3f"),
                     ("MSE x", "mse_x", ".3g"), ("MSE w", "mse_w", ".3g"),
                     ("quantized dX cos", "quantized_dx_cos", ".5f"), ("quantized dW cos", "quantized_dw_cos", ".5f"),
                     ("dequantized dX cos", "dequantized_dx_cos", ".5f"),
                     ("dequantized dW cos", "dequantized_dw_cos", ".5f"))


def per_layer_table(records: list[dict]) -> str:
    """One row per fidelity.json record: its recipe, model and GEMM count, then each column's mean over the GEMMs
    as `NVFP4 / 4/6` ("-" where the record lacks the metric)."""
    lines = ["| recipe (model, GEMMs) | " + " | ".join(h for h, _, _ in PER_LAYER_COLUMNS) + " |",
             "| --- |" + " --- |" * len(PER_LAYER_COLUMNS)]
    for r in records:
        cells = []
        for _, key, fmt in PER_LAYER_COLUMNS:
            values = [r["mean"].get(f"{key}/{v}") for v in ("nvfp4", "four_over_six")]
            cells.append("-" if None in values else " / ".join(format(v, fmt) for v in values))
        lines.append(f"| `{Path(r['config']).name}` ({r['model']} {r['flavor']}, {len(r['gemms'])}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cmd_per_layer(args):
    records = read_records(args.dirs, "fidelity.json", "python -m titan_fp4six.fidelity ... --out DIR")
    table = per_layer_table(records)
    print(table)
    if args.docs:
        write_section(DOCS / "results" / "fidelity.md", "per-layer", table)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("quant-error", help="relative MSE of NVFP4 and every 4/6 setting, synthetic and captured")
    s.add_argument("--out", type=Path, required=True, help="folder for quant_error.json/.md and the PNGs")
    s.add_argument("--no-capture", action="store_true", help="synthetic distributions only")
    s.add_argument("--models", default="deepseek_v3:debugmodel,qwen3:debugmodel_moe")
    s.add_argument("--steps", type=int, default=20, help="training steps of the capture run")
    s.add_argument("--capture-steps", default="1,10,20", help="steps at which tensors are captured")
    s.add_argument("--batch", type=int, default=2)
    s.add_argument("--seq-len", type=int, default=256)
    s.add_argument("--max-rows", type=int, default=512, help="rows kept per captured tensor (multiple of 16)")
    s.add_argument("--synthetic-size", type=int, default=1024)
    s.add_argument("--docs", action="store_true", help=DOCS_HELP + " (quant_error.md, section quant-error-gpu "
                   "or quant-error-cpu by the machine; the records as quant_error_{gpu,cpu}.json.gz, on a GPU the "
                   "figures)")
    s.set_defaults(run=cmd_quant_error)
    s = sub.add_parser("rl", help="docs/results/rl.md's table and figures from the runs of scripts/rl_runs.sh")
    s.add_argument("out", type=Path, help="the OUT_DIR given to scripts/rl_runs.sh (the figures go there)")
    s.add_argument("--docs", action="store_true", help=DOCS_HELP + " (rl.md, section rl-h200; the figures beside it)")
    s.set_defaults(run=cmd_rl)
    s = sub.add_parser("fidelity", help="the verdict and slice tables of docs/results/fidelity.md and "
                       "docs/fidelity/verdicts.png, from the slices of scripts/fidelity_study.sh")
    s.add_argument("out", type=Path, help="the OUT_DIR given to scripts/fidelity_study.sh (the figure goes there)")
    s.add_argument("--docs", action="store_true", help=DOCS_HELP + " (fidelity.md, the verdict section and one "
                   "per slice from its compare.md; the figure as docs/fidelity/verdicts.png)")
    s.set_defaults(run=cmd_fidelity)
    s = sub.add_parser("per-layer", help="docs/results/fidelity.md's per-layer metrics from the fidelity.json of "
                       "`python -m titan_fp4six.fidelity` runs")
    s.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="a --out folder of titan_fp4six.fidelity (or "
                   "its fidelity.json), one per recipe, in the table's order")
    s.add_argument("--docs", action="store_true", help=DOCS_HELP + " (fidelity.md, section per-layer)")
    s.set_defaults(run=cmd_per_layer)
    args = p.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
