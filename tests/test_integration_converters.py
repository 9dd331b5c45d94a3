"""The four-over-six converters on torchtitan's DeepSeek-V3 and Qwen3 MoE debug models (meta device)."""

import logging

import pytest
import torch
from torch import nn
from torchtitan.models.moe.moe import FeedForward, GroupedExperts
from torchtitan.protocols.model_converter import _registry_model_converter_cls, build_model_converters

from tests.helpers.integration_helpers import SMALL_DEEPSEEK, build_model, convert, job_config
from titan_fp4six.modules import FourOverSixLinear
from titan_fp4six.modules.experts import _FourOverSixExperts


def _shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _kinds(model):
    return {n: type(m) for n, m in model.named_modules()}


def test_converters_are_registered():
    job_config()
    for name in ("quantize.linear.four_over_six", "quantize.grouped_mm.four_over_six"):
        assert name in _registry_model_converter_cls


def test_deepseek_v3_conversion():
    job = job_config()
    model, _ = build_model("deepseek_v3", job)
    before, kinds = _shapes(model), _kinds(model)
    convert(model, job)
    assert _shapes(model) == before  # same keys (in order) and shapes: checkpoints interchange
    assert list(model.state_dict()) == list(before)
    after = _kinds(model)
    linears = [n for n, k in kinds.items() if k is nn.Linear]
    expected = {n for n in linears if n != "output" and not n.endswith("router.gate")}
    assert {n for n, k in after.items() if k is FourOverSixLinear} == expected
    assert after["output"] is nn.Linear and after["layers.1.moe.router.gate"] is nn.Linear
    experts = [n for n, k in kinds.items() if k is GroupedExperts]
    assert len(experts) == 5 and all(issubclass(after[n], _FourOverSixExperts) for n in experts)
    # shared experts stay a dense FeedForward (their Linears are dense GEMMs for the linear converter)
    assert after["layers.1.moe.shared_experts"] is FeedForward
    assert after["layers.1.moe.shared_experts.w1"] is FourOverSixLinear


def test_qwen3_moe_conversion_and_first_last_layers_in_bf16():
    job = job_config("--quantize.linear.four_over_six.bf16_first_layers", "1",
                     "--quantize.linear.four_over_six.bf16_last_layers", "2",
                     "--quantize.grouped_mm.four_over_six.bf16_last_layers", "1")
    model, args = build_model("qwen3", job)
    before = _shapes(model)
    convert(model, job)
    assert _shapes(model) == before
    kinds = _kinds(model)
    for i in range(args.n_layers):
        linear_q = kinds[f"layers.{i}.attention.wq"] is FourOverSixLinear
        experts_q = issubclass(kinds[f"layers.{i}.moe.experts"], _FourOverSixExperts)
        assert linear_q == (1 <= i < args.n_layers - 2), i
        assert experts_q == (i < args.n_layers - 1), i
    assert model.layers["3"].moe.experts.w1.shape[0] == 64


def test_grouped_fqns_that_name_only_bf16_window_layers_are_an_error():
    job = job_config("--quantize.grouped_mm.four_over_six.fqns", "layers.0.moe.experts,layers.1.moe.experts",
                     "--quantize.grouped_mm.four_over_six.bf16_first_layers", "1",
                     converters="quantize.grouped_mm.four_over_six")
    model, _ = build_model("qwen3", job)
    with pytest.raises(ValueError, match=r"fqns entries \['layers.0.moe.experts'\] select only modules of layers kept "
                                         r"in bf16"):
        convert(model, job)


def test_grouped_fqns_cannot_catch_shared_experts():
    job = job_config("--quantize.grouped_mm.four_over_six.fqns", "shared_experts",
                     converters="quantize.grouped_mm.four_over_six")
    model, _ = build_model("deepseek_v3", job)
    with pytest.raises(ValueError, match=r"quantize.grouped_mm.four_over_six.fqns entries \['shared_experts'\]"):
        convert(model, job)
    job = job_config(converters="quantize.grouped_mm.four_over_six")
    model, _ = build_model("deepseek_v3", job)
    convert(model, job)
    assert type(model.layers["2"].moe.shared_experts) is FeedForward
    assert type(model.layers["2"].moe.shared_experts.w1) is nn.Linear  # no linear converter in this run


