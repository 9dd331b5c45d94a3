"""``python -m titan_fp4six.fidelity``: per-layer fidelity of plain NVFP4 and four-over-six on one batch, no training.

    python -m titan_fp4six.fidelity --job.config_file configs/<recipe>.toml [--checkpoint DIR]
        [--steps-of-training N] [--out DIR] [--section.key value ...]

Why: whether 4/6 trains closer to bf16 than NVFP4 is lost in seed noise at this size; these deterministic,
per-GEMM metrics (titan_fp4six/modules/fidelity/ defines them) show where each format loses. The recipe's model
is built through torchtitan's Trainer (the recipe's converters say which layers are measured and with which
recipe), optionally loaded from a checkpoint folder and/or trained N steps, then one batch of the recipe's data
runs forward and backward as the bf16 twin would (converted modules compute their unconverted forward) while
each converted GEMM is measured on its real x, W and dY. Prints a markdown table (one row per GEMM, then the
mean); writes fidelity.json and fidelity.png to --out (default <dump_folder>/fidelity). torch.compile is off
and debug.deterministic on (seed 0 unless the recipe sets one): the same command gives the same numbers.
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

from titan_fp4six.modules.fidelity import BACKWARD_MODES, VARIANTS, FidelityCapture, converted_modules, mean_metrics

LABELS = {"nvfp4": "NVFP4", "four_over_six": "4/6"}
ROLES = ("x", "w", "dy", "dyT", "xT", "wT")
COLUMNS = ([("fwd SNR dB", "fwd_snr_db", ".2f"), ("map4", "map4_fraction", ".3f")]
           + [(f"MSE {role}", f"mse_{role}", ".3g") for role in ROLES]
           + [(f"{mode} d{g.upper()} {what}", f"{mode}_d{g}_{key}", fmt) for mode in BACKWARD_MODES[:2]
              for g in ("x", "w") for what, key, fmt in (("cos", "cos", ".5f"), ("norm", "norm_ratio", ".4f"))])
"""(header, metric, format) of the table's columns; each cell holds NVFP4 / 4/6. The high_precision backward,
which multiplies the unquantized operands, gets one summary line instead (every value is in the JSON)."""


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """One row per GEMM and a last row with the mean over them; each cell `NVFP4 / 4/6`, "-" where the metric
    does not apply (a column no GEMM has is left out)."""
    rows = [*results.items(), ("mean", mean_metrics(results))]

    def cell(metrics, key, fmt):
        values = [metrics.get(f"{key}/{v}") for v in VARIANTS]
        return "-" if values[0] is None else " / ".join(format(v, fmt) for v in values)

    columns = [c for c in COLUMNS if any(f"{c[1]}/{VARIANTS[0]}" in m for m in results.values())]
    lines = ["| GEMM | " + " | ".join(h for h, _, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(m, key, fmt) for _, key, fmt in columns) + " |" for name, m in rows]
    hp = {kind: [v for m in results.values() for k, v in m.items() if k.startswith(f"high_precision_d") and kind in k]
          for kind in ("cos", "norm_ratio")}
    lines.append(f"\nhigh_precision backward, all GEMMs and both formats: cos of dX and dW >= {min(hp['cos']):.6f}, "
                 f"norm ratios in [{min(hp['norm_ratio']):.6f}, {max(hp['norm_ratio']):.6f}]")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, float]], path: Path, title: str) -> None:
    """Four panels over the GEMMs, NVFP4 and 4/6 side by side: forward SNR, x and w quantization MSE, and
    1 - cos of dX and dW for the quantized and dequantized backwards."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    pos = list(range(len(names)))
    panels = [("forward output SNR (dB)", ["fwd_snr_db"], False),
              ("relative quantization MSE", ["mse_x", "mse_w"], True),
              ("1 - cos(dX)", [f"{m}_dx_cos" for m in BACKWARD_MODES[:2]], True),
              ("1 - cos(dW)", [f"{m}_dw_cos" for m in BACKWARD_MODES[:2]], True)]
    fig, axes = plt.subplots(4, 1, figsize=(max(8.0, 0.45 * len(names) + 3), 14), sharex=True)
    for ax, (label, keys, log) in zip(axes, panels):
        for i, key in enumerate(keys):
            for j, variant in enumerate(VARIANTS):
                values = [results[n].get(f"{key}/{variant}", math.nan) for n in names]
                if key.endswith("_cos"):
                    values = [1 - v for v in values]
                ax.plot(pos, values, marker="os^v"[2 * i + j], linestyle="-" if j else "--",
                        label=f"{LABELS[variant]} {key}")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1].set_xticks(pos, names, rotation=70, ha="right", fontsize=7)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m titan_fp4six.fidelity", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--checkpoint", metavar="DIR", help="torchtitan checkpoint folder (its step-N "
                        "subfolders; the latest, or --checkpoint.load_step) to load the model state from")
    parser.add_argument("--steps-of-training", type=int, default=0, metavar="N",
                        help="train the recipe N steps before measuring (default 0)")
    parser.add_argument("--out", metavar="DIR", help="where fidelity.json and fidelity.png go "
                        "(default <job.dump_folder>/fidelity)")
    ours, rest = parser.parse_known_args(argv)
    if ours.steps_of_training < 0:
        parser.error(f"--steps-of-training={ours.steps_of_training}; it must be >= 0")
    if not any(a == "--job.config_file" or a.startswith("--job.config_file=") for a in rest):
        parser.error("--job.config_file RECIPE.toml is required: the four-over-six recipe whose modules to measure")
    if ours.out:
        try:
            writable_folder(Path(ours.out))
        except OSError as e:
            parser.error(f"--out {ours.out}: cannot write fidelity.json there ({e}); pass a folder you can write")
    return ours, rest


