"""The `four_over_six` vLLM quantization plugin on the CPU with vllm-cpu (scripts/test.sh runs this file in
.venv-vllm; elsewhere it skips): a CPU-trained tiny Qwen3 MoE (attention Linears and routed experts at the
all-Linears 4/6 recipe) exported with `--format nvfp4` loads and generates; every quantized parameter inside
the engine is the trainer's quantization of that weight; every plugin layer gives the package's op bitwise on
the inputs the engine handed it; whole-model logprobs match the trainer's on the same tokens."""

import inspect
import json
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/setup_vllm.sh makes .venv-vllm)")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec  # noqa: E402

from tests.helpers.training_harness import CPU_ARGS, REPO, train  # noqa: E402
from titan_fp4six.integration import export  # noqa: E402
from titan_fp4six.modules import FourOverSixLinear  # noqa: E402
from titan_fp4six.numerics.reference import decode_block_scaled_reference, global_decode_factor  # noqa: E402
from titan_fp4six.ops import quantize_grouped_weight, quantize_linear_weight  # noqa: E402
from titan_fp4six.quant.process_state import MAP4_STATS

CONFIG = "qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml"
ARGS = ["--training.steps", "2", "--checkpoint.enable", "--checkpoint.interval", "2",
        "--checkpoint.last_save_model_only", "--checkpoint.folder", "checkpoint"]
PROJ = {"qkv_proj": ("wq", "wk", "wv"), "o_proj": ("wo",)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the job, its folder, the nvfp4 export of its step-2 checkpoint)."""
    from titan_fp4six.integration import cpu

    cpu.apply()  # the torchtitan MoE's CPU token permutation and integer histc, as the launcher does
    tmp = tmp_path_factory.mktemp("plugin")
    train(CONFIG, tmp / "run", *ARGS)
    job = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / CONFIG), *CPU_ARGS, *ARGS,
                                      "--model.hf_assets_path", str(REPO / "titan_fp4six/integration/embedded")])
    return job, tmp, export.export(job, tmp / "run" / "checkpoint" / "step-2", tmp / "hf", "nvfp4")


@pytest.fixture(scope="module")
def served(exported):
    """(the trainer's converted model holding the checkpoint, the vLLM engine on the nvfp4 export, its model)."""
    import vllm

    from titan_fp4six.integration.export import converted_model, load_checkpoint

    job, tmp, out = exported
    spec = get_train_spec("qwen3")
    args = spec.model_args[job.model.flavor]
    args.update_from_config(job)
    trainer = converted_model(job, spec, args, load_checkpoint(job, spec, args, tmp / "run" / "checkpoint" / "step-2"))
    with torch.no_grad():  # vLLM holds the unquantized tensors in bf16 (computing in FP32): the same values here
        for name, p in trainer.named_parameters():
            if not isinstance(trainer.get_submodule(name.rpartition(".")[0]), FourOverSixLinear) \
                    and ".moe.experts." not in name:
                p.copy_(p.to(torch.bfloat16))
    llm = vllm.LLM(model=str(out), dtype="float32", max_model_len=64, max_num_seqs=4, enforce_eager=True,
                   enable_prefix_caching=False, kv_cache_memory_bytes=1 << 26, seed=0)
    models = []
    llm.apply_model(models.append)
    yield trainer, llm, models[0], json.loads((out / "config.json").read_text())
    llm.llm_engine.engine_core.shutdown()


def _sampling(**kw):
    import vllm

    return vllm.SamplingParams(**kw)


def test_the_export_loads_and_generates(served):
    _, llm, model, config = served
    assert config["quantization_config"]["quant_method"] == "four_over_six"
    methods = {type(m.quant_method).__name__ for m in model.modules() if hasattr(m, "quant_method")}
    assert {"FourOverSixLinearMethod", "FourOverSixMoEMethod", "UnquantizedLinearMethod"} <= methods
    out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}],
                       _sampling(max_tokens=6, temperature=1.0, seed=0, logprobs=0))
    for o in out:
        assert len(o.outputs[0].token_ids) == 6 and all(0 <= t < 2048 for t in o.outputs[0].token_ids)
        assert all(next(iter(lp.values())).logprob <= 0 for lp in o.outputs[0].logprobs)


