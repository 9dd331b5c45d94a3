"""Shared helpers of the RL tests: a tiny converted Qwen3 MoE and trainer-side scoring of rollouts."""

import pytest
import torch
from torchtitan.models.moe import MoEArgs

from tests.helpers.integration_helpers import build_model, convert, job_config
from titan_fp4six.rl.forward import forward

GROUPED = "quantize.grouped_mm.four_over_six"
LINEAR = "quantize.linear.four_over_six"


def tiny_model(activation_scaling: str | None = "row", seed: int = 0, head_dim: int = 16, linears: bool = False):
    """A 2-layer Qwen3 MoE (8 experts, top-2) on the CPU, routed experts converted with the RL base knobs
    (activation_scaling as given) or left bf16-style (None), and with `linears` the attention's Linears too (not
    `output`, `router.gate`; the same activation scaling); fp32 weights."""
    knobs = [] if activation_scaling is None else [
        f"--{GROUPED}.activation_scaling", activation_scaling, f"--{GROUPED}.weight_block", "1x16",
        f"--{GROUPED}.backward", "high_precision"]
    converters = [GROUPED] if activation_scaling else []
    if linears:
        converters.append(LINEAR)
        knobs += [f"--{LINEAR}.filter_fqns", "output,router.gate", f"--{LINEAR}.activation_scaling", activation_scaling]
    job = job_config(*knobs, converters=",".join(converters))
    torch.manual_seed(seed)
    model, _ = build_model("qwen3", job, device="cpu", **tiny_args(head_dim))
    with torch.no_grad():
        model.init_weights()
    if converters:
        convert(model, job)
    return model


def tiny_args(head_dim: int = 16) -> dict:
    """tiny_model's Qwen3 model arguments."""
    return dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=head_dim, moe_inter_dim=32, vocab_size=2048,
                moe_args=MoEArgs(num_experts=8, num_shared_experts=0, top_k=2, score_func="softmax",
                                 route_norm=True))


def score(model, prompts, responses, ops) -> list[torch.Tensor]:
    """Trainer-side logprobs of each response token: whole right-padded sequences in one forward."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(map(len, seqs))
    device = model.tok_embeddings.weight.device
    tokens = torch.ones(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        lp = forward(model, tokens.to(device), torch.arange(width, device=device).expand(len(seqs), -1), ops)
    return [lp[i, len(p) - 1:len(p) - 1 + len(r)].gather(-1, torch.tensor(r, device=device)[:, None]).squeeze(-1)
            for i, (p, r) in enumerate(zip(prompts, responses))]


@pytest.fixture
def float_histc(monkeypatch):
    """The router's torch.histc of int64 expert ids has no CPU kernel (the CPU launcher patches it too)."""
    histc = torch.histc
    monkeypatch.setattr(torch, "histc", lambda x, *a, **k: histc(x.float(), *a, **k).to(x.dtype))
