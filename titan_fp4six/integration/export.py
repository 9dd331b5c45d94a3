"""A torchtitan checkpoint of a recipe's model as a Hugging Face folder that inference engines and transformers
load: config.json (Qwen3 / Qwen3-MoE), the recipe's tokenizer files, model.safetensors (torchtitan's own
state-dict adapter names the tensors).

    python -m titan_fp4six.export --job.config_file RECIPE --checkpoint DIR --out OUT [--format bf16]
        [--section.key value ...]

--format bf16: every weight as the trainer holds it, cast to bf16 (a plain HF checkpoint; the converted modules'
weights are high-precision weights in training too). DIR is a torchtitan checkpoint folder (a `step-N` DCP folder;
model-only or full). Everything is checked before anything is written: the model family and routing the HF classes
compute, a router bias (`moe.expert_bias`, learned when load balancing is on) that HF Qwen3-MoE cannot hold,
checkpoint tensors that do not fit the recipe's model, an existing non-empty OUT.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torchtitan.config import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec

from . import job_config as _job_config  # noqa: F401  (registers the plugin's sections and flavors)
from .flavors import check_flavor
from .hf_config import check_hf_equivalent, qwen3_config

FORMATS = ("bf16",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_UNMAPPED = ("moe.expert_bias", "moe.tokens_per_expert")
"""torchtitan model state the HF names do not hold (checked: the bias must be zero; the counts are statistics)."""


def load_checkpoint(job_config, spec, args, checkpoint: Path) -> dict[str, torch.Tensor]:
    """The recipe's model state (FP32, on the CPU) read from a torchtitan DCP folder."""
    with torch.device("cpu"):
        model = spec.model_cls(args)
    state = {k: v.float() for k, v in model.state_dict().items()}
    if not (checkpoint / ".metadata").exists():
        raise ValueError(f"--checkpoint {checkpoint}: not a torchtitan DCP folder (no .metadata); pass a step-N folder")
    try:
        dcp.load(state, checkpoint_id=str(checkpoint))
    except (Exception, CheckpointException) as e:  # a missing key or another model's shape (DCP's BaseException)
        raise ValueError(f"--checkpoint {checkpoint} does not hold the model of {job_config.job.config_file} "
                         f"(model.name={job_config.model.name!r}, flavor={job_config.model.flavor!r}): {e}") from e
    return state


def hf_state(spec, state: dict[str, torch.Tensor], args, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    biased = [k for k, v in state.items() if k.endswith("moe.expert_bias") and bool(v.any())]
    if biased:
        raise ValueError(f"the checkpoint's routers have a learned bias ({biased[0]}, ...: load balancing, "
                         "moe_args.load_balance_coeff) that Hugging Face Qwen3-MoE cannot hold: the exported model "
                         "would route differently")
    adapter = spec.state_dict_adapter(args, None)
    kept = {k: v for k, v in state.items() if not k.endswith(_UNMAPPED)}
    return {k: v.to(dtype).contiguous() for k, v in adapter.to_hf(kept).items()}


def export(job_config, checkpoint: Path, out: Path, fmt: str) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}; valid: {', '.join(FORMATS)}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; pass a new folder")
    check_flavor(job_config)
    spec = get_train_spec(job_config.model.name)
    args = spec.model_args[job_config.model.flavor]
    args.update_from_config(job_config)
    check_hf_equivalent(job_config.model.name, args)
    assets = Path(job_config.model.hf_assets_path)
    missing = [f for f in TOKENIZER_FILES if not (assets / f).exists()]
    if missing:
        raise ValueError(f"model.hf_assets_path={str(assets)!r} lacks the tokenizer files {missing}")
    tensors = hf_state(spec, load_checkpoint(job_config, spec, args, checkpoint), args, torch.bfloat16)
    tokenizer = json.loads((assets / "tokenizer_config.json").read_text())
    vocab = json.loads((assets / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])} | vocab["model"]["vocab"]
    config = qwen3_config(args, architecture=None, max_positions=args.max_seq_len, eos_id=ids[tokenizer["eos_token"]],
                          bos_id=ids[tokenizer["bos_token"]], dtype="bfloat16")
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(assets / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m titan_fp4six.export", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a torchtitan DCP folder (step-N)")
    parser.add_argument("--out", type=Path, required=True, help="a new (or empty) folder")
    parser.add_argument("--format", default="bf16", help=f"one of {', '.join(FORMATS)}")
    ours, rest = parser.parse_known_args(argv)
    if "--job.config_file" not in rest:
        parser.error("--job.config_file RECIPE.toml is required (the recipe that trained the checkpoint)")
    job_config = ConfigManager().parse_args(rest)
    out = export(job_config, ours.checkpoint, ours.out, ours.format)
    print(f"wrote {out}: config.json, {', '.join(TOKENIZER_FILES)}, model.safetensors ({ours.format})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
