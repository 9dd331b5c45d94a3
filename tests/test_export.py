"""`python -m titan_fp4six.export --format bf16`: a torchtitan DCP checkpoint of the tiny Qwen3 MoE as a Hugging Face
folder; the refusals before anything is written; with transformers installed (the vLLM stage's .venv-vllm), the
exported folder loads in transformers and gives the torchtitan model's logits."""

import json
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torchtitan.config import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec

from tests.helpers.training_harness import REPO
from titan_fp4six.integration import export

RECIPE = str(REPO / "configs" / "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml")


def _job(*extra):
    return ConfigManager().parse_args(["--job.config_file", RECIPE, "--model.flavor", "tiny",
                                       "--model.hf_assets_path", str(REPO / "titan_fp4six/integration/embedded"),
                                       *extra])


def _checkpoint(tmp_path, job, bias=False, nan=False):
    """A torchtitan model-only DCP folder of the recipe's model with its own random initialization (nan: one NaN
    in an expert weight)."""
    spec = get_train_spec("qwen3")
    args = spec.model_args["tiny"]
    args.update_from_config(job)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
        if bias:
            model.layers["1"].moe.expert_bias.add_(0.5)
        if nan:
            model.layers["1"].moe.experts.w1[3, 0, 0] = float("nan")
    folder = tmp_path / "checkpoint" / "step-1"
    dcp.save(model.state_dict(), checkpoint_id=str(folder))
    return model, folder


def test_bf16_export_holds_every_weight_under_its_hf_name(tmp_path):
    job = _job()
    model, folder = _checkpoint(tmp_path, job)
    out = export.export(job, folder, tmp_path / "hf", "bf16")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    tensors = load_file(str(out / "model.safetensors"))
    adapter = get_train_spec("qwen3").state_dict_adapter(get_train_spec("qwen3").model_args["tiny"], None)
    back = adapter.from_hf(tensors)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(export._UNMAPPED)}
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k].to(torch.bfloat16)) for k in state)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in tensors and "lm_head.weight" in tensors
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == 8
    assert (config["hidden_size"], config["head_dim"], config["num_experts_per_tok"]) == (64, 32, 2)


def test_export_refuses_before_writing(tmp_path):
    job = _job()
    _, folder = _checkpoint(tmp_path / "plain", job)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(ValueError, match=r"--out .*busy exists and is not empty"):
        export.export(job, folder, busy, "bf16")
    with pytest.raises(ValueError, match=r"--format 'nvfp5'; valid: bf16"):
        export.export(job, folder, tmp_path / "a", "nvfp5")
    with pytest.raises(ValueError, match=r"not a torchtitan DCP folder"):
        export.export(job, tmp_path, tmp_path / "b", "bf16")
    _, biased = _checkpoint(tmp_path / "biased", job, bias=True)
    with pytest.raises(ValueError, match=r"routers have a learned bias \(layers.1.moe.expert_bias"):
        export.export(job, biased, tmp_path / "c", "bf16")
    other = _job("--model.flavor", "debugmodel_moe")
    with pytest.raises(ValueError, match=r"does not hold the model of .*flavor='debugmodel_moe'"):
        export.export(other, folder, tmp_path / "d", "bf16")
    deepseek = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / "deepseek_v3_debugmodel_bf16.toml")])
    with pytest.raises(ValueError, match=r"model.name='deepseek_v3': the Hugging Face export supports 'qwen3'"):
        export.export(deepseek, folder, tmp_path / "e", "bf16")
    assert not any((tmp_path / n).exists() for n in "abcde")