def _engine_layers(model):
    return {name: m for name, m in model.named_modules() if type(getattr(m, "quant_method", None)).__name__
            in ("FourOverSixLinearMethod", "FourOverSixMoEMethod")}


def test_every_quantized_parameter_is_the_trainers_quantization(served):
    trainer, _, model, _ = served
    layers = _engine_layers(model)
    assert len(layers) == 6  # qkv_proj, o_proj and the experts of 2 layers
    for name, layer in layers.items():
        i = int(name.split(".")[2])
        if name.endswith("experts"):
            experts = trainer.get_submodule(f"layers.{i}.moe.experts")
            q = {n: quantize_grouped_weight(getattr(experts, n).transpose(-2, -1), recipe=experts.recipe)
                 for n in ("w1", "w2", "w3")}
            e, n = experts.w1.shape[:2]
            w13 = torch.cat([q["w1"].codes.view(e, n, -1), q["w3"].codes.view(e, n, -1)], 1)
            assert torch.equal(layer.w13_weight, w13)
            assert torch.equal(layer.w2_weight, q["w2"].codes.view(e, -1, q["w2"].codes.shape[-1]))
            assert torch.equal(layer.w13_weight_scale_2,
                               global_decode_factor(torch.stack([q["w1"].amax, q["w3"].amax], 1), 256))
            assert torch.equal(layer.w2_weight_scale_2, global_decode_factor(q["w2"].amax, 256))
            assert torch.equal(decode_block_scaled_reference(layer.w2_weight.flatten(0, 1),
                                                             layer.w2_weight_scale.flatten(0, 1)), q["w2"].decoded)
            continue
        mods = [trainer.get_submodule(f"layers.{i}.attention.{w}") for w in PROJ[name.rpartition(".")[2]]]
        q = [quantize_linear_weight(m.weight, recipe=m.recipe) for m in mods]
        assert torch.equal(layer.weight, torch.cat([x.codes for x in q]))
        assert torch.equal(layer.weight_scale_2, global_decode_factor(torch.stack([x.amax for x in q]), 256))
        # each weight dequantizes to the trainer's decode: the bf16 block-scaled values, then its own factor
        decoded = decode_block_scaled_reference(layer.weight, layer.weight_scale)
        assert torch.equal(decoded, torch.cat([x.decoded for x in q]))


