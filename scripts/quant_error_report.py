"""Quantization-error report: relative MSE of standard NVFP4 and four-over-six variants, and the map-to-4 share.

Why: users choose the four-over-six knobs (err_mode, scale_bound, weight block, per-tensor vs row scaling) by
what each costs in accuracy; this measures it on synthetic distributions and on activations, weights and output
gradients captured with hooks from a short training run of torchtitan's debug MoE models.

    python -m scripts.quant_error_report --out docs          # markdown table on stdout, PNGs and JSON in docs/
    python -m scripts.quant_error_report --no-capture --out /tmp/r  # synthetic distributions only (seconds)

relative MSE = sum((dequant(quant(x)) - x)^2) / sum(x^2), per tensor, then averaged over the tensors of a source.
Every quantization goes through the public numerics API (bit-exact reference quantizers).
"""

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from scripts.capture_tensors import BLOCK, Sample, capture_training_tensors
from titan_fp4six import four_over_six_quantize, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax
from titan_fp4six.modules.fidelity import relative_mse


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


def plot(summary: dict[str, dict[str, tuple[float, float]]], records: list[dict], out: Path,
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for quant_error.json and the PNGs")
    p.add_argument("--no-capture", action="store_true", help="synthetic distributions only")
    p.add_argument("--models", default="deepseek_v3:debugmodel,qwen3:debugmodel_moe")
    p.add_argument("--steps", type=int, default=20, help="training steps of the capture run")
    p.add_argument("--capture-steps", default="1,10,20", help="steps at which tensors are captured")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-rows", type=int, default=512, help="rows kept per captured tensor (multiple of 16)")
    p.add_argument("--synthetic-size", type=int, default=1024)
    args = p.parse_args(argv)
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
    (args.out / "quant_error.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    (args.out / "quant_error.md").write_text(table + "\n")
    for path in plot(summary, records, args.out):
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