def test_non_quantizable_linears_are_skipped_and_logged(caplog):
    job = job_config("--quantize.linear.four_over_six.filter_fqns", "output",
                     converters="quantize.linear.four_over_six")
    model, _ = build_model("deepseek_v3", job)
    with caplog.at_level(logging.INFO):
        convert(model, job)
    assert type(model.layers["1"].moe.router.gate) is nn.Linear  # (8, 256): N=8
    assert "layers.1.moe.router.gate (out_features=8 not a multiple of 16)" in caplog.text


@pytest.mark.parametrize("fqns, filtered, match", [
    ("router.gate", "output", "cannot be converted: out_features=8 not a multiple of 16"),
    ("output", "output,router.gate", "matches quantize.linear.four_over_six.filter_fqns"),
    ("layers.0.attention.wq", "output", "kept in bf16"),
    ("attention.nope", "output", "match no nn.Linear"),
])
def test_explicit_linear_fqns_that_cannot_be_converted_are_errors(fqns, filtered, match):
    job = job_config("--quantize.linear.four_over_six.fqns", fqns, "--quantize.linear.four_over_six.filter_fqns",
                     filtered, "--quantize.linear.four_over_six.bf16_first_layers", "1")
    model, _ = build_model("deepseek_v3", job)
    with pytest.raises(ValueError, match=match):
        convert(model, job)


def test_explicit_linear_fqns_select_subtrees():
    job = job_config("--quantize.linear.four_over_six.fqns", "layers.2.attention,shared_experts.w2",
                     converters="quantize.linear.four_over_six")
    model, _ = build_model("deepseek_v3", job)
    convert(model, job)
    got = {n for n, m in model.named_modules() if type(m) is FourOverSixLinear}
    assert got == {f"layers.2.attention.{w}" for w in ("wq", "wkv_a", "wkv_b", "wo")} | {
        f"layers.{i}.moe.shared_experts.w2" for i in range(1, 6)}


def test_experts_with_unquantizable_dims_are_an_error():
    job = job_config(converters="quantize.grouped_mm.four_over_six")
    model, _ = build_model("deepseek_v3", job, moe_inter_dim=40)
    with pytest.raises(ValueError, match="not multiples of 16"):
        convert(model, job)


def test_converted_model_loads_bf16_checkpoint_both_ways():
    job = job_config()
    plain, _ = build_model("deepseek_v3", job, device="cpu", **SMALL_DEEPSEEK)
    with torch.no_grad():
        plain.init_weights()
    quant, _ = build_model("deepseek_v3", job, device="cpu", **SMALL_DEEPSEEK)
    convert(quant, job)
    quant.load_state_dict(plain.state_dict(), strict=True)
    back, _ = build_model("deepseek_v3", job, device="cpu", **SMALL_DEEPSEEK)
    back.load_state_dict(quant.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), back.state_dict().values()))


LIN, GMM = "quantize.linear.four_over_six", "quantize.grouped_mm.four_over_six"