def test_the_bf16_export_loads_in_transformers_with_the_models_logits(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is in .venv-vllm (scripts/setup_vllm.sh)")
    from titan_fp4six.integration import cpu

    cpu.apply()  # the torchtitan MoE's CPU token permutation and integer histc, as the launcher does
    job = _job()
    model, folder = _checkpoint(tmp_path, job)
    out = export.export(job, folder, tmp_path / "hf", "bf16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))  # the exported weights, computed in FP32 on both sides
        tokens = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(1))
        ours, theirs = model(tokens).float(), hf(tokens).logits.float()
    # the same FP32 model through other kernels (attention, RMSNorm, the experts' loop): a few ulps of logits ~1
    assert (ours - theirs).abs().max().item() < 1e-4


ALL_LINEARS = str(REPO / "configs" / "qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml")


def _all_linears_job(*extra):
    return ConfigManager().parse_args(["--job.config_file", ALL_LINEARS, "--model.flavor", "tiny",
                                       "--model.hf_assets_path", str(REPO / "titan_fp4six/integration/embedded"),
                                       *extra])


def test_nvfp4_export_holds_each_converted_weight_as_the_training_forward_quantizes_it(tmp_path):
    from titan_fp4six.integration.export import converted_model
    from titan_fp4six.numerics.reference import decode_block_scaled_reference, global_decode_factor
    from titan_fp4six.ops import quantize_grouped_weight, quantize_linear_weight

    job = _all_linears_job()
    model, folder = _checkpoint(tmp_path, job)
    out = export.export(job, folder, tmp_path / "hf", "nvfp4")
    tensors = load_file(str(out / "model.safetensors"))
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "four_over_six" and q["weights_quantized_from"] == "bfloat16"
    assert q["modules"]["model.layers.0.self_attn.q_proj"] == {"err_mode": "mse", "scale_bound": 256,
                                                               "weight_block": "16x16", "activation_scaling": "tensor",
                                                               "scope": "all"}
    assert {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"} == set(q["ignore"])
    spec = get_train_spec("qwen3")
    args = spec.model_args["tiny"]
    trainer = converted_model(job, spec, args, model.state_dict())
    checked = 0
    for hf, fqn in [("model.layers.1.self_attn.k_proj", "layers.1.attention.wk"),
                    ("model.layers.0.self_attn.o_proj", "layers.0.attention.wo")]:
        mod = trainer.get_submodule(fqn)
        qw = quantize_linear_weight(mod.weight.to(torch.bfloat16), recipe=mod.recipe)
        assert torch.equal(tensors[f"{hf}.weight"], qw.codes)
        assert torch.equal(tensors[f"{hf}.weight_scale"].view(torch.uint8), qw.scales.view(torch.uint8))
        assert torch.equal(tensors[f"{hf}.weight_scale_2"], global_decode_factor(qw.amax, 256).reshape(1))
        # 16x16 tiles: one scale per tile, written on each of its 16 rows
        tiles = tensors[f"{hf}.weight_scale"].view(torch.uint8).view(-1, 16, tensors[f"{hf}.weight_scale"].shape[1])
        assert torch.equal(tiles, tiles[:, :1].expand_as(tiles))
        decoded = decode_block_scaled_reference(tensors[f"{hf}.weight"], tensors[f"{hf}.weight_scale"])
        assert torch.equal(decoded, qw.decoded)  # the trainer's bf16 block-scaled decode, bit for bit
        checked += 1
    experts = trainer.get_submodule("layers.0.moe.experts")
    for name, hf_name in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
        w = getattr(experts, name).to(torch.bfloat16)
        qw = quantize_grouped_weight(w.transpose(-2, -1), recipe=experts.recipe)
        n = w.shape[1]
        for e in (0, 5):
            prefix = f"model.layers.0.mlp.experts.{e}.{hf_name}"
            assert torch.equal(tensors[f"{prefix}.weight"], qw.codes[e * n:(e + 1) * n])
            assert torch.equal(tensors[f"{prefix}.weight_scale"].view(torch.uint8),
                               qw.scales[e * n:(e + 1) * n].view(torch.uint8))
            assert torch.equal(tensors[f"{prefix}.weight_scale_2"], global_decode_factor(qw.amax[e], 256).reshape(1))
            checked += 1
    assert checked == 8
    assert tensors["lm_head.weight"].dtype == tensors["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16


def test_nvfp4_export_refuses_what_vllm_would_run_differently(tmp_path):
    job = _all_linears_job("--quantize.linear.four_over_six.filter_fqns", "output,router.gate,wk")
    _, folder = _checkpoint(tmp_path, job)
    with pytest.raises(ValueError, match=r"vLLM runs q_proj, k_proj, v_proj of model.layers.0.self_attn as one "
                                         r"fused layer .*k_proj: bf16"):
        export.export(job, folder, tmp_path / "a", "nvfp4")
    head = _all_linears_job("--quantize.linear.four_over_six.filter_fqns", "router.gate")
    with pytest.raises(ValueError, match=r"output is converted, but vLLM runs lm_head unquantized"):
        export.export(head, folder, tmp_path / "b", "nvfp4")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_unusable_or_busy_out_is_refused_before_the_checkpoint_is_read(tmp_path):
    """They were found at mkdir, after loading and quantizing (the checkpoint here does not exist: the --out error
    must come first)."""
    job, nowhere = _job(), tmp_path / "no-checkpoint"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"--out .*file/hf: cannot write there \((NotADirectoryError|FileExistsError)"):
        export.export(job, nowhere, tmp_path / "file" / "hf", "bf16")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(ValueError, match=r"--out .*link is a dangling symlink \(to .*gone\)"):
        export.export(job, nowhere, tmp_path / "link", "bf16")
    with pytest.raises(ValueError, match=r"--out .*file exists and is not a folder"):
        export.export(job, nowhere, tmp_path / "file", "bf16")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / export.CLAIM).write_text("")  # another export writing there, or a killed one
    with pytest.raises(ValueError, match=r"--out .*busy exists and is not empty"):
        export.export(job, nowhere, tmp_path / "busy", "bf16")
    with pytest.raises(ValueError, match=r"not a torchtitan DCP folder"):
        export.export(job, nowhere, tmp_path / "new" / "deeper" / "hf", "bf16")
    assert not (tmp_path / "new").exists()  # a refused export removes the folders it made
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(ValueError, match=r"--out .*ro/hf: cannot write there \(PermissionError"):
            export.export(job, nowhere, tmp_path / "ro" / "hf", "bf16")


def test_two_overlapping_exports_into_one_folder_do_not_both_write(tmp_path, monkeypatch):
    """The --out check was not atomic: an export started while another was reading its checkpoint printed "wrote"
    too, and one of the two folders was lost."""
    job = _job()
    _, folder = _checkpoint(tmp_path, job)
    out, seen = tmp_path / "hf", []
    read = export.load_checkpoint

    def load_and_start_another(*args):
        if not seen:
            with pytest.raises(ValueError, match=r"--out .*hf exists and is not empty \(another export is writing"):
                seen.append(export.export(job, folder, out, "bf16"))
            seen.append("refused")
        return read(*args)

    monkeypatch.setattr(export, "load_checkpoint", load_and_start_another)
    export.export(job, folder, out, "bf16")
    assert seen == ["refused"] and sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_the_launchers_config_checks_run_before_the_checkpoint_is_read(tmp_path):
    """A converter typo ended in a bare KeyError after the checkpoint was read; a knob without its converter was
    ignored (training refuses it)."""
    nowhere = tmp_path / "no-checkpoint"
    typo = _job("--model.converters", "quantize.grouped_mm.four_over_sx")
    with pytest.raises(ValueError, match=r"model.converters lists \['quantize.grouped_mm.four_over_sx'\], which no "
                                         r"converter is registered as"):
        export.export(typo, nowhere, tmp_path / "a", "nvfp4")
    unused = _job("--quantize.linear.four_over_six.err_mode", "mae")
    with pytest.raises(ValueError, match=r"\[quantize.linear.four_over_six\] is configured but model.converters"):
        export.export(unused, nowhere, tmp_path / "b", "nvfp4")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_nvfp4_refuses_a_recipe_that_quantizes_nothing(tmp_path):
    """It wrote a folder labelled nvfp4 with an empty module list."""
    bf16 = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / "rl_grpo_qwen3_moe_debug_bf16.toml"),
                                       "--model.flavor", "tiny", "--model.hf_assets_path",
                                       str(REPO / "titan_fp4six/integration/embedded")])
    with pytest.raises(ValueError, match=r"--format nvfp4: model.converters=\[\] lists no four_over_six converter"):
        export.export(bf16, tmp_path / "no-checkpoint", tmp_path / "a", "nvfp4")
    empty = _job("--quantize.grouped_mm.four_over_six.bf16_first_layers", "2",
                 "--quantize.grouped_mm.four_over_six.allow_empty")
    _, folder = _checkpoint(tmp_path, empty)
    with pytest.raises(ValueError, match=r"--format nvfp4: the recipe's converters convert no module"):
        export.export(empty, folder, tmp_path / "b", "nvfp4")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_non_finite_weights_are_refused(tmp_path):
    """One NaN turned an expert's 256 block scales and its factor NaN, written without a word."""
    job = _job()
    _, folder = _checkpoint(tmp_path, job, nan=True)
    for fmt in ("nvfp4", "bf16"):
        with pytest.raises(ValueError, match=r"holds non-finite weights \(NaN/Inf\) in 1 tensors "
                                             r"\(layers.1.moe.experts.w1\): the run diverged"):
            export.export(job, folder, tmp_path / fmt, fmt)


