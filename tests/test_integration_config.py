"""[quantize.*.four_over_six] TOML sections and the converters' config-time validation."""

import re

import pytest
import torch
from torchtitan.config import JobConfig as TorchtitanJobConfig
from torchtitan.models.moe import utils as moe_utils
from torchtitan.protocols.model_converter import build_model_converters

from tests.helpers.integration_helpers import CONFIG_MODULE, build_model, job_config
from titan_fp4six.integration.rules import fqn_matches
from titan_fp4six.modules import GROUP_ALIGN
from titan_fp4six.ops import FourOverSixRecipe

LIN = "quantize.linear.four_over_six"
GMM = "quantize.grouped_mm.four_over_six"


def _build(job):
    return build_model_converters(job, None)


def test_toml_sections_merge_into_torchtitan_config(tmp_path):
    toml = tmp_path / "recipe.toml"
    toml.write_text(f'''
[job]
custom_config_module = "{CONFIG_MODULE}"
[model]
converters = ["{LIN}", "{GMM}"]
[quantize.linear.four_over_six]
err_mode = "mae"
scale_bound = 448
filter_fqns = ["output"]
bf16_last_layers = 2
[quantize.grouped_mm.four_over_six]
backward = "dequantized"
''')
    from torchtitan.config.manager import ConfigManager

    job = ConfigManager().parse_args(["--job.config_file", str(toml), "--quantize.linear.four_over_six.fqns",
                                      "attention,shared_experts"])
    lin, gmm = job.quantize.linear.four_over_six, job.quantize.grouped_mm.four_over_six
    assert (lin.err_mode, lin.scale_bound, lin.filter_fqns, lin.bf16_last_layers) == ("mae", 448, ["output"], 2)
    assert lin.fqns == ["attention", "shared_experts"] and lin.weight_block == FourOverSixRecipe().weight_block
    assert (gmm.backward, gmm.fqns) == ("dequantized", ["experts"])
    assert job.quantize.linear.float8.filter_fqns == []  # torchtitan's own sections are still there
    converters = _build(job).converters
    assert converters[0].recipe == FourOverSixRecipe(err_mode="mae", scale_bound=448, backward="quantized")  # resolved
    assert converters[1].recipe == FourOverSixRecipe(backward="dequantized")
    assert lin.recipe() == converters[0].recipe  # built and checked when the config loads


def _refused_at_config_load(tmp_path, section: str, line: str, match: str) -> None:
    """A recipe converting with `section` whose section holds `line` is refused while the config loads."""
    toml = tmp_path / "recipe.toml"
    toml.write_text(f'''
[job]
custom_config_module = "{CONFIG_MODULE}"
[model]
converters = ["{section}"]
[{section}]
{line}
''')
    from torchtitan.config.manager import ConfigManager

    with pytest.raises(ValueError, match=match):
        ConfigManager().parse_args(["--job.config_file", str(toml)])


@pytest.mark.parametrize("line, match", [
    ("scale_bound = 448.0", rf"\[{LIN}\] {LIN}.scale_bound=448.0 is not supported.*type int; got float"),
    ("bf16_last_layers = 1.0", rf"{LIN}.bf16_last_layers=1.0; it must be an integer"),
    ("bf16_first_layers = true", rf"{LIN}.bf16_first_layers=True; it must be an integer"),
    ("allow_empty = 1", rf"{LIN}.allow_empty=1; it must be true or false"),
    ("cache_weights = 1", rf"{LIN}.cache_weights=1; it must be true or false"),
])
def test_toml_knobs_of_the_wrong_type_are_config_errors(tmp_path, line, match):
    """A TOML float equal to a valid int (or a bool) is refused when the config loads, naming the key."""
    _refused_at_config_load(tmp_path, LIN, line, match)


@pytest.mark.parametrize("section, line, match", [
    (LIN, 'filter_fqns = "output"', rf"{LIN}.filter_fqns='output'; it must be a list of strings .*"
                                     r'filter_fqns = \["output"\]'),
    (GMM, 'fqns = "experts"', rf"{GMM}.fqns='experts'; it must be a list of strings .*fqns = \[\"experts\"\]"),
    (LIN, "fqns = [1]", rf"{LIN}.fqns=\[1\]; it must be a list of strings"),
])
def test_module_lists_given_as_strings_are_config_errors(tmp_path, section, line, match):
    """A TOML string where a list belongs would be matched character by character (the all-Linears recipe then
    converted the LM head): refused when the config loads, with the list it meant."""
    _refused_at_config_load(tmp_path, section, line, match)


