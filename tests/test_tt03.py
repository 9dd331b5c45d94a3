"""The torchtitan 0.3 integration (titan_fp4six.integration.tt03): converter configs, has_quantization, the padded
dispatch, the bf16 layer window, the registry's recipes and CLI, and a CPU run through the launcher. Skipped next to
torchtitan 0.2 (scripts/test.sh runs this file in its 0.3 environment)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titan_fp4six.integration import version

if version.series() != "0.3":
    pytest.skip("needs torchtitan 0.3.x (scripts/test.sh runs it in .venv-tt03)", allow_module_level=True)

from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts  # noqa: E402
from torchtitan.models.common.token_dispatcher import TorchAOTokenDispatcher  # noqa: E402
from torchtitan.models.deepseek_v3 import model_registry  # noqa: E402

import torchtitan.trainer as tt_trainer  # noqa: E402
from titan_fp4six.integration.tt03 import config_registry  # noqa: E402
from titan_fp4six.integration.tt03.converters import (  # noqa: E402
    FourOverSixGroupedExpertsConverter as Grouped, FourOverSixLinearConverter as Dense, FourOverSixLinearModule,
    four_over_six_experts_class)
from titan_fp4six.integration.tt03.trainer import FourOverSixTrainer, check_config  # noqa: E402
from titan_fp4six.modules.experts import run_experts  # noqa: E402
from titan_fp4six.ops import FourOverSixRecipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(weight_block="1x16", activation_scaling="row", backward="high_precision")


def converted_fqns(model_config):
    dense = [f for f, c, _, _ in model_config.traverse(Linear.Config) if isinstance(c, FourOverSixLinearModule.Config)]
    experts = [f for f, c, _, _ in model_config.traverse(GroupedExperts.Config) if hasattr(c, "recipe")]
    return dense, experts


@pytest.mark.parametrize("cls, key, value, message", [
    (Grouped, "scale_bound", 448.0, r"quantize\.grouped_mm\.four_over_six\.scale_bound=448\.0 is not supported; "
                                    r"valid values: 256, 448"),
    (Dense, "err_mode", "l2", r"quantize\.linear\.four_over_six\.err_mode='l2' is not supported; valid values"),
    (Grouped, "bf16_last_layers", 1.0, r"quantize\.grouped_mm\.four_over_six\.bf16_last_layers=1\.0; it must be an "
                                       r"integer >= 0"),
    (Grouped, "pad_multiple", 24, r"quantize\.grouped_mm\.four_over_six\.pad_multiple=24; it must be a positive "
                                  r"multiple of 16"),
    (Dense, "filter_fqns", "lm_head", r"quantize\.linear\.four_over_six\.filter_fqns='lm_head'; it must be a list"),
])
def test_converter_configs_check_their_fields_when_built(cls, key, value, message):
    with pytest.raises(ValueError, match=message):
        cls.Config(**{key: value})


def test_has_quantization_is_true_for_either_converter_and_false_for_a_stock_model():
    stock = model_registry("debugmodel").model
    assert not tt_trainer.has_quantization(stock)
    for converter in (Dense.Config(), Grouped.Config(**BASE)):
        assert tt_trainer.has_quantization(model_registry("debugmodel", converters=[converter]).model)


def test_grouped_converter_pads_dispatch_and_converts_the_routed_experts_only():
    model = model_registry("debugmodel", converters=[Grouped.Config(pad_multiple=64, **BASE)]).model
    dense, experts = converted_fqns(model)
    assert dense == [] and experts == [f"layers.{i}.moe.routed_experts.inner_experts" for i in range(1, 6)]
    routed = model.layers[1].moe.routed_experts
    assert isinstance(routed.token_dispatcher, TorchAOTokenDispatcher.Config)
    assert routed.token_dispatcher.pad_multiple == 64
    assert routed.inner_experts.recipe == FourOverSixRecipe(**BASE).resolve(grouped=True)


def test_dense_converter_keeps_lm_head_and_router_gate_and_the_bf16_layers():
    model = model_registry("debugmodel", converters=[Dense.Config(bf16_first_layers=1, bf16_last_layers=1)]).model
    dense, _ = converted_fqns(model)
    assert dense and all(f.split(".")[1] in "1234" for f in dense)
    assert not [f for f in dense if "lm_head" in f or "router.gate" in f]
    with pytest.raises(ValueError, match=r"bf16_first_layers=4 \+ quantize\.linear\.four_over_six\.bf16_last_layers=3 "
                                         r"exceeds the model's 6 decoder layers"):
        model_registry("debugmodel", converters=[Dense.Config(bf16_first_layers=4, bf16_last_layers=3)])


def test_experts_compute_the_rows_up_to_offs_end_only():
    """The padding dispatcher's buffer has rows past offs[-1]; they must not reach an amax (garbage there changes
    nothing) and come back as zeros."""
    torch.manual_seed(0)
    recipe = FourOverSixRecipe(**BASE).resolve(grouped=True)
    cls = four_over_six_experts_class(GroupedExperts)
    experts = cls.Config(dim=32, hidden_dim=48, num_experts=2, recipe=recipe).build()
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.1)
    counts = torch.tensor([16, 32])
    x = torch.randn(64, 32)
    out = experts(x, counts)
    x_garbage = x.clone()
    x_garbage[48:] = 1e4
    out_garbage = experts(x_garbage, counts)
    assert torch.equal(out[:48], out_garbage[:48]) and torch.count_nonzero(out[48:]) == 0
    expected = run_experts(experts.w1_EFD, experts.w2_EDF, experts.w3_EFD, x[:48], counts, recipe)
    assert torch.equal(out[:48], expected)


EXPECTED = {  # recipe -> (converted Linears, converted routed-experts modules) on the DeepSeek-V3 / Qwen3 debug models
    "deepseek_v3_debugmodel_nvfp4_four_over_six": (0, 5),
    "deepseek_v3_debugmodel_nvfp4_four_over_six_dequantized": (0, 4),
    "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears": (42, 5),
    "deepseek_v3_debugmodel_nvfp4_all_linears": (42, 5),
    "deepseek_v3_debugmodel_bf16": (0, 0),
    "qwen3_moe_debug_nvfp4_four_over_six": (0, 8),
    "qwen3_moe_debug_nvfp4": (0, 8),
    "qwen3_moe_debug_bf16": (0, 0),
    "qwen3_moe_debug_nvfp4_four_over_six_all_linears": (16, 8),  # 8 layers: fused qkv and out in 0.3
    "qwen3_moe_debug_nvfp4_all_linears": (16, 8),
    "deepseek_v3_debugmodel_nvfp4_full": (28, 4),  # layers 1-4: 4 attention + 3 shared-expert Linears each
    "deepseek_v3_debugmodel_nvfp4_four_over_six_full": (28, 4),
    "qwen3_moe_debug_nvfp4_full": (12, 6),  # layers 1-6: 2 attention Linears each in 0.3 (fused qkv, out)
    "qwen3_moe_debug_nvfp4_four_over_six_full": (12, 6),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_registry_recipes_convert_the_modules_of_their_toml(name):
    config = getattr(config_registry, name)()
    assert isinstance(config, FourOverSixTrainer.Config)
    check_config(config)
    model = config.model_spec.model
    for converter in config.model.converters:
        section = getattr(getattr(config.quantize, converter.split(".")[1]), "four_over_six")
        model = section.build().convert(model)
    dense, experts = converted_fqns(model)
    assert (len(dense), len(experts)) == EXPECTED[name]
    assert tt_trainer.has_quantization(model) == any(EXPECTED[name])


def parse(*args):
    return ConfigManager().parse_args(["--module", "titan_fp4six.integration.tt03", *args])


def test_cli_overrides_reach_every_knob_and_bad_values_name_the_field(capsys):
    config = parse("--config", "deepseek_v3_debugmodel_nvfp4_four_over_six",
                   "--quantize.grouped_mm.four_over_six.scale_bound", "448",
                   "--quantize.grouped_mm.four_over_six.scope", "none", "--training.steps", "3")
    section = config.quantize.grouped_mm.four_over_six
    assert (section.scale_bound, section.scope, config.training.steps) == (448, "none", 3)
    with pytest.raises(SystemExit):
        parse("--config", "deepseek_v3_debugmodel_nvfp4_four_over_six", "--quantize.grouped_mm.four_over_six.gemm",
              "fast")
    assert "quantize.grouped_mm.four_over_six.gemm='fast' is not supported" in capsys.readouterr().err.replace("\n", "")


def test_a_section_without_its_converter_and_unknown_converters_are_errors():
    config = parse("--config", "deepseek_v3_debugmodel_bf16", "--quantize.linear.four_over_six.scale_bound", "448")
    with pytest.raises(ValueError, match=r"\[quantize\.linear\.four_over_six\] is configured but model\.converters=\[\] "
                                         r"does not list"):
        check_config(config)
    config = parse("--config", "deepseek_v3_debugmodel_bf16", "--model.converters", "quantize.linear.four_over_sx")
    with pytest.raises(ValueError, match=r"lists \['quantize\.linear\.four_over_sx'\], which no converter is registered "
                                         r"as; valid: quantize\.grouped_mm\.four_over_six, quantize\.linear"):
        check_config(config)


def test_experts_under_tensor_parallelism_are_an_error_naming_the_knobs():
    """The same rule and message as torchtitan 0.2's (rules.check_whole_expert_weights), without 0.2's
    expert_tensor_parallel_degree, which torchtitan 0.3 does not have."""
    config = parse("--config", "deepseek_v3_debugmodel_nvfp4_four_over_six", "--parallelism.tensor_parallel_degree",
                   "2")
    with pytest.raises(ValueError, match=r"quantize\.grouped_mm\.four_over_six with tensor parallelism over the "
                                         r"experts \(parallelism\.tensor_parallel_degree=2, expert_parallel_degree=1\)"):
        check_config(config)


def test_the_readme_command_trains_on_the_cpu_with_map4_and_mfu(tmp_path):
    """python -m titan_fp4six.train with 0.3's --module/--config: step lines with loss, MFU and map-to-4."""
    cmd = [sys.executable, "-m", "titan_fp4six.train", "--module", "titan_fp4six.integration.tt03", "--config",
           "deepseek_v3_debugmodel_nvfp4_four_over_six", "--training.steps", "2", "--training.local_batch_size", "2",
           "--training.seq_len", "64", "--training.mixed_precision_param", "float32", "--metrics.log_freq", "1",
           "--lr_scheduler.warmup_steps", "1", "--dump_folder", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    steps = [line for line in run.stdout.splitlines() if "step:" in line and "loss:" in line]
    assert len(steps) == 2
    assert all("four_over_six map4: 0." in s and "mfu: " in s and "mfu: N/A" not in s for s in steps)
    assert "MFU is computed against the bf16 peak" in run.stdout


def test_a_non_finite_loss_stops_the_run_unless_allowed(tmp_path):
    """The 0.3 trainer stops as the 0.2 launcher does: lr 1e30 turns the weights non-finite after step 1; with
    log_freq 5 the record is read at the last step (3) and names the first bad step."""
    cmd = [sys.executable, "-m", "titan_fp4six.train", "--module", "titan_fp4six.integration.tt03", "--config",
           "deepseek_v3_debugmodel_nvfp4_four_over_six", "--training.steps", "3", "--training.local_batch_size", "2",
           "--training.seq_len", "64", "--training.mixed_precision_param", "float32", "--metrics.log_freq", "5",
           "--lr_scheduler.warmup_steps", "1", "--optimizer.param_groups.0.optimizer_kwargs.lr", "1e30",
           "--dump_folder", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = lambda *extra: subprocess.run(cmd + list(extra), cwd=ROOT, env=env, stdout=subprocess.PIPE,  # noqa: E731
                                        stderr=subprocess.STDOUT, text=True, timeout=600)
    stopped = run()
    assert stopped.returncode != 0
    stop = r"FloatingPointError: step 2: non-finite .*; stopped at step 3 \(the first step that read it\)"
    assert re.search(stop, stopped.stdout), stopped.stdout[-3000:]
    assert run("--training.allow_nonfinite").returncode == 0


@pytest.mark.parametrize("tool", [["titan_fp4six.rl"], ["titan_fp4six.export", "--checkpoint", "c", "--out", "o"],
                                  ["titan_fp4six.dry_run"], ["titan_fp4six.dry_run", "--rl", "--nproc", "8"]])
def test_the_0_2_only_tools_name_the_versions_under_0_3(tool):
    """They died at import with a bare ModuleNotFoundError from inside torchtitan 0.3, naming no version."""
    proc = subprocess.run([sys.executable, "-m", *tool, "--job.config_file", "x.toml"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode != 0
    assert re.search(r"ImportError: python -m [\w.]+(?: --rl)? is the integration for torchtitan 0\.2\.x, but "
                     r"torchtitan 0\.3\.\d+ is installed: use ", proc.stderr), proc.stderr[-2000:]