def test_a_missing_or_truncated_shard_is_named_not_blamed_on_the_recipe(tmp_path):
    job = _job()
    _, folder = _checkpoint(tmp_path, job)
    shard = next(folder.glob("*.distcp"))
    cut = tmp_path / "cut" / "step-1"
    shutil.copytree(folder, cut)
    (cut / shard.name).write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValueError, match=rf"shard {shard.name} is truncated \(1000 bytes, its .metadata needs"):
        export.export(job, cut, tmp_path / "a", "bf16")
    (cut / shard.name).unlink()
    with pytest.raises(ValueError, match=rf"shard {shard.name} is missing"):
        export.export(job, cut, tmp_path / "b", "bf16")


def test_common_tokenizer_configs_export(tmp_path):
    """Qwen3's own "bos_token": null gave KeyError: None; an AddedToken-object eos TypeError: unhashable dict; both
    after the checkpoint was read."""
    job_dir = tmp_path / "tok"
    shutil.copytree(REPO / "titan_fp4six/integration/embedded", job_dir)
    config = json.loads((job_dir / "tokenizer_config.json").read_text())
    config.update(bos_token=None, eos_token={"content": "<|end_of_text|>", "lstrip": False, "normalized": False,
                                             "rstrip": False, "single_word": False, "special": True})
    (job_dir / "tokenizer_config.json").write_text(json.dumps(config))
    job = _job("--model.hf_assets_path", str(job_dir))
    _, folder = _checkpoint(tmp_path, job)
    out = json.loads((export.export(job, folder, tmp_path / "hf", "bf16") / "config.json").read_text())
    vocab, _, eos = export.tokenizer_ids(REPO / "titan_fp4six/integration/embedded")
    assert out["bos_token_id"] is None and out["eos_token_id"] == eos == vocab["<|end_of_text|>"]
    from titan_fp4six.rl.task import DatasetTask, Vocabulary  # the RL task reads the same two ids

    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    task = DatasetTask(tmp_path / "data.jsonl", "tests.helpers.rewards:prefix_match", job_dir, 3)
    assert task.eos == eos and task.prompts[0] == task.tokenizer.encode("1+2=", add_special_tokens=False).ids
    with pytest.raises(ValueError, match=r"the copy task's prompts start with <bos>, but .* has bos_token null"):
        Vocabulary.from_tokenizer(job_dir, "0123")
    config["eos_token"] = "<|nope|>"
    (job_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: eos_token='<\|nope\|>' is not a token of "):
        export.export(job, tmp_path / "no-checkpoint", tmp_path / "hf2", "bf16")