def test_every_plugin_layer_gives_the_packages_op_on_the_engines_inputs(served):
    trainer, llm, model, _ = served
    calls = []
    layers = _engine_layers(model)
    for name, layer in layers.items():
        method = layer.quant_method
        real = type(method).apply

        def spy(*a, name=name, real=real, method=method, **kw):
            out = real(method, *a, **kw)
            calls.append((name, inspect.signature(real).bind(method, *a, **kw).arguments, out))
            return out
        method.apply = spy
    try:
        llm.generate([{"prompt_token_ids": [5, 6, 7, 8, 9]}, {"prompt_token_ids": [11, 12]}],
                     _sampling(max_tokens=3, temperature=0.0))
    finally:
        for layer in layers.values():
            del layer.quant_method.apply
    assert {n for n, _, _ in calls} == set(layers)
    with torch.inference_mode(), MAP4_STATS.paused():
        for name, args, out in calls:
            i = int(name.split(".")[2])
            if name.endswith("experts"):
                x, topk_weights, topk_ids = args["x"], args["topk_weights"], args["topk_ids"]
                experts = trainer.get_submodule(f"layers.{i}.moe.experts")
                k = topk_ids.shape[1]
                order = torch.argsort(topk_ids.flatten().long(), stable=True)
                counts = torch.bincount(topk_ids.flatten().long(), minlength=experts.w1.shape[0])
                sorted_out = experts(x.index_select(0, order // k), counts)  # the trainer's module, its own padding
                unsorted = torch.zeros_like(sorted_out).index_copy_(0, order, sorted_out).view(x.shape[0], k, -1)
                expected = torch.bmm(topk_weights.float().view(-1, 1, k), unsorted.float()).to(x.dtype).squeeze(1)
            else:
                x = args["x"]
                mods = [trainer.get_submodule(f"layers.{i}.attention.{w}") for w in PROJ[name.rpartition(".")[2]]]
                expected = torch.cat([m(x) for m in mods], dim=-1)
            assert torch.equal(out, expected), name


def test_whole_model_logprobs_match_the_trainers(served):
    trainer, llm, _, _ = served
    g = torch.Generator().manual_seed(4)
    worst = []
    for length in (12, 30, 48):
        tokens = torch.randint(2, 2048, (length,), generator=g).tolist()
        # one sequence per call: the engine's batch is the trainer's, so per-tensor amaxes cover the same tokens
        out = llm.generate([{"prompt_token_ids": tokens}], _sampling(max_tokens=1, prompt_logprobs=0))
        theirs = torch.tensor([lp[t].logprob for lp, t in zip(out[0].prompt_logprobs[1:], tokens[1:])])
        with torch.no_grad():
            ours = torch.log_softmax(trainer(torch.tensor([tokens])).float(), -1)[0, :-1]
        ours = ours.gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)
        worst.append((ours - theirs).abs().max().item())
    print("max |dlogp| per sequence:", worst)
    assert max(worst) < 1e-3


def test_a_weight_update_copied_into_the_parameters_in_place_takes_effect(served):
    """RL weight sync: new codes, scales and factor copied into the loaded parameters are what the next forward
    runs (nothing derived from them is cached)."""
    trainer, _, model, _ = served
    layer = _engine_layers(model)["model.layers.1.self_attn.qkv_proj"]
    mods = [trainer.get_submodule(f"layers.1.attention.{w}") for w in PROJ["qkv_proj"]]
    new_wq = FourOverSixLinear.from_linear(torch.nn.Linear(64, 128, bias=False), mods[0].recipe, False)
    with torch.no_grad():
        new_wq.weight.copy_(mods[0].weight.flip(0) * 1.5)
    saved = [t.clone() for t in (layer.weight, layer.weight_scale, layer.weight_scale_2)]
    q = quantize_linear_weight(new_wq.weight, recipe=new_wq.recipe)
    rows = new_wq.weight.shape[0]
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(5))
    try:
        with torch.no_grad():
            layer.weight[:rows].copy_(q.codes)
            layer.weight_scale[:rows].copy_(q.scales)
            layer.weight_scale_2[0] = global_decode_factor(q.amax, 256)
        with torch.inference_mode(), MAP4_STATS.paused():
            out = layer.quant_method.apply(layer, x)
            assert torch.equal(out, torch.cat([new_wq(x), mods[1](x), mods[2](x)], dim=-1))
    finally:
        with torch.no_grad():
            for t, s in zip((layer.weight, layer.weight_scale, layer.weight_scale_2), saved):
                t.copy_(s)


@pytest.mark.parametrize("field, value, match", [
    ("modules", ["model.layers.0.self_attn.o_proj"], r"'modules' must map each quantized module's name to its knobs "
                                                      r".*got list"),
    ("modules", None, r"'modules' must map .*got NoneType None"),
    ("ignore", "lm_head", r"'ignore' must be a list of module names, got 'lm_head'"),
])
def test_a_malformed_quantization_config_is_named(field, value, match):
    """A list or null for modules ended in AttributeError: 'list' object has no attribute 'items'."""
    from titan_fp4six.vllm_plugin.config import FourOverSixConfig

    config = {"quant_method": "four_over_six", "format": "nvfp4", "tensors": "modelopt", "group_size": 16,
              "modules": {}, "ignore": []}
    with pytest.raises(ValueError, match=match):
        FourOverSixConfig.from_config(config | {field: value})