@pytest.mark.parametrize("args, converters, match", [
    # the debug model has 6 decoder layers (routed experts in layers 1..5)
    ([f"--{LIN}.bf16_first_layers", "6"], LIN, rf"{LIN} converted no nn.Linear: {LIN}.fqns / filter_fqns / "
                                                rf"bf16_first_layers / bf16_last_layers leave nothing"),
    ([f"--{LIN}.bf16_first_layers", "3", f"--{LIN}.bf16_last_layers", "3"], LIN, f"{LIN}.allow_empty = true"),
    ([f"--{LIN}.filter_fqns", "layers,output"], LIN, rf"{LIN} converted no nn.Linear"),
    ([f"--{GMM}.bf16_last_layers", "5"], GMM, rf"{GMM} converted no routed-experts module: {GMM}.fqns"),
    ([f"--{LIN}.bf16_first_layers", "4", f"--{LIN}.bf16_last_layers", "3"], LIN,
     rf"{LIN}.bf16_first_layers=4 \+ {LIN}.bf16_last_layers=3 exceeds the model's 6 decoder layers"),
    ([f"--{GMM}.bf16_first_layers", "7"], GMM, "exceeds the model's 6 decoder layers"),
])
def test_a_converter_that_converts_nothing_is_an_error(args, converters, match):
    """Otherwise the run would train plain bf16 under a 4/6 recipe name, with INFO lines only."""
    job = job_config(*args, converters=converters)
    model, _ = build_model("deepseek_v3", job)
    with pytest.raises(ValueError, match=match):
        convert(model, job)


def test_linears_left_out_only_for_their_dims_are_named_when_nothing_converts():
    """The error blamed fqns / filter_fqns / bf16_*_layers and never named the dims (the experts converter does)."""
    from titan_fp4six.integration.rules import select_linears

    cfg = job_config().quantize.linear.four_over_six
    linears = [("layers.0.attention.wq", 40, 48), ("layers.1.feed_forward.w1", 32, 24), ("output", 40, 2048)]
    with pytest.raises(ValueError, match=rf"{LIN} converted no nn.Linear: every one it selects has a dimension .*"
                                         r"layers.0.attention.wq \(in_features=40 not a multiple of 16\); "
                                         r"layers.1.feed_forward.w1 \(out_features=24 not a multiple of 16\)"):
        select_linears(linears, cfg, LIN, set())


def test_allow_empty_opts_out_of_the_empty_conversion_error():
    job = job_config(f"--{LIN}.bf16_first_layers", "6", f"--{LIN}.allow_empty",
                     f"--{GMM}.bf16_first_layers", "6", f"--{GMM}.allow_empty")
    assert job.quantize.linear.four_over_six.allow_empty is True
    model, _ = build_model("deepseek_v3", job)
    kinds = _kinds(model)
    convert(model, job)
    assert _kinds(model) == kinds  # nothing converted, on purpose


def test_converters_run_backward_on_the_thread_that_builds_them():
    """The training loop's thread runs its backward itself (the 4/6 backward bodies are Python; the autograd
    engine's worker thread ran them 1.8-2.7x slower on the H200 host). Thread-local: checked in a fresh thread
    so the setting does not leak into other tests."""
    import threading

    from torchtitan.components.quantization import QuantizationConverter
    from torchtitan.protocols.model_converter import build_model_converters

    seen = {}

    def build():
        seen["before"] = torch._C._is_multithreading_enabled()
        converters = build_model_converters(job_config(), None)
        seen["converters"] = [type(c) for c in converters.converters]
        seen["after"] = torch._C._is_multithreading_enabled()

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    assert seen["before"] is True and seen["after"] is False
    assert seen["converters"] and all(issubclass(c, QuantizationConverter) for c in seen["converters"])


def test_cache_weights_gives_every_converted_module_a_cache_the_hook_clears():
    job = job_config("--quantize.linear.four_over_six.cache_weights")  # the linear section only
    model, _ = build_model("deepseek_v3", job)
    converters = build_model_converters(job, None)
    converters.convert(model)
    linears = [m for m in model.modules() if isinstance(m, FourOverSixLinear)]
    experts = [m for m in model.modules() if isinstance(m, _FourOverSixExperts)]
    assert linears and experts
    assert all(m.weight_cache is not None for m in linears) and all(m.weight_cache is None for m in experts)
    for m in linears:
        m.weight_cache._entries["weight"] = "stale"
    converters.post_optimizer_hook([model])
    assert all(not m.weight_cache._entries for m in linears)
