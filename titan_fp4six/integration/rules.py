"""Which modules a converter section selects, and the checks every converter makes, for both torchtitan versions.

No torchtitan import: the 0.2 converters (converters.py) act on built modules and the 0.3 ones (tt03/converters.py)
on model configs, but they select by the same fqn rules, keep the same bf16 layer window and refuse the same
settings, with the same messages.
"""

import torch

from ..numerics.formats import BLOCK_SIZE as BLOCK
from ..quant.backends import environment_overrides, require_fp4
from ..ops.checks import blockable
from .sections import FAMILY


def fqn_matches(fqn: str, pattern: str) -> bool:
    """True when the dotted parts of `pattern` appear as a contiguous run in those of `fqn`.

    So "experts" matches "layers.3.moe.experts" but not "layers.3.moe.shared_experts", and
    "layers.3" selects that layer's whole subtree.
    """
    parts, want = fqn.split("."), pattern.split(".")
    return any(parts[i:i + len(want)] == want for i in range(len(parts) - len(want) + 1))


def layer_index(fqn: str) -> int | None:
    """Decoder layer number of a module under `layers.<i>`, else None."""
    parts = fqn.split(".")
    for name, nxt in zip(parts, parts[1:]):
        if name == "layers" and nxt.isdigit():
            return int(nxt)
    return None


def bf16_layers(layers: list[int] | None, cfg, section: str, model: str) -> set[int]:
    """Of the decoder layer indices `layers` (stack order; None: `model` has no `layers` stack), the first
    `bf16_first_layers` and the last `bf16_last_layers`."""
    first, last = cfg.bf16_first_layers, cfg.bf16_last_layers
    if not first and not last:
        return set()
    if layers is None:
        raise ValueError(f"{section}.bf16_first_layers/bf16_last_layers need a model with a `layers` stack; "
                         f"{model} has none")
    if first + last > len(layers):
        raise ValueError(f"{section}.bf16_first_layers={first} + {section}.bf16_last_layers={last} exceeds the "
                         f"model's {len(layers)} decoder layers; keep their sum <= {len(layers)}")
    return set(layers[:first]) | set(layers[len(layers) - last:] if last else ())


def unquantizable(in_features: int, out_features: int) -> str | None:
    """Why a Linear of these dims cannot be quantized (both GEMM dims are blocked by 16 somewhere), or None."""
    bad = [f"{name}={n}" for name, n in (("in_features", in_features), ("out_features", out_features))
           if not blockable(n)]
    return f"{' and '.join(bad)} not a multiple of {BLOCK}" if bad else None


def select_linears(linears: list[tuple[str, int, int]], cfg, section: str,
                   keep_layers: set[int]) -> tuple[list[str], list[str]]:
    """The Linears (fqn, in_features, out_features) the section converts, and those left in bf16 for their dims
    ("fqn (why)"); a listed one that cannot convert, an fqns entry matching none, or nothing converted is an error."""
    converted, skipped, hits = [], [], set()
    for fqn, n_in, n_out in linears:
        listed = [p for p in cfg.fqns if fqn_matches(fqn, p)]
        if cfg.fqns and not listed:
            continue
        filtered = [p for p in cfg.filter_fqns if fqn_matches(fqn, p)]
        why = (f"it matches {section}.filter_fqns {filtered}" if filtered
               else "its layer is kept in bf16 (bf16_first_layers/bf16_last_layers)"
               if layer_index(fqn) in keep_layers else unquantizable(n_in, n_out))
        if why is None:
            converted.append(fqn)
            hits.update(listed)
        elif listed:
            raise ValueError(f"{section}.fqns lists {listed} but {fqn} cannot be converted: {why}")
        elif not filtered and layer_index(fqn) not in keep_layers:
            skipped.append(f"{fqn} ({why})")
    missing = [p for p in cfg.fqns if p not in hits]
    if missing:
        raise ValueError(f"{section}.fqns entries {missing} match no nn.Linear in the model")
    if skipped and not converted and not cfg.allow_empty:
        raise ValueError(f"{section} converted no nn.Linear: every one it selects has a dimension that NVFP4 cannot "
                         f"block ({len(skipped)}: {'; '.join(skipped[:4])}{'; ...' if len(skipped) > 4 else ''}), "
                         f"so this run would be plain bf16. Use a model whose Linear dims are multiples of {BLOCK}, "
                         f"drop the converter from model.converters, or set {section}.allow_empty = true")
    check_not_empty(cfg, section, converted, "nn.Linear",
                    f"{section}.fqns / filter_fqns / bf16_first_layers / bf16_last_layers")
    return converted, skipped


def select_experts(experts: list[tuple[str, dict[str, tuple]]], cfg, section: str, keep_layers: set[int]) -> list[str]:
    """The routed-experts modules (fqn, {weight name: shape (E, out, in)}) the section converts; one whose dims are
    not multiples of 16, an fqns entry matching none or only modules of the bf16 layer window, or nothing converted
    is an error."""
    converted, hits = [], set()
    for fqn, shapes in experts:
        listed = [p for p in cfg.fqns if fqn_matches(fqn, p)]
        if not listed:
            continue
        hits.update(listed)
        if layer_index(fqn) in keep_layers:
            continue
        bad = [f"{n} {tuple(shape)}" for n, shape in shapes.items() if not blockable(*shape[1:])]
        if bad:
            raise ValueError(f"{section}.fqns selects {fqn} whose {', '.join(bad)} have dims that are not "
                             f"multiples of {BLOCK}; remove it from {section}.fqns")
        converted.append(fqn)
    missing = [p for p in cfg.fqns if p not in hits]
    if missing:
        raise ValueError(f"{section}.fqns entries {missing} match no routed-experts (GroupedExperts) module")
    contradicted = [p for p in cfg.fqns if converted and not any(fqn_matches(f, p) for f in converted)]
    if contradicted:
        raise ValueError(f"{section}.fqns entries {contradicted} select only modules of layers kept in bf16 "
                         f"(bf16_first_layers / bf16_last_layers): drop them from fqns or shrink the bf16 window")
    check_not_empty(cfg, section, converted, "routed-experts module",
                    f"{section}.fqns / bf16_first_layers / bf16_last_layers")
    return converted


