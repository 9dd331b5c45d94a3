"""torchtitan 0.3's RL experiment (TitanRL, `torchtitan/experiments/rl/`) with four-over-six routed experts:
`python -m torchtitan.experiments.rl.train --module titan_fp4six.integration.tt03.rl --config
rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six`.

TitanRL hands one `model_spec` to its trainer and its vLLM generators (each builds `model_spec.model`; the
generator swaps only the attention core), so a spec whose config this package's 0.3 converter has converted runs
4/6 experts on both sides. `rl_model_spec` builds it from the recipe TOML's [model] flavor and
[quantize.grouped_mm.four_over_six] knobs (configs/rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six.toml, the
recipes' one home); the registry function takes TitanRL's own 30B varlen config and swaps that spec in.

TitanRL itself needs what does not install here (docs/rl.md, "torchtitan 0.3's RL experiment"): its config
registry imports `renderers`, torchstore and Monarch, and its vLLM registration a vLLM newer than 0.32.
"""

import dataclasses
import tomllib

from torchtitan.models import qwen3

from ..sections import FAMILY
from .config_registry import CONFIGS, _renamed
from .converters import FourOverSixGroupedExpertsConverter

RECIPE = "rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six"


def rl_model_spec(recipe: str = RECIPE, attn_backend: str = "varlen"):
    """The qwen3 ModelSpec of configs/<recipe>.toml's flavor with its routed experts converted to 4/6."""
    with open(CONFIGS / f"{recipe}.toml", "rb") as f:
        toml = tomllib.load(f)
    model = toml["model"]
    if model["converters"] != ["quantize.grouped_mm.four_over_six"] or model["name"] != "qwen3":
        raise ValueError(f"configs/{recipe}.toml: the TitanRL spec converts the routed experts of a qwen3 model "
                         f"(model.name = 'qwen3', converters = ['quantize.grouped_mm.four_over_six']); got "
                         f"{model['name']!r}, {model['converters']}")
    knobs = dict(toml["quantize"]["grouped_mm"][FAMILY])
    knobs["fqns"] = [_renamed(fqn) for fqn in knobs.get("fqns", [])]
    converter = FourOverSixGroupedExpertsConverter.Config(**knobs)
    return qwen3.model_registry(model["flavor"], attn_backend=attn_backend, converters=[converter])


def rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six():
    """TitanRL's `rl_grpo_qwen3_30b_a3b_varlen` (8 GPUs: trainer FSDP 2 x TP 2 x EP 4, generators DP 2 x TP 2 x
    EP 4) with 4/6 routed experts on the trainer and in every generator."""
    try:
        from torchtitan.experiments.rl.examples.alphabet_sort.config_registry import rl_grpo_qwen3_30b_a3b_varlen
    except ImportError as e:
        raise ImportError(f"TitanRL's config registry does not import here ({e}): it needs vLLM, torchstore, Monarch "
                          "and `renderers` (torchtitan/experiments/rl/README.md); titan_fp4six.integration.tt03.rl."
                          "rl_model_spec() is the 4/6 part and builds without them") from e
    return dataclasses.replace(rl_grpo_qwen3_30b_a3b_varlen(), model_spec=rl_model_spec())
