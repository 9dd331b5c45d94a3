"""The converters' core, shared by torchtitan 0.2 (converters.py: modules of a built model) and 0.3
(tt03/converters.py: nodes of a model config): the checks of one section, the process set-up a conversion needs,
and the conversion of what a section selects (bf16 layer window, selection rules, the swap, the MFU accounting, one
log line). The adapters only find the candidates and swap them in their torchtitan's terms.
"""

from typing import Callable

from torchtitan.tools.logging import logger

from ..quant.recipe import FourOverSixRecipe
from . import metrics, rules
from .allocator import hint_without_expandable_segments
from .backward_thread import run_backward_on_calling_thread
from .sections import FAMILY


def check_section(kind: str, cfg, converters: list[str], compile_cfg, parallelism) -> FourOverSixRecipe:
    """Every config-time check of section quantize.<kind>.four_over_six (kind "linear" or "grouped_mm") against the
    run's converters, compile and parallelism settings, then its recipe's implementations; returns the recipe."""
    section = f"quantize.{kind}.{FAMILY}"
    rules.check_context(kind, cfg, converters, compile_cfg, parallelism.tensor_parallel_degree)
    if kind == "grouped_mm":
        if getattr(parallelism, "expert_parallel_comm_backend", "standard") == "deepep":  # a 0.2 knob
            raise ValueError(f"{section} with parallelism.expert_parallel_comm_backend=\"deepep\": DeepEP does "
                             f"not pad token groups to {cfg.pad_multiple} rows; use \"standard\"")
        rules.check_whole_expert_weights(section, parallelism.tensor_parallel_degree,
                                         parallelism.expert_parallel_degree,
                                         getattr(parallelism, "expert_tensor_parallel_degree", None))
    recipe = cfg.recipe()
    rules.check_implementations(recipe, section)
    return recipe


def set_up_process() -> None:
    """What a converted model needs of its process, done when a converter is built (the path through
    `torchtitan.train` has no other hook): the MFU / map-to-4 metrics, the backward on the training thread, the
    allocator hint."""
    metrics.install()
    run_backward_on_calling_thread()  # torchtitan builds converters on the thread that trains
    hint_without_expandable_segments()


def convert_linears(section: str, cfg, recipe: FourOverSixRecipe, linears: list[tuple[str, int, int]],
                    layers: list[int] | None, model: str, swap: Callable[[str], None]) -> list[str]:
    """Swap the Linears (fqn, in_features, out_features) the section selects outside its bf16 layer window
    (`layers`: the model's decoder layer indices, None without a `layers` stack), with swap(fqn); returns them."""
    keep = rules.bf16_layers(layers, cfg, section, model)
    converted, skipped = rules.select_linears(linears, cfg, section, keep)
    dims = {fqn: (n_in, n_out) for fqn, n_in, n_out in linears}
    for fqn in converted:
        swap(fqn)
        metrics.track(fqn, dims[fqn][0] * dims[fqn][1], recipe, grouped=False)
    logger.info(f"{section}: converted {len(converted)} Linear layers ({recipe}){_cached(cfg)}")
    if skipped:
        logger.info(f"{section}: left in bf16, dims not quantizable: {', '.join(skipped)}")
    return converted


def convert_experts(section: str, cfg, recipe: FourOverSixRecipe, experts: list[tuple[str, dict[str, tuple]]],
                    layers: list[int] | None, model: str, swap: Callable[[str], int]) -> list[str]:
    """Swap the routed-experts modules (fqn, {weight name: (E, out, in)}) the section selects, with swap(fqn),
    which returns the expert parameters active per token (top_k of E experts); returns them."""
    keep = rules.bf16_layers(layers, cfg, section, model)
    converted = rules.select_experts(experts, cfg, section, keep)
    for fqn in converted:
        metrics.track(fqn, swap(fqn), recipe, grouped=True)
    logger.info(f"{section}: converted {len(converted)} routed-experts modules ({recipe}); token groups padded to "
                f"{cfg.pad_multiple} rows{_cached(cfg)}")
    return converted


def _cached(cfg) -> str:
    return "; weights quantized once per optimizer step (cache_weights)" if cfg.cache_weights else ""
