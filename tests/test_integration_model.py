"""A converted small DeepSeek-V3 (2 layers: dense + MoE) trains on the CPU; compile traces it."""

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.integration_helpers import SMALL_DEEPSEEK, build_model, convert, job_config
from titan_fp4six.modules import FourOverSixLinear
from titan_fp4six.quant.process_state import MAP4_STATS


@pytest.fixture
def float_histc(monkeypatch):
    """The router's torch.histc of int64 expert ids has no CPU kernel (the launcher's CPU mode does this too)."""
    histc = torch.histc
    monkeypatch.setattr(torch, "histc", lambda x, *a, **k: histc(x.float(), *a, **k).to(x.dtype))


@pytest.fixture(scope="module")
def models():
    job = job_config()
    torch.manual_seed(0)
    plain, args = build_model("deepseek_v3", job, device="cpu", **SMALL_DEEPSEEK)
    with torch.no_grad():
        plain.init_weights()
    quant = copy.deepcopy(plain)
    convert(quant, job)
    return plain, quant, args


def test_forward_backward_of_a_converted_moe_model(models, float_histc):
    plain, quant, args = models
    torch.manual_seed(1)
    tokens = torch.randint(0, args.vocab_size, (2, 32))
    labels = torch.randint(0, args.vocab_size, (2, 32))
    MAP4_STATS.read_and_reset()
    logits = quant(tokens)
    fraction = MAP4_STATS.read_and_reset()
    assert fraction is not None and 0 < fraction < 1
    ref = plain(tokens)
    rel = (logits - ref).norm() / ref.norm()
    assert 0 < rel < 0.25  # quantized, yet the same model
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    ref_loss = F.cross_entropy(ref.flatten(0, 1), labels.flatten())
    assert abs(loss.item() - ref_loss.item()) < 0.05 * ref_loss.item()
    loss.backward()
    moe = quant.layers["1"].moe
    for p in (moe.experts.w1, moe.experts.w2, moe.experts.w3, moe.shared_experts.w1.weight,
              quant.layers["0"].attention.wq.weight, quant.output.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_compiled_converted_module_equals_eager(models):
    """fullgraph tracing through the custom ops (fake impls) and AOTAutograd, bit-identical forward/backward.
    (Inductor equality of the ops themselves is in the ops tests; the GPU check trains with Inductor.)"""
    _, quant, args = models
    eager = quant.layers["1"].moe.shared_experts
    assert isinstance(eager.w1, FourOverSixLinear)
    compiled = torch.compile(copy.deepcopy(eager), backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 32, args.dim)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yc = eager(xe), compiled(xc)
    assert torch.equal(ye, yc)
    g = torch.randn_like(ye)
    ye.backward(g)
    yc.backward(g)
    assert torch.equal(xe.grad, xc.grad)
