"""torchtitan model converters `quantize.linear.four_over_six` and `quantize.grouped_mm.four_over_six`.

torchtitan builds each converter from the whole job config (so `__init__` is where cross-section checks
live, with errors naming the TOML keys) and calls `convert(model)` on the meta-device model before any
parallelism, compile or FSDP. Converting swaps modules for stateless subclasses: the state_dict is unchanged.
"""

import tomllib

import torch
from torch import nn
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.moe.moe import GroupedExperts
from torchtitan.models.moe.utils import set_token_group_alignment_size_m
from torchtitan.protocols.model_converter import _registry_model_converter_cls, register_model_converter
from torchtitan.tools.logging import logger

from ..modules.experts import convert_experts
from ..modules.linear import FourOverSixLinear
from ..modules.weight_cache import invalidate_weight_caches
from ..numerics.formats import BLOCK_SIZE as BLOCK
from ..dispatch.backend import environment_overrides, require_fp4
from . import fidelity, metrics
from .allocator import hint_without_expandable_segments
from .backward_thread import run_backward_on_calling_thread

FAMILY = "four_over_six"
KINDS = ("linear", "grouped_mm")
_CACHED = "; weights quantized once per optimizer step (cache_weights)"
CONFIG_MODULE = "titan_fp4six.integration.job_config"


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


def bf16_layers(model: nn.Module, cfg, section: str) -> set[int]:
    """Indices of the first `bf16_first_layers` and last `bf16_last_layers` decoder layers of `model`."""
    first, last = cfg.bf16_first_layers, cfg.bf16_last_layers
    if not first and not last:
        return set()
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"{section}.bf16_first_layers/bf16_last_layers need a model with a `layers` stack; "
                         f"{type(model).__name__} has none")
    order = sorted(int(name) for name, _ in layers.named_children())
    if first + last > len(order):
        raise ValueError(f"{section}.bf16_first_layers={first} + {section}.bf16_last_layers={last} exceeds the "
                         f"model's {len(order)} decoder layers; keep their sum <= {len(order)}")
    return set(order[:first]) | set(order[len(order) - last:] if last else ())


def check_not_empty(cfg, section: str, converted: list, what: str, keys: str) -> None:
    """An enabled converter that converts nothing would train plain bf16 under a 4/6 name: refuse it."""
    if not converted and not cfg.allow_empty:
        raise ValueError(f"{section} converted no {what}: {keys} leave nothing to quantize, so this run would "
                         f"be plain bf16. Fix those keys, drop the converter from model.converters, or set "
                         f"{section}.allow_empty = true to run it anyway")


def _section(job_config, kind: str):
    """The [quantize.<kind>.four_over_six] section, or None without the plugin's config module."""
    return getattr(getattr(getattr(job_config, "quantize", None), kind, None), FAMILY, None)


def section_config(job_config, kind: str):
    """The section of converter `kind`, which the config module adds (and registers the converters with)."""
    cfg = _section(job_config, kind)
    if cfg is None:
        raise ValueError(f"model.converters lists quantize.{kind}.{FAMILY} but its config section is missing: set "
                         f'[job] custom_config_module = "{CONFIG_MODULE}"')
    return cfg