@pytest.mark.parametrize("key, change, match", [
    ("model.layers.1.self_attn.k_proj.weight", "remove",
     r"four_over_six: model\.layers\.1\.self_attn\.qkv_proj\.weight was not loaded completely from the checkpoint "
     r"\(loaded 2 of its 3 partitions.*re-export the folder with python -m titan_fp4six\.export --format nvfp4"),
    ("model.layers.0.mlp.experts.2.down_proj.weight", "truncate",
     r"four_over_six: model\.layers\.0\.mlp\.experts\.w2_weight was not loaded completely from the checkpoint "
     r"\(w2 of local expert 2 has shape"),
    ("model.layers.1.mlp.experts.3.up_proj.weight_scale_2", "remove",
     r"four_over_six: model\.layers\.1\.mlp\.experts\.w13_weight_scale_2 was not loaded completely .*no w3 of "
     r"local expert 3"),
    ("model.layers.0.self_attn.o_proj.weight_scale_2", "nan",
     r"four_over_six: model\.layers\.0\.self_attn\.o_proj\.weight_scale_2 holds non-finite values after loading "
     r"\(1 of 1 .*re-export"),
])
def test_a_folder_with_a_missing_short_or_non_finite_quantized_tensor_is_refused_at_load(exported, tmp_path, key,
                                                                                        change, match):
    """Missing codes served uninitialized memory, a short expert tensor loaded partly, a NaN factor served NaN
    logprobs: each is refused when the engine loads, naming the layer and the parameter."""
    import shutil

    import vllm
    from safetensors.torch import load_file, save_file

    _, _, out = exported
    folder = tmp_path / "hf"
    shutil.copytree(out, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    assert key in tensors, sorted(k for k in tensors if ".layers.0." in k)
    if change == "remove":
        del tensors[key]
    elif change == "truncate":
        tensors[key] = tensors[key][:, : tensors[key].shape[1] // 2].contiguous()
    else:
        tensors[key] = torch.full_like(tensors[key], torch.nan)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception, match=match) as caught:
        vllm.LLM(model=str(folder), dtype="float32", max_model_len=64, max_num_seqs=4, enforce_eager=True,
                 enable_prefix_caching=False, kv_cache_memory_bytes=1 << 26, seed=0)
    assert isinstance(caught.value, ValueError) or isinstance(caught.value.__cause__, ValueError), caught.value


def _damaged_copy(out, folder, damage):
    """A copy of the export `out` in `folder` whose model.safetensors `damage(tensors)` edited in place."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(out, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    damage(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _as_bf16(tensors, module):
    """`module`'s quantized tensors replaced by a plain bf16 weight (its decode), as a bf16 export holds it."""
    codes, scales = tensors.pop(f"{module}.weight"), tensors.pop(f"{module}.weight_scale")
    factor = tensors.pop(f"{module}.weight_scale_2")
    tensors.pop(f"{module}.input_scale", None)
    tensors[f"{module}.weight"] = (decode_block_scaled_reference(codes, scales) * factor).to(torch.bfloat16)


@pytest.mark.parametrize("damage, match", [
    (lambda t: [_as_bf16(t, f"model.layers.0.self_attn.{p}_proj") for p in "qkv"],
     r"four_over_six: model\.layers\.0\.self_attn\.qkv_proj\.weight: config\.json's quantization_config lists "
     r"model\.layers\.0\.self_attn\.[qkv]_proj as quantized, so its weight in the checkpoint should be "
     r"torch\.uint8 codes of shape \((\d+), 32\), but the checkpoint holds torch\.bfloat16 of shape \(\1, 64\) "
     r"\(an unquantized weight"),
    (lambda t: t.update({k: t[k][:, :2].contiguous()}) if (k := "model.layers.1.self_attn.o_proj.weight_scale") else 0,
     r"four_over_six: model\.layers\.1\.self_attn\.o_proj\.weight_scale: the checkpoint's weight_scale of "
     r"model\.layers\.1\.self_attn\.o_proj has shape \(64, 2\), expected \(64, 8\) \(a 64x128 weight's block "
     r"scales\)"),
    (lambda t: _as_bf16(t, "model.layers.1.mlp.experts.2.gate_proj"),
     r"four_over_six: model\.layers\.1\.mlp\.experts\.w13_weight: config\.json's quantization_config lists "
     r"model\.layers\.1\.mlp\.experts's expert 2 \(w1\) as quantized, so its weight in the checkpoint should be "
     r"torch\.uint8 codes of shape \((\d+), 32\), but the checkpoint holds torch\.bfloat16 of shape \(\1, 64\)"),
], ids=["bf16-qkv", "short-o_proj-scale", "bf16-expert"])
def test_bf16_weights_listed_as_quantized_or_a_short_scale_name_the_layer(exported, tmp_path, damage, match):
    """Issue 66 row 18: both ended in a bare AssertionError from vLLM's loader, naming no layer."""
    import vllm

    folder = _damaged_copy(exported[2], tmp_path / "hf", damage)
    with pytest.raises(Exception, match=match) as caught:
        vllm.LLM(model=str(folder), dtype="float32", max_model_len=64, max_num_seqs=4, enforce_eager=True,
                 enable_prefix_caching=False, kv_cache_memory_bytes=1 << 26, seed=0)
    assert isinstance(caught.value, ValueError) or isinstance(caught.value.__cause__, ValueError), caught.value
