"""`python -m titan_fp4six.export --format bf16`: a torchtitan DCP checkpoint of the tiny Qwen3 MoE as a Hugging Face
folder; the refusals before anything is written; with transformers installed (the vLLM stage's .venv-vllm), the
exported folder loads in transformers and gives the torchtitan model's logits."""

import json

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


def _checkpoint(tmp_path, job, bias=False):
    """A torchtitan model-only DCP folder of the recipe's model with its own random initialization."""
    spec = get_train_spec("qwen3")
    args = spec.model_args["tiny"]
    args.update_from_config(job)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
        if bias:
            model.layers["1"].moe.expert_bias.add_(0.5)
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