def validate_job_config(job_config, kind: str):
    """Cross-section checks for converter `kind` ("linear" or "grouped_mm"); returns (section cfg, recipe)."""
    section = f"quantize.{kind}.{FAMILY}"
    cfg = section_config(job_config, kind)
    others = [c for c in job_config.model.converters if "quantize" in c and c.split(".")[-1] != FAMILY]
    if others:
        raise ValueError(f"model.converters mixes {others} with {section}: one quantization family per run "
                         f"(use quantize.linear.{FAMILY} and/or quantize.grouped_mm.{FAMILY} alone)")
    compile_cfg = job_config.compile
    if kind == "linear" and cfg.cache_weights and compile_cfg.enable and "model" in compile_cfg.components:
        raise ValueError(f"{section}.cache_weights = true with compile.enable on the model: the weight cache "
                         "runs in eager mode only and torch.compile traces the dense Linears (routed experts stay "
                         f"eager: quantize.grouped_mm.{FAMILY}.cache_weights works with compile); set one of them "
                         "to false")
    if cfg.fidelity_every and compile_cfg.enable and "model" in compile_cfg.components:
        raise ValueError(f"{section}.fidelity_every = {cfg.fidelity_every} with compile.enable on the model: the "
                         "fidelity capture hooks run in eager mode only; set fidelity_every = 0 or disable compile")
    if "cudagraph" in compile_cfg.backend or any("cudagraph" in p for p in getattr(compile_cfg, "passes", ())):
        raise ValueError(f"compile.backend={compile_cfg.backend!r} / compile.passes use CUDA graphs, which "
                         f"{section} cannot run under: the grouped path reads group sizes on the host and the "
                         "amax reductions are data dependent. Use compile.backend = \"inductor\"")
    par = job_config.parallelism
    if kind == "linear" and par.tensor_parallel_degree > 1:
        raise ValueError(f"{section} with parallelism.tensor_parallel_degree={par.tensor_parallel_degree}: "
                         "tensor-parallel shards would get per-shard amaxes; use FSDP (data_parallel_shard_degree)")
    if kind == "grouped_mm":
        if par.expert_parallel_comm_backend == "deepep":
            raise ValueError(f"{section} with parallelism.expert_parallel_comm_backend=\"deepep\": DeepEP does "
                             f"not pad token groups to {cfg.pad_multiple} rows; use \"standard\"")
        etp = par.expert_tensor_parallel_degree if par.expert_parallel_degree > 1 else par.tensor_parallel_degree
        if etp > 1:
            raise ValueError(f"{section} with expert tensor parallelism (parallelism.tensor_parallel_degree="
                             f"{par.tensor_parallel_degree}, expert_parallel_degree={par.expert_parallel_degree}, "
                             f"expert_tensor_parallel_degree={par.expert_tensor_parallel_degree}): experts must "
                             "hold whole weights per rank; use expert_parallel_degree > 1 with "
                             "expert_tensor_parallel_degree = 1")
    recipe = cfg.recipe()
    check_implementations(recipe, section)
    return cfg, recipe


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


def check_converter_names(job_config) -> None:
    """torchtitan looks model.converters up in its registry and fails a typo with a bare KeyError before any
    converter runs; the plugin's launcher calls this first to name the valid converters. This plugin's names are
    registered by its config module, so without it they are unknown too: that is said first."""
    for kind in KINDS:
        if f"quantize.{kind}.{FAMILY}" in job_config.model.converters:
            section_config(job_config, kind)
    unknown = [n for n in job_config.model.converters if n not in _registry_model_converter_cls]
    if unknown:
        raise ValueError(f"model.converters lists {unknown}, which no converter is registered as; valid: "
                         f"{', '.join(sorted(_registry_model_converter_cls))}")


def check_sections_have_converters(job_config) -> None:
    """A [quantize.*.four_over_six] section whose converter model.converters does not list would train plain bf16
    without a word. A section counts as configured when the recipe file has it or it differs from the defaults
    (a command-line knob)."""
    written = {}
    if job_config.job.config_file:
        with open(job_config.job.config_file, "rb") as f:
            written = tomllib.load(f).get("quantize", {})
    for kind in KINDS:
        cfg, name = _section(job_config, kind), f"quantize.{kind}.{FAMILY}"
        if cfg is None or name in job_config.model.converters:
            continue
        if FAMILY in written.get(kind, {}) or cfg != type(cfg)():
            raise ValueError(f"[{name}] is configured but model.converters={job_config.model.converters} does not "
                             f"list {name!r}, so nothing would be quantized (a plain bf16 run): add it to "
                             f"model.converters, or delete the [{name}] section")


def _replace(model: nn.Module, fqn: str, new: nn.Module) -> None:
    parent, _, name = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


class _Converter(QuantizationConverter):
    kind: str

    def __init__(self, job_config, parallel_dims):
        self.section = f"quantize.{self.kind}.{FAMILY}"
        self.cfg, self.recipe = validate_job_config(job_config, self.kind)
        super().__init__(job_config, parallel_dims)  # torchtitan's one-quantization-family check
        metrics.install()
        run_backward_on_calling_thread()  # torchtitan builds converters on the thread that trains
        hint_without_expandable_segments()

    def attach_fidelity(self, model: nn.Module, converted: list[str]) -> None:
        """fidelity_every > 0: measure the converted modules every N steps (integration/fidelity.py)."""
        if self.cfg.fidelity_every and converted:
            fidelity.attach(self.cfg.fidelity_every, [(fqn, model.get_submodule(fqn)) for fqn in converted])

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]):
        """The weights just changed: drop their cached quantizations (cache_weights)."""
        if self.cfg.cache_weights:
            for part in model if isinstance(model, list) else [model]:
                invalidate_weight_caches(part)