def check_not_empty(cfg, section: str, converted: list, what: str, keys: str) -> None:
    """An enabled converter that converts nothing would train plain bf16 under a 4/6 name: refuse it."""
    if not converted and not cfg.allow_empty:
        raise ValueError(f"{section} converted no {what}: {keys} leave nothing to quantize, so this run would "
                         f"be plain bf16. Fix those keys, drop the converter from model.converters, or set "
                         f"{section}.allow_empty = true to run it anyway")


def check_implementations(recipe, section: str) -> None:
    """The knobs that demand an implementation (quantizer='triton', gemm='fp4') fail on this rank's hardware
    before the model is built, not at the first forward; so do bad environment overrides of them."""
    environment_overrides()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    if recipe.quantizer == "triton" and device is None:
        raise ValueError(f"{section}.quantizer='triton' needs a CUDA device and this rank has none; use 'auto' "
                         "(Triton on CUDA, the reference elsewhere) or 'reference'")
    if recipe.gemm == "fp4":
        try:
            require_fp4(device or torch.device("cpu"))  # the backends' own check, with the TOML key named
        except ValueError as e:
            raise ValueError(f"{section}.{e}") from e


def check_context(kind: str, cfg, converters: list[str], compile_cfg, tensor_parallel_degree: int) -> None:
    """The settings around a section that it cannot run under (`converters`: the run's converter names)."""
    section = f"quantize.{kind}.{FAMILY}"
    others = [c for c in converters if "quantize" in c and c.split(".")[-1] != FAMILY]
    if others:
        raise ValueError(f"model.converters mixes {others} with {section}: one quantization family per run "
                         f"(use quantize.linear.{FAMILY} and/or quantize.grouped_mm.{FAMILY} alone)")
    if kind == "linear" and cfg.cache_weights and compile_cfg.enable and "model" in compile_cfg.components:
        raise ValueError(f"{section}.cache_weights = true with compile.enable on the model: the weight cache "
                         "runs in eager mode only and torch.compile traces the dense Linears (routed experts with "
                         f"a cache run eagerly: quantize.grouped_mm.{FAMILY}.cache_weights works with compile); set "
                         "one of them to false")
    if cfg.fidelity_every and compile_cfg.enable and "model" in compile_cfg.components:
        raise ValueError(f"{section}.fidelity_every = {cfg.fidelity_every} with compile.enable on the model: the "
                         "fidelity capture hooks run in eager mode only; set fidelity_every = 0 or disable compile")
    if "cudagraph" in compile_cfg.backend or any("cudagraph" in p for p in getattr(compile_cfg, "passes", ())):
        raise ValueError(f"compile.backend={compile_cfg.backend!r} / compile.passes use CUDA graphs, which "
                         f"{section} cannot run under: the grouped path reads group sizes on the host and the "
                         "amax reductions are data dependent. Use compile.backend = \"inductor\"")
    if kind == "linear" and tensor_parallel_degree > 1:
        raise ValueError(f"{section} with parallelism.tensor_parallel_degree={tensor_parallel_degree}: "
                         "tensor-parallel shards would get per-shard amaxes; use FSDP (data_parallel_shard_degree)")


def check_known_converters(listed: list[str], valid) -> None:
    """model.converters names only registered converters (torchtitan would fail a typo with a bare KeyError)."""
    unknown = [n for n in listed if n not in valid]
    if unknown:
        raise ValueError(f"model.converters lists {unknown}, which no converter is registered as; valid: "
                         f"{', '.join(sorted(valid))}")


def check_section_listed(name: str, configured: bool, listed: list[str]) -> None:
    """A configured [quantize.*.four_over_six] section whose converter model.converters does not list would train
    plain bf16 without a word."""
    if configured and name not in listed:
        raise ValueError(f"[{name}] is configured but model.converters={listed} does not list {name!r}, so nothing "
                         f"would be quantized (a plain bf16 run): add it to model.converters, or delete the "
                         f"[{name}] section")


def check_whole_expert_weights(section: str, tensor_parallel_degree: int, expert_parallel_degree: int,
                               expert_tensor_parallel_degree: int | None = None) -> None:
    """Routed experts need whole weights per rank (an expert's amax spans all its rows): no tensor parallelism
    over them. expert_tensor_parallel_degree: torchtitan 0.2's knob (the experts' TP degree under expert
    parallelism); torchtitan 0.3 has none, its experts follow tensor_parallel_degree."""
    ep = expert_parallel_degree
    etp = expert_tensor_parallel_degree if expert_tensor_parallel_degree is not None and ep > 1 else (
        tensor_parallel_degree)
    if etp > 1:
        knobs = f"parallelism.tensor_parallel_degree={tensor_parallel_degree}, expert_parallel_degree={ep}"
        if expert_tensor_parallel_degree is not None:
            knobs += f", expert_tensor_parallel_degree={expert_tensor_parallel_degree}"
        fix = " with expert_tensor_parallel_degree = 1" if expert_tensor_parallel_degree is not None else ""
        raise ValueError(f"{section} with tensor parallelism over the experts ({knobs}): experts must hold whole "
                         f"weights per rank; use expert_parallel_degree > 1{fix} instead")