def writable_folder(out: Path) -> Path:
    """out, created if missing, checked writable before anything is measured (an OSError otherwise)."""
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"{out} is not writable")
    return out


def main(argv: list[str] | None = None) -> int:
    ours, rest = _parse(argv)
    from titan_fp4six.train import check_world_size, prepare_process

    prepare_process()
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    from titan_fp4six.integration.converters import check_converter_names

    init_logger()
    config = ConfigManager().parse_args(rest)
    config.compile.enable = False  # the capture hooks run eagerly
    config.debug.deterministic = True
    config.debug.seed = 0 if config.debug.seed is None else config.debug.seed
    if ours.checkpoint:
        config.checkpoint.enable, config.checkpoint.folder = True, os.path.abspath(ours.checkpoint)
    check_converter_names(config)
    check_world_size(config.parallelism, int(os.environ["WORLD_SIZE"]))
    out = Path(ours.out) if ours.out else writable_folder(Path(config.job.dump_folder) / "fidelity")  # --out: _parse
    trainer = Trainer(config)
    try:
        if ours.checkpoint:
            load_checkpoint(trainer.checkpointer, ours.checkpoint, config.checkpoint.load_step)
        modules = [m for part in trainer.model_parts for m in converted_modules(part)]
        if not modules:
            raise ValueError(f"{config.job.config_file}: model.converters={config.model.converters} converted no "
                             "module, so there is nothing to measure; use a four-over-six recipe")
        batches = trainer.batch_generator(trainer.dataloader)
        for step in range(ours.steps_of_training + 1):
            trainer.step += 1
            if step == ours.steps_of_training:  # the measured step: its forward and backward, bf16 twin
                with FidelityCapture(modules, unquantized_forward=True) as capture:
                    trainer.train_step(batches)
                results = capture.take()
                if not results:
                    raise ValueError("no converted module ran a forward and backward with gradient on the batch")
            else:
                trainer.train_step(batches)
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    report(results, {fqn: str(m.recipe) for fqn, m in modules}, config, ours, trainer.step, out)
    return 0


def load_checkpoint(checkpointer, folder: str, step: int) -> None:
    """torchtitan's checkpointer.load of --checkpoint, its failures named: no checkpoint there, or one it cannot
    read (a truncated or corrupt .distcp surfaces as a bare EOFError or unpickling error from inside DCP)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        loaded = checkpointer.load(step=step)
    except (Exception, CheckpointException) as e:  # DCP's own errors derive from BaseException
        raise ValueError(f"--checkpoint {folder}: torchtitan could not read it ({type(e).__name__}: {e}); a "
                         "step-N folder is truncated or corrupt, or holds another model's state") from e
    if not loaded:
        raise ValueError(f"--checkpoint {folder}: no checkpoint there (torchtitan's step-N folders; "
                         f"--checkpoint.load_step={step})")


def report(results: dict[str, dict[str, float]], recipes: dict[str, str], config, ours, step: int, out: Path) -> None:
    """Print the table; write the JSON (per GEMM and mean, every metric) and the plot to `out`."""
    t = config.training
    title = (f"{Path(config.job.config_file).name}: {config.model.name} {config.model.flavor}, "
             f"{t.local_batch_size}x{t.seq_len} tokens, model state after {step - 1} steps"
             f"{f' from {ours.checkpoint}' if ours.checkpoint else ''}")
    print(f"{title}\neach cell: NVFP4 / 4/6 (docs/fidelity_metrics.md)\n\n{markdown_table(results)}")
    record = {"config": config.job.config_file, "model": config.model.name, "flavor": config.model.flavor,
              "checkpoint": ours.checkpoint, "steps_of_training": ours.steps_of_training,
              "tokens": t.local_batch_size * t.seq_len, "variants": LABELS, "recipes": recipes,
              "gemms": results, "mean": mean_metrics(results)}
    (out / "fidelity.json").write_text(json.dumps(record, indent=1))
    plot(results, out / "fidelity.png", title)
    print(f"\nwrote {out / 'fidelity.json'} and {out / 'fidelity.png'}")


if __name__ == "__main__":
    sys.exit(main())