def test_defaults_keep_lm_head_and_router_in_bf16():
    job = job_config()
    assert job.quantize.linear.four_over_six.filter_fqns == ["output", "router.gate"]
    assert job.quantize.grouped_mm.four_over_six.fqns == ["experts"]


def test_grouped_converter_aligns_token_groups(monkeypatch):
    monkeypatch.setattr(moe_utils, "TOKEN_GROUP_ALIGN_SIZE_M", 8)
    _build(job_config())
    assert moe_utils.TOKEN_GROUP_ALIGN_SIZE_M == GROUP_ALIGN == 128


def test_fqn_matching_is_by_dotted_parts():
    assert fqn_matches("layers.3.moe.experts", "experts")
    assert not fqn_matches("layers.3.moe.shared_experts", "experts")
    assert fqn_matches("layers.3.moe.router.gate", "router.gate")
    assert fqn_matches("layers.3.attention.wq", "layers.3")
    assert not fqn_matches("layers.13.attention.wq", "layers.3")


@pytest.mark.parametrize("args, converters, match", [
    (["--compile.enable", "--compile.backend", "cudagraphs"], LIN, r"compile.backend='cudagraphs'"),
    (["--parallelism.expert_parallel_comm_backend", "deepep"], GMM, "expert_parallel_comm_backend=\"deepep\""),
    ([], f"{GMM},quantize.linear.float8", r"mixes \[.quantize.linear.float8.\]"),
    (["--parallelism.tensor_parallel_degree", "2"], LIN, "tensor_parallel_degree=2"),
    pytest.param(["--quantize.linear.four_over_six.quantizer", "triton"], LIN, rf"{LIN}.quantizer='triton' needs a "
                 "CUDA device", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine")),
    pytest.param(["--quantize.grouped_mm.four_over_six.gemm", "fp4"], GMM, rf"{GMM}.gemm='fp4' needs a Blackwell GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine (maybe a Blackwell)")),
    (["--parallelism.tensor_parallel_degree", "2"], GMM, "tensor parallelism over the experts"),
    (["--compile.enable", "--quantize.linear.four_over_six.cache_weights"], LIN,
     rf"{LIN}.cache_weights = true with compile.enable on the model"),
    (["--parallelism.expert_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2",
      "--parallelism.expert_tensor_parallel_degree", "2"], GMM, "expert_tensor_parallel_degree = 1"),
])
def test_config_errors_name_the_toml_keys(args, converters, match):
    job = job_config(*args, converters=converters)
    with pytest.raises(ValueError, match=match):
        _build(job)


@pytest.mark.parametrize("env, value", [("TITAN_FP4SIX_QUANTIZER", "bogus"), ("TITAN_FP4SIX_EMULATE", "true")])
def test_bad_environment_overrides_fail_when_the_converters_are_built(monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=rf"{env}='{value}' is not supported; valid values"):
        _build(job_config(converters=GMM))


