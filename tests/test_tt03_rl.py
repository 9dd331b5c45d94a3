"""torchtitan 0.3's RL experiment (TitanRL) with this package's converter: the 30B varlen recipe's model spec,
built on the meta device as TitanRL's trainer builds it and as its vLLM generator does (the attention core swapped,
the rest of the config as given), has 4/6 routed experts in every layer with the recipe's knobs; the registry
function names what TitanRL lacks here. Runs in .venv-tt03 (scripts/test.sh)."""

import dataclasses
import tomllib

import pytest
import torch

from titan_fp4six.integration import version

if version.series() != "0.3":
    pytest.skip("needs torchtitan 0.3.x (scripts/test.sh runs it in .venv-tt03)", allow_module_level=True)

from titan_fp4six.integration.tt03 import rl  # noqa: E402
from titan_fp4six.integration.tt03.config_registry import CONFIGS  # noqa: E402


def _experts(model) -> list:
    return [m for m in model.modules() if getattr(m, "recipe", None) is not None]


def _recipe_knobs():
    with open(CONFIGS / f"{rl.RECIPE}.toml", "rb") as f:
        return tomllib.load(f)["quantize"]["grouped_mm"]["four_over_six"]


def test_the_trainer_side_builds_four_over_six_experts():
    spec = rl.rl_model_spec()
    with torch.device("meta"):
        model = spec.model.build()
    experts = _experts(model)
    assert spec.flavor == "30B-A3B" and len(experts) == 48
    knobs = _recipe_knobs()
    for m in experts:
        assert (m.recipe.err_mode, m.recipe.scale_bound, m.recipe.weight_block, m.recipe.activation_scaling,
                m.recipe.backward) == (knobs["err_mode"], knobs["scale_bound"], knobs["weight_block"],
                                       knobs["activation_scaling"], knobs["backward"])


def test_the_generator_side_keeps_them_when_the_attention_core_is_swapped():
    """TitanRL's VLLMModelWrapper replaces each layer's attention.inner_attention config by vLLM's and builds the
    rest of the spec's config as given; any other attention config stands in for vLLM's here."""
    spec = rl.rl_model_spec()
    other = rl.rl_model_spec(attn_backend="flex").model.layers[0].attention.inner_attention
    layers = [dataclasses.replace(c, attention=dataclasses.replace(c.attention, inner_attention=other))
              for c in spec.model.layers]
    with torch.device("meta"):
        model = dataclasses.replace(spec.model, layers=layers).build()
    assert len(_experts(model)) == 48


def test_the_registry_entry_names_what_titanrl_lacks():
    try:
        import torchtitan.experiments.rl.examples.alphabet_sort.config_registry  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"TitanRL's config registry does not import here .*rl_model_spec"):
            rl.rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six()
    else:
        config = rl.rl_grpo_qwen3_30b_a3b_varlen_nvfp4_four_over_six()
        with torch.device("meta"):
            assert len(_experts(config.model_spec.model.build())) == 48
