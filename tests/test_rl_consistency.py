"""Consistent mode: a rollout's logprobs equal the trainer's bit for bit (row-scaled 4/6), whatever the
batch composition and padding on either side; per-tensor scaling cannot be (its amax depends on the batch)."""

import contextlib

import pytest
import torch

from tests.helpers.rl_helpers import float_histc, score, tiny_model  # noqa: F401 (fixture)
from titan_fp4six.quant.process_state import MAP4_STATS
from titan_fp4six.rl import consistent
from titan_fp4six.rl.experts import ExpertWeightCache, cached_experts
from titan_fp4six.rl.forward import forward, kernels, layout
from titan_fp4six.rl.generator import generate

TARGET = [0, 17, 42, 99, 5]
OTHERS = [[0, 7], [0, 300, 301, 302, 303, 304, 305, 306], [0, 9, 9]]


def _rollout(model, prompts, consistent_mode):
    cache = ExpertWeightCache()
    with cached_experts(model, cache) if not consistent_mode else contextlib.nullcontext():
        ro = generate(model, prompts, max_new_tokens=4, ops=kernels(consistent_mode, cache), temperature=0.0)
        return [ro.tokens[i][ro.mask[i]].tolist() for i in range(len(prompts))], [
            ro.logprobs[i][ro.mask[i]] for i in range(len(prompts))]


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))


def _mismatches(activation_scaling, device="cpu"):
    """max |trainer - rollout| of TARGET's response over {alone, batched} rollouts x {alone, batched} scoring."""
    model = tiny_model(activation_scaling).to(device)
    ops = kernels(True)
    out, rollouts = [], []
    for prompts in ([TARGET], [OTHERS[0], TARGET, *OTHERS[1:]]):
        tokens, logprobs = _rollout(model, prompts, True)
        i = prompts.index(TARGET)
        rollouts.append((tokens[i], logprobs[i]))
        alone = score(model, [TARGET], [tokens[i]], ops)[0]
        batched = score(model, [*OTHERS, TARGET], [[1, 2, 3], [4], [5, 6], tokens[i]], ops)[-1]
        out += [(alone - logprobs[i]).abs().max().item(), (batched - logprobs[i]).abs().max().item()]
    return out, rollouts


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_row_scaled_rollouts_match_the_trainer_bitwise(device):
    mismatches, ((tokens, logprobs), (tokens_b, logprobs_b)) = _mismatches("row", device)
    assert mismatches == [0.0, 0.0, 0.0, 0.0]
    assert tokens == tokens_b and torch.equal(logprobs, logprobs_b)  # greedy: same rollout alone or batched


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_per_tensor_scaling_is_not_batch_invariant(device):
    assert max(_mismatches("tensor", device)[0]) > 0


def test_consistent_kernels_are_row_independent():
    torch.manual_seed(0)
    x, w = torch.randn(9, 48), torch.randn(5, 48)
    full = consistent.product(x, w)
    assert all(torch.equal(consistent.product(x[i:i + 1], w), full[i:i + 1]) for i in range(9))
    torch.testing.assert_close(full, x @ w.t(), rtol=1e-5, atol=1e-5)
    v = torch.randn(4, 100) * 30
    torch.testing.assert_close(consistent.exp(v), torch.exp(v.clamp(-87, 88)), rtol=3e-7, atol=0)
    torch.testing.assert_close(consistent.log_softmax(v), torch.log_softmax(v, -1), rtol=0, atol=2e-6)
    # extra masked key slots (a longer cache) change nothing
    q, k, vv = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    allowed = torch.arange(6)[None, None, None, :] <= torch.tensor([2, 4])[:, None, None, None]
    short = consistent.attention(q, k[:, :, :5], vv[:, :, :5], allowed[..., :5], 0.3)
    assert torch.equal(short, consistent.attention(q, k, vv, allowed, 0.3))


def test_fast_rollouts_quantize_expert_weights_once_per_refresh(float_histc):
    model = tiny_model("row")
    cache = ExpertWeightCache()
    with cached_experts(model, cache):
        generate(model, [TARGET, OTHERS[0]], max_new_tokens=3, ops=kernels(False, cache), temperature=0.0)
        assert cache.refreshes == 2  # two MoE layers, once each for all decode steps
        generate(model, [TARGET], max_new_tokens=3, ops=kernels(False, cache), temperature=0.0)
        assert cache.refreshes == 2
        with torch.no_grad():
            model.layers["0"].moe.experts.w1.mul_(1.01)  # what an optimizer step does
        generate(model, [TARGET], max_new_tokens=3, ops=kernels(False, cache), temperature=0.0)
        assert cache.refreshes == 3
        cache.invalidate()  # what the trainer does after an optimizer step (fused AdamW keeps versions)
        generate(model, [TARGET], max_new_tokens=3, ops=kernels(False, cache), temperature=0.0)
        assert cache.refreshes == 5
    assert "forward" not in vars(model.layers["0"].moe.experts)  # patch removed
    # fast rollouts score close to the trainer's fast forward (same quantization, other reduction orders)
    tokens, logprobs = _rollout(model, [TARGET, OTHERS[1]], False)
    trainer = score(model, [TARGET, OTHERS[1]], tokens, kernels(False))
    for a, b in zip(trainer, logprobs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)


def test_rollouts_and_consistent_scoring_stay_out_of_the_map4_statistics(float_histc, monkeypatch):
    model = tiny_model("row")
    monkeypatch.setattr(MAP4_STATS, "enabled", True)  # as on a logged training step
    MAP4_STATS.read_and_reset()
    for consistent_mode in (False, True):
        tokens, _ = _rollout(model, [TARGET], consistent_mode)
    score(model, [TARGET], tokens, kernels(True))
    assert MAP4_STATS.read_and_reset() is None


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(top_p=0.0), dict(temperature=-1.0)])
def test_generate_rejects_bad_knobs(bad, float_histc):
    args = dict(max_new_tokens=2, ops=kernels(False), temperature=1.0, top_p=1.0) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        generate(tiny_model(None), [TARGET], **args)


@pytest.mark.parametrize("linears", [False, True])
def test_packed_rescoring_gives_the_padded_logprobs(linears, float_histc):
    """rl.rescoring = "packed": every sequence in one row with a per-document causal mask and positions from 0
    each. Consistent mode: the padded forward's logprobs bit for bit (row-independent kernels; masked keys add
    exact zeros); fast mode: within FP32 reduction-order noise (SDPA over other key counts)."""
    model = tiny_model("row", linears=linears)
    seqs = [TARGET + [3, 4], *OTHERS, [0, 1]]
    for consistent_mode, tol in ((True, 0.0), (False, 1e-5)):
        ops = kernels(consistent_mode)
        got = {}
        for packed in (False, True):
            b = layout(seqs, pad_id=2, packed=packed, device="cpu")
            with torch.no_grad():
                lp = forward(model, b.tokens, b.positions, ops, documents=b.documents)
            got[packed] = [lp[b.row[i], b.col[i]:b.col[i] + len(s)] for i, s in enumerate(seqs)]
        packed_row = layout(seqs, 2, True, "cpu")
        assert packed_row.tokens.shape == (1, sum(map(len, seqs)))  # no padding computed
        for a, b in zip(got[False], got[True]):
            assert (a - b).abs().max().item() <= tol, consistent_mode
