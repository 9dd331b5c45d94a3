"""A torchtitan checkpoint of a recipe's model as a Hugging Face folder that inference engines and transformers
load: config.json (Qwen3 / Qwen3-MoE), the recipe's tokenizer files, model.safetensors (torchtitan's own
state-dict adapter names the tensors).

    python -m titan_fp4six.export --job.config_file RECIPE --checkpoint DIR --out OUT [--format bf16|nvfp4]
        [--section.key value ...]                                   (the tool: titan_fp4six/export.py)

--format bf16: every weight as the trainer holds it, cast to bf16 (a plain HF checkpoint; the converted modules'
weights are high-precision weights in training too).
--format nvfp4: every module the recipe's converters convert holds its weight as the training forward quantizes
it (the weight cast to training.mixed_precision_param, then the module's recipe: its exact 4/6 codes and scales)
in ModelOpt's NVFP4 tensors (ops/checkpoint.py says why that layout); everything else in bf16, listed in
quantization_config's `ignore`. quantization_config (quant_method "four_over_six", the vLLM plugin's) names every
quantized module with the knobs its forward needs. vLLM runs a layer's q/k/v (and a dense MLP's gate/up)
projections as one fused layer with one quantization method, so they must be converted alike; each keeps its
own global scale (the plugin applies them per partition, where stock loaders take their max).

DIR is a torchtitan checkpoint folder (a `step-N` DCP folder; model-only or full). OUT is checked and claimed first
(CLAIM), then the launchers' config checks run, then everything else before anything is written: the model family
and routing the HF classes compute, the tokenizer's bos/eos, a router bias (`moe.expert_bias`, learned when load
balancing is on) that HF Qwen3-MoE cannot hold, checkpoint tensors that do not fit the recipe's model, missing or
truncated shards, non-finite weights, fused projections converted differently, a quantized module vLLM cannot
quantize (the LM head), an nvfp4 export that would quantize nothing. A refused export removes what it made.
"""

from titan_fp4six.integration.version import require

require("0.2", "python -m titan_fp4six.export", "torchtitan 0.2.x: export runs next to torchtitan 0.2 only (bash scripts/setup.sh)")  # before the torchtitan 0.2 imports below

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.protocols.model_converter import build_model_converters
from torchtitan.protocols.train_spec import get_train_spec

from ..modules.experts import _FourOverSixExperts
from ..modules.linear import FourOverSixLinear
from ..ops import quantize_grouped_weight, quantize_linear_weight
from ..ops.checkpoint import QUANT_METHOD, serving_knobs, weight_tensors
from . import job_config as _job_config  # noqa: F401  (registers the plugin's sections and flavors)
from .checks import check_job_config
from .converters import KINDS, configured_section
from .hf_config import check_hf_equivalent, qwen3_config, tokenizer_ids
from .sections import FAMILY

FORMATS = ("bf16", "nvfp4")
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Projections vLLM loads into one layer (qkv_proj, gate_up_proj) with one quantization method."""
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
    check_checkpoint_files(job_config, checkpoint, state)
    try:
        dcp.load(state, checkpoint_id=str(checkpoint))
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise ValueError(f"--checkpoint {checkpoint}: its .metadata lists this model's tensors but they could not be "
                         f"read ({type(e).__name__}: {str(e)[:300]}); a shard is corrupt: copy the step-N folder "
                         "again or pick another step") from e
    bad = [k for k, v in state.items() if not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(f"--checkpoint {checkpoint} holds non-finite weights (NaN/Inf) in {len(bad)} tensors "
                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): the run diverged before this "
                         "step; export an earlier step")
    return state


def check_checkpoint_files(job_config, checkpoint: Path, state: dict[str, torch.Tensor]) -> None:
    """Before reading: the .metadata must list the model's tensors at the model's shapes (else: another model), and
    every shard file it names must exist and be as long as the metadata says (else: an incomplete copy)."""
    try:
        metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    except Exception as e:
        raise ValueError(f"--checkpoint {checkpoint}: its .metadata cannot be read ({type(e).__name__}: {e}); the "
                         "folder is truncated or not a torchtitan checkpoint") from e
    listed = metadata.state_dict_metadata
    missing = [k for k in state if k not in listed]
    shapes = [f"{k} {tuple(listed[k].size)} (the model's {tuple(v.shape)})" for k, v in state.items()
              if k in listed and tuple(getattr(listed[k], "size", v.shape)) != tuple(v.shape)]
    if missing or shapes:
        what = f"{len(missing)} of its tensors are missing ({', '.join(missing[:3])}...)" if missing else \
            f"tensors of other shapes: {'; '.join(shapes[:3])}"
        raise ValueError(f"--checkpoint {checkpoint} does not hold the model of {job_config.job.config_file} "
                         f"(model.name={job_config.model.name!r}, flavor={job_config.model.flavor!r}): {what}")
    needed: dict[str, int] = {}
    for index, info in (metadata.storage_data or {}).items():
        if index.fqn in state:
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = checkpoint / name
        if not path.is_file():
            raise ValueError(f"--checkpoint {checkpoint}: shard {name} is missing (its .metadata lists it): the "
                             "folder is an incomplete copy; copy the step-N folder again or pick another step")
        if path.stat().st_size < size:
            raise ValueError(f"--checkpoint {checkpoint}: shard {name} is truncated ({path.stat().st_size} bytes, "
                             f"its .metadata needs {size}); copy the step-N folder again or pick another step")


def hf_state(spec, state: dict[str, torch.Tensor], args, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    biased = [k for k, v in state.items() if k.endswith("moe.expert_bias") and bool(v.any())]
    if biased:
        raise ValueError(f"the checkpoint's routers have a learned bias ({biased[0]}, ...: load balancing, "
                         "moe_args.load_balance_coeff) that Hugging Face Qwen3-MoE cannot hold: the exported model "
                         "would route differently")
    adapter = spec.state_dict_adapter(args, None)
    kept = {k: v for k, v in state.items() if not k.endswith(_UNMAPPED)}
    return {k: v.to(dtype).contiguous() for k, v in adapter.to_hf(kept).items()}


def converted_model(job_config, spec, args, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The recipe's model on the CPU holding `state`, converted by the recipe's converters (which modules they
    convert, with which recipe), its quantizers on the CPU's implementations (the same bytes everywhere)."""
    for kind in KINDS:
        cfg = configured_section(job_config, kind)
        if cfg is not None:
            cfg.quantizer, cfg.gemm = "auto", "emulated"
    with torch.device("cpu"):
        model = spec.model_cls(args)
    build_model_converters(job_config, None).convert(model)
    model.load_state_dict(state)
    return model