class FourOverSixLinearConverter(_Converter):
    """Swap matching nn.Linear for FourOverSixLinear; see [quantize.linear.four_over_six]."""

    kind = "linear"

    @staticmethod
    def unsupported(linear: nn.Linear) -> str | None:
        """Why this Linear cannot be quantized (both GEMM dims are blocked by 16 somewhere), or None."""
        bad = [f"{name}={n}" for name, n in (("in_features", linear.in_features), ("out_features",
                                                                                   linear.out_features)) if n % BLOCK]
        return f"{' and '.join(bad)} not a multiple of {BLOCK}" if bad else None

    def convert(self, model: nn.Module):
        cfg, section = self.cfg, self.section
        keep_layers = bf16_layers(model, cfg, section)
        converted, skipped, hits = [], [], set()
        for fqn, mod in list(model.named_modules()):
            if type(mod) is not nn.Linear:
                continue
            listed = [p for p in cfg.fqns if fqn_matches(fqn, p)]
            if cfg.fqns and not listed:
                continue
            filtered = [p for p in cfg.filter_fqns if fqn_matches(fqn, p)]
            why = (f"it matches {section}.filter_fqns {filtered}" if filtered
                   else "its layer is kept in bf16 (bf16_first_layers/bf16_last_layers)"
                   if layer_index(fqn) in keep_layers else self.unsupported(mod))
            if why is None:
                _replace(model, fqn, FourOverSixLinear.from_linear(mod, self.recipe, cfg.cache_weights))
                converted.append(fqn)
                hits.update(listed)
                metrics.track(fqn, mod.weight.numel(), self.recipe, grouped=False)
            elif listed:
                raise ValueError(f"{section}.fqns lists {listed} but {fqn} cannot be converted: {why}")
            elif not filtered and layer_index(fqn) not in keep_layers:
                skipped.append(f"{fqn} ({why})")
        missing = [p for p in cfg.fqns if p not in hits]
        if missing:
            raise ValueError(f"{section}.fqns entries {missing} match no nn.Linear in the model")
        check_not_empty(cfg, section, converted, "nn.Linear",
                        f"{section}.fqns / filter_fqns / bf16_first_layers / bf16_last_layers")
        self.attach_fidelity(model, converted)
        logger.info(f"{section}: converted {len(converted)} Linear layers to FourOverSixLinear ({self.recipe})"
                    f"{_CACHED if cfg.cache_weights else ''}")
        if skipped:
            logger.info(f"{section}: left in bf16, dims not quantizable: {', '.join(skipped)}")


class FourOverSixGroupedMMConverter(_Converter):
    """Make matching routed experts run the four-over-six grouped GEMMs; see [quantize.grouped_mm.four_over_six]."""

    kind = "grouped_mm"

    def __init__(self, job_config, parallel_dims):
        super().__init__(job_config, parallel_dims)
        set_token_group_alignment_size_m(self.cfg.pad_multiple)  # EP dispatch pads every expert group to this

    def convert(self, model: nn.Module):
        cfg, section = self.cfg, self.section
        keep_layers = bf16_layers(model, cfg, section)
        converted, hits = [], set()
        for fqn, mod in list(model.named_modules()):
            listed = [p for p in cfg.fqns if fqn_matches(fqn, p)]
            if not listed or not isinstance(mod, GroupedExperts):
                continue
            hits.update(listed)
            if layer_index(fqn) in keep_layers:
                continue
            bad = [f"{n} {tuple(getattr(mod, n).shape)}" for n in ("w1", "w2", "w3")
                   if any(d % BLOCK for d in getattr(mod, n).shape[1:])]
            if bad:
                raise ValueError(f"{section}.fqns selects {fqn} whose {', '.join(bad)} have dims that are not "
                                 f"multiples of {BLOCK}; remove it from {section}.fqns")
            convert_experts(mod, self.recipe, cfg.pad_multiple, cfg.cache_weights)
            converted.append(fqn)
            router = getattr(model.get_submodule(fqn.rpartition(".")[0]), "router", None)
            top_k = getattr(router, "top_k", mod.num_experts)
            metrics.track(fqn, sum(getattr(mod, n).numel() for n in ("w1", "w2", "w3")) * top_k // mod.num_experts,
                          self.recipe, grouped=True)
        missing = [p for p in cfg.fqns if p not in hits]
        if missing:
            raise ValueError(f"{section}.fqns entries {missing} match no routed-experts (GroupedExperts) module")
        check_not_empty(cfg, section, converted, "routed-experts module",
                        f"{section}.fqns / bf16_first_layers / bf16_last_layers")
        self.attach_fidelity(model, converted)
        logger.info(f"{section}: converted {len(converted)} routed-experts modules ({self.recipe}); "
                    f"token groups aligned to {cfg.pad_multiple} rows{_CACHED if cfg.cache_weights else ''}")


def register() -> None:
    """Register both converters with torchtitan; called once, by the config module job_config."""
    register_model_converter(FourOverSixLinearConverter, f"quantize.linear.{FAMILY}")
    register_model_converter(FourOverSixGroupedMMConverter, f"quantize.grouped_mm.{FAMILY}")