@pytest.mark.parametrize("args, match", [
    ([f"--{LIN}.gradient_rounding", "random"], rf"\[{LIN}\] {LIN}.gradient_rounding='random' is not supported"),
    ([f"--{LIN}.gradient_rounding", "stochastic", f"--{LIN}.backward", "high_precision"],
     rf"\[{LIN}\] {LIN}.gradient_rounding='stochastic' .* {LIN}.backward='high_precision'"),
    ([f"--{GMM}.gradient_rounding", "stochastic"], rf"\[{GMM}\] {GMM}.gradient_rounding='stochastic' .* grouped"),
    (["--quantize.linear.four_over_six.err_mode", "l1"], rf"\[{LIN}\] {LIN}.err_mode='l1' is not supported; valid values: 'mae', 'mse'"),
    (["--quantize.grouped_mm.four_over_six.scale_bound", "300"], rf"\[{GMM}\] {GMM}.scale_bound=300 is not supported"),
    (["--quantize.linear.four_over_six.weight_block", "8x8"], "weight_block='8x8'"),
    (["--quantize.linear.four_over_six.quantizer", "cuda"], rf"{LIN}.quantizer='cuda' is not supported"),
    (["--quantize.grouped_mm.four_over_six.gemm", "fp8"], rf"{GMM}.gemm='fp8' is not supported"),
    (["--quantize.linear.four_over_six.bf16_first_layers", "-1"], f"{LIN}.bf16_first_layers=-1"),
    (["--quantize.linear.four_over_six.scope", "both"], rf"{LIN}.scope='both' is not supported; valid values: "
                                                          "'all', 'weights', 'activations', 'none'"),
    (["--quantize.grouped_mm.four_over_six.pad_multiple", "120"], rf"{GMM}.pad_multiple=120; it must be a positive "
                                                                   "multiple of 16"),
])
def test_knob_errors_stop_the_config_load(args, match, capsys):
    """A bad knob fails while the config loads (before any converter or model), naming its TOML key; on the
    command line tyro prints the message in its error box and exits with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        job_config(*args)
    assert exit_info.value.code == 2
    message = re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().err)
    assert re.search(match, message), message


def test_quantized_backward_loads_for_row_scaling_and_experts():
    """backward='quantized' with row-scaled activations and for routed experts (once refused) builds."""
    job = job_config("--quantize.linear.four_over_six.backward", "quantized",
                     "--quantize.linear.four_over_six.activation_scaling", "row",
                     "--quantize.grouped_mm.four_over_six.backward", "quantized")
    recipes = [c.recipe for c in _build(job).converters]
    assert recipes == [FourOverSixRecipe(backward="quantized", activation_scaling="row"),
                       FourOverSixRecipe(backward="quantized")]


def test_knob_errors_in_the_toml_stop_the_config_load(tmp_path):
    toml = tmp_path / "recipe.toml"
    toml.write_text(f'''
[job]
custom_config_module = "{CONFIG_MODULE}"
[quantize.grouped_mm.four_over_six]
weight_block = "32x32"
''')
    from torchtitan.config.manager import ConfigManager

    with pytest.raises(ValueError, match=rf"\[{GMM}\] {GMM}.weight_block='32x32' is not supported"):
        ConfigManager().parse_args(["--job.config_file", str(toml)])


def test_cudagraph_compiler_pass_is_rejected():
    job = job_config("--compile.enable")
    job.compile.passes = ["autobucketing_reordering", "cudagraph"]  # the compiler toolkit's field
    with pytest.raises(ValueError, match="CUDA graphs"):
        _build(job)


def test_missing_sections_say_which_module_to_load():
    job = TorchtitanJobConfig()
    job.model.converters = [LIN]
    with pytest.raises(ValueError, match=f'custom_config_module = "{CONFIG_MODULE}"'):
        _build(job)


def test_valid_combinations_build():
    _build(job_config("--compile.enable", "--parallelism.expert_parallel_degree", "2",
                      "--quantize.linear.four_over_six.activation_scaling", "row",
                      "--quantize.grouped_mm.four_over_six.backward", "dequantized"))


def test_grouped_cache_weights_is_allowed_with_compile():
    """torchtitan compiles the MoE blocks but leaves the routed experts modules eager: the converted experts
    compile their own chain, except where a weight cache (filled eagerly) runs."""
    job = job_config("--compile.enable", "--quantize.grouped_mm.four_over_six.cache_weights", converters=GMM)
    assert _build(job).converters[0].cfg.cache_weights


@pytest.mark.parametrize("flags, backend", [(["--compile.enable"], "inductor"),
                                            (["--compile.enable", "--compile.backend", "aot_eager"], "aot_eager"),
                                            (["--compile.enable", "--compile.components", "loss"], None), ([], None)])
def test_the_experts_chain_is_compiled_with_the_model(flags, backend):
    """As torchtitan 0.2 compiles its own experts' chain: with the model's compile backend, only when the model
    is compiled."""
    job = job_config(*flags, converters=GMM)
    model, _ = build_model("qwen3", job)
    _build(job).convert(model)
    experts = [m for m in model.modules() if hasattr(m, "compile_backend")]
    assert experts and all(m.compile_backend == backend for m in experts)