def _quantized_weights(model: torch.nn.Module, dtype: torch.dtype):
    """(torchtitan state-dict key, module fqn, its recipe, QuantizedWeight) of every converted module's weight, as
    the training forward quantizes it from the weight cast to `dtype`; expert weights' codes as (E, N, K/2)."""
    with torch.no_grad():
        for fqn, m in model.named_modules():
            if isinstance(m, FourOverSixLinear):
                yield f"{fqn}.weight", fqn, m.recipe, quantize_linear_weight(m.weight.to(dtype), recipe=m.recipe)
            elif isinstance(m, _FourOverSixExperts):
                for name in ("w1", "w2", "w3"):
                    w = getattr(m, name).to(dtype)
                    yield f"{fqn}.{name}", fqn, m.recipe, quantize_grouped_weight(w.transpose(-2, -1), recipe=m.recipe)


def _hf_module(hf_weight: str) -> str:
    """model.layers.1.mlp.experts.3.up_proj.weight -> model.layers.1.mlp.experts; ...q_proj.weight -> ...q_proj."""
    module = hf_weight.removesuffix(".weight")
    return re.sub(r"(\.mlp\.experts)\.\d+\..*$", r"\1", module)


def nvfp4_state(job_config, spec, args, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """(the HF tensors of --format nvfp4, config.json's quantization_config)."""
    tensors = hf_state(spec, state, args, torch.bfloat16)
    adapter = spec.state_dict_adapter(args, None)
    dtype = TORCH_DTYPE_MAP[job_config.training.mixed_precision_param]
    modules: dict[str, dict] = {}
    for key, fqn, recipe, qw in _quantized_weights(converted_model(job_config, spec, args, state), dtype):
        experts = qw.amax.numel() if qw.amax.dim() else 0
        codes = qw.codes.view(experts, -1, qw.codes.shape[-1]) if experts else qw.codes
        for hf_name in adapter.to_hf({key: codes}):
            module = hf_name.removesuffix(".weight")
            if module == "lm_head" or module.endswith("embed_tokens"):
                raise ValueError(f"{fqn} is converted, but vLLM runs {module} unquantized (no quantization "
                                 "method reaches it): keep it in bf16 (filter_fqns)")
            e = int(re.search(r"\.experts\.(\d+)\.", hf_name).group(1)) if experts else None
            rows = slice(None) if e is None else slice(e * codes.shape[1], (e + 1) * codes.shape[1])
            amax = qw.amax if e is None else qw.amax[e]
            del tensors[hf_name]
            for suffix, t in weight_tensors(qw.codes[rows], qw.scales[rows], amax, recipe.scale_bound).items():
                tensors[f"{module}.{suffix}"] = t
            modules[_hf_module(hf_name)] = serving_knobs(recipe)
    if not modules:
        raise ValueError(f"--format nvfp4: the recipe's converters convert no module (model.converters="
                         f"{job_config.model.converters}), so the folder would be bf16 labelled nvfp4; export --format "
                         "bf16, or fix the recipe's four_over_six sections")
    check_fused_alike(modules, tensors)
    ignore = sorted({_hf_module(k) for k in tensors if k.endswith(".weight") and tensors[k].dim() == 2
                     and "norm" not in k and "embed_tokens" not in k} - set(modules))
    return tensors, {"quant_method": QUANT_METHOD, "format": "nvfp4", "tensors": "modelopt", "group_size": 16,
                     "weights_quantized_from": job_config.training.mixed_precision_param,
                     "modules": dict(sorted(modules.items())), "ignore": ignore}


def check_fused_alike(modules: dict[str, dict], tensors: dict[str, torch.Tensor]) -> None:
    """Projections vLLM fuses (FUSED) must all be quantized with the same knobs, or all stay bf16."""
    for group in FUSED:
        suffix = f".{group[0]}.weight"
        for base in sorted(k.removesuffix(suffix) for k in tensors if k.endswith(suffix)):
            knobs = [modules.get(f"{base}.{g}") for g in group]
            if any(k != knobs[0] for k in knobs):
                described = ", ".join(f"{g}: {'bf16' if k is None else k}" for g, k in zip(group, knobs))
                raise ValueError(f"vLLM runs {', '.join(group)} of {base} as one fused layer with one quantization "
                                 f"method, but the recipe quantizes them differently ({described}): convert all of "
                                 "them alike or none (filter_fqns / fqns)")


CLAIM = ".export-in-progress"
"""Created in --out with O_EXCL before any work and removed when the folder is complete: two exports into one folder
cannot both write, and a killed export leaves it behind (the folder is then refused: not empty)."""


def claim_out(out: Path) -> Path | None:
    """Make --out (or take it empty) and claim it, before anything is read: an unusable --out (under a file, a
    dangling symlink, a read-only place) or a busy one is refused first. Returns the topmost folder created."""
    if out.is_symlink() and not out.exists():
        raise ValueError(f"--out {out} is a dangling symlink (to {os.readlink(out)}); pass a folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder; pass a new folder")
    busy = f"--out {out} exists and is not empty (another export is writing there, or was killed); pass a new folder"
    if (out / CLAIM).exists():
        raise ValueError(busy)
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; pass a new folder")
    created = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        os.close(os.open(out / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise ValueError(busy) from None
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({type(e).__name__}: {e.strerror}); pass a folder you "
                         "can write") from e
    if any(p.name != CLAIM for p in out.iterdir()):  # another export finished between the check and the claim
        (out / CLAIM).unlink()
        raise ValueError(f"--out {out} exists and is not empty; pass a new folder")
    return created


def _release(out: Path, created: Path | None) -> None:
    """After a refusal: remove what this export wrote and the folders it made."""
    for name in (CLAIM, "model.safetensors", "config.json", *TOKENIZER_FILES):
        (out / name).unlink(missing_ok=True)
    if created is not None:
        for folder in (out, *out.parents):
            try:
                folder.rmdir()
            except OSError:
                break
            if folder == created:
                break


def export(job_config, checkpoint: Path, out: Path, fmt: str) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}; valid: {', '.join(FORMATS)}")
    created = claim_out(out)
    try:
        _export(job_config, checkpoint, out, fmt)
    except BaseException:
        _release(out, created)
        raise
    (out / CLAIM).unlink()
    return out


def _export(job_config, checkpoint: Path, out: Path, fmt: str) -> None:
    check_job_config(job_config)  # the launchers' checks: converter names, sections without converters, flavor
    if fmt == "nvfp4" and not any(f"quantize.{kind}.{FAMILY}" in job_config.model.converters for kind in KINDS):
        raise ValueError(f"--format nvfp4: model.converters={job_config.model.converters} lists no four_over_six "
                         "converter, so nothing would be quantized; export --format bf16, or the 4/6 recipe that "
                         "trained the checkpoint")
    spec = get_train_spec(job_config.model.name)
    args = spec.model_args[job_config.model.flavor]
    args.update_from_config(job_config)
    check_hf_equivalent(job_config.model.name, args)
    assets = Path(job_config.model.hf_assets_path)
    missing = [f for f in TOKENIZER_FILES if not (assets / f).exists()]
    if missing:
        raise ValueError(f"model.hf_assets_path={str(assets)!r} lacks the tokenizer files {missing}")
    _, bos, eos = tokenizer_ids(assets)
    state = load_checkpoint(job_config, spec, args, checkpoint)
    quantization = None
    if fmt == "nvfp4":
        tensors, quantization = nvfp4_state(job_config, spec, args, state)
    else:
        tensors = hf_state(spec, state, args, torch.bfloat16)
    config = qwen3_config(args, architecture=None, max_positions=args.max_seq_len, eos_id=eos, bos_id=bos,
                          dtype="bfloat16")
    if quantization is not None:
        config["quantization_config"] = quantization
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(assets / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
