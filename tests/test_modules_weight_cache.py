"""Weights quantized once per optimizer step (cache_weights): the ops' quantized_weight argument, the modules'
WeightCache, its invalidation, and the same bytes as quantizing on every forward."""

import copy

import pytest
import torch
from torch import nn
from torchtitan.models.moe.moe import GroupedExperts

from titan_fp4six.modules import FourOverSixLinear, convert_experts, invalidate_weight_caches
from titan_fp4six.ops import (FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear,
                              quantize_grouped_weight, quantize_linear_weight)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
DENSE_RECIPES = [FourOverSixRecipe(backward=b, weight_block=wb) for b in ("quantized", "high_precision", "dequantized")
                 for wb in ("16x16", "1x16")] + [FourOverSixRecipe(activation_scaling="row"),
                                                 FourOverSixRecipe(activation_scaling="row", backward="quantized")]
GROUPED_RECIPES = [FourOverSixRecipe(backward=b, weight_block=wb)
                   for b in ("quantized", "high_precision", "dequantized") for wb in ("16x16", "1x16")] + [
    FourOverSixRecipe(activation_scaling="row"), FourOverSixRecipe(activation_scaling="row", backward="quantized")]


def _grads(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*tensors)
    out.backward(torch.randn_like(out, generator=torch.Generator(out.device).manual_seed(3)))
    return out, *(t.grad for t in tensors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", DENSE_RECIPES, ids=str)
def test_linear_with_a_quantized_weight_gives_the_same_bytes(device, recipe):
    torch.manual_seed(0)
    x = torch.randn(40, 64, device=device, dtype=torch.bfloat16)
    w = (torch.randn(48, 64, device=device) * 0.1).to(torch.bfloat16)
    qw = quantize_linear_weight(w, recipe=recipe)
    fresh = _grads(lambda x, w: four_over_six_linear(x, w, recipe=recipe), x, w)
    reused = _grads(lambda x, w: four_over_six_linear(x, w, recipe=recipe, quantized_weight=qw), x, w)
    for a, b in zip(fresh, reused):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", GROUPED_RECIPES, ids=str)
def test_grouped_mm_with_quantized_weights_gives_the_same_bytes(device, recipe):
    torch.manual_seed(0)
    A = torch.randn(80, 64, device=device, dtype=torch.bfloat16)
    B_t = (torch.randn(3, 32, 64, device=device) * 0.1).to(torch.bfloat16).transpose(-2, -1)
    offs = torch.tensor([16, 16, 64], dtype=torch.int32, device=device)  # an empty group and 16 tail rows
    qw = quantize_grouped_weight(B_t, recipe=recipe)
    fresh = _grads(lambda A, B: four_over_six_grouped_mm(A, B.transpose(-2, -1), offs, recipe=recipe), A,
                   B_t.transpose(-2, -1))
    reused = _grads(lambda A, B: four_over_six_grouped_mm(A, B.transpose(-2, -1), offs, recipe=recipe,
                                                          quantized_weight=qw), A, B_t.transpose(-2, -1))
    for a, b in zip(fresh, reused):
        assert torch.equal(a, b)


def test_a_quantized_weight_of_another_weight_or_recipe_is_refused():
    x, w = torch.randn(4, 64), torch.randn(48, 64)
    qw = quantize_linear_weight(w, recipe=FourOverSixRecipe())
    with pytest.raises(ValueError, match=r"made from a torch.float32 weight of shape \(48, 64\).*weight is a "
                                         r"torch.float32 weight of shape \(32, 64\)"):
        four_over_six_linear(x, w[:32], recipe=FourOverSixRecipe(), quantized_weight=qw)
    with pytest.raises(ValueError, match="recipe mae"):
        four_over_six_linear(x, w, recipe=FourOverSixRecipe(err_mode="mae"), quantized_weight=qw)
    with pytest.raises(ValueError, match="bfloat16"):
        four_over_six_linear(x.bfloat16(), w.bfloat16(), recipe=FourOverSixRecipe(), quantized_weight=qw)
    with pytest.raises(ValueError, match=r"N \(weight.shape\[0\]\) is 40"):
        quantize_linear_weight(torch.randn(40, 64), recipe=FourOverSixRecipe())


def _accumulate(module, xs, step=None):
    """Forward + backward over the micro-batches xs (gradients accumulate), then the optimizer step if given."""
    outs = []
    for x in xs:
        out = module(x)
        out.float().square().mean().backward()
        outs.append(out.detach())
    if step is not None:
        step()
    return outs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(backward="dequantized"),
                                    FourOverSixRecipe(backward="high_precision", weight_block="1x16")], ids=str)
def test_linear_cache_quantizes_once_per_step_and_matches(device, recipe):
    torch.manual_seed(0)
    plain = nn.Linear(64, 48, bias=True, device=device)
    fresh, cached = (FourOverSixLinear.from_linear(copy.deepcopy(plain), recipe, cache_weights=c) for c in (0, 1))
    fresh.weight_cache is None and cached.weight_cache is not None or pytest.fail("cache_weights not applied")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True) for m in (fresh, cached)]  # no version bumps
    for step in range(3):
        xs = [torch.randn(24, 64, device=device) for _ in range(3)]
        with torch.autocast(device, dtype=torch.bfloat16):  # fp32 parameters, bf16 operands as in training
            outs = [_accumulate(m, xs) for m in (fresh, cached)]
        for opt in opts:
            opt.step()
            opt.zero_grad()
        invalidate_weight_caches(cached)  # what the torchtitan converters' post_optimizer_hook does
        assert all(torch.equal(a, b) for a, b in zip(*outs))
        assert torch.equal(fresh.weight, cached.weight)
        assert cached.weight_cache.quantizations == step + 1  # once per step, not per micro-batch


def test_linear_cache_requantizes_when_the_weight_or_its_cast_changes():
    torch.manual_seed(0)
    m = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe(), cache_weights=True)
    x = torch.randn(8, 64)
    m(x)
    m(x)
    assert m.weight_cache.quantizations == 1
    with torch.no_grad():
        m.weight.mul_(2)  # an in-place edit bumps the version counter: a checkpoint load, a manual update
    assert torch.equal(m(x), four_over_six_linear(x, m.weight, m.bias, recipe=m.recipe))
    assert m.weight_cache.quantizations == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(x)
    assert m.weight_cache.quantizations == 3  # the bf16 cast is another operand
    stale = m(x)
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(m.weight):
        m.weight.mul_(2)  # what a fused optimizer or FSDP2's all-gather looks like: same version
    assert torch.equal(m(x), stale) and m.weight_cache.quantizations == 4  # unseen until invalidated
    invalidate_weight_caches(m)
    assert torch.equal(m(x), four_over_six_linear(x, m.weight, m.bias, recipe=m.recipe))
    assert m.weight_cache.quantizations == 5


def test_linear_cache_requantizes_when_the_parameters_data_is_replaced():
    """`p.data = new` (an EMA swap, a weight sync) kept serving the old quantized weight."""
    torch.manual_seed(0)
    m = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe(), cache_weights=True)
    x = torch.randn(8, 64)
    m(x)
    m.weight.data = torch.randn(48, 64)
    assert torch.equal(m(x), four_over_six_linear(x, m.weight, m.bias, recipe=m.recipe))
    assert m.weight_cache.quantizations == 2


def test_a_deep_copy_never_serves_the_originals_cached_weights():
    """The copy's parameters are new tensors: a load_state_dict brings their version counters to the copied
    entry's, which served the old weights."""
    torch.manual_seed(0)
    m = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe(), cache_weights=True)
    other = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe())
    x = torch.randn(8, 64)
    m(x)
    twin = copy.deepcopy(m)
    twin.load_state_dict(other.state_dict())
    assert torch.equal(twin(x), other(x))
    assert m.weight_cache.quantizations == 1 and twin.weight_cache.quantizations == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(backward="dequantized")], ids=str)
def test_experts_cache_quantizes_once_per_step_and_matches(device, recipe):
    torch.manual_seed(0)
    base = GroupedExperts(64, 32, 4, use_grouped_mm=True)
    with torch.no_grad():
        base.init_weights(0.1)
    base = base.to(device=device, dtype=torch.bfloat16)
    fresh, cached = (convert_experts(copy.deepcopy(base), recipe, cache_weights=c) for c in (False, True))
    counts = torch.tensor([10, 0, 25, 5], device=device)
    for step in range(2):
        xs = [torch.randn(40, 64, device=device, dtype=torch.bfloat16) for _ in range(2)]
        outs = [[] for _ in range(2)]
        for x in xs:
            for out, m in zip(outs, (fresh, cached)):
                y = m(x, counts)
                y.float().square().mean().backward()
                out.append(y.detach())
        assert all(torch.equal(a, b) for a, b in zip(*outs))
        for name in ("w1", "w2", "w3"):
            assert torch.equal(getattr(fresh, name).grad, getattr(cached, name).grad)
        for m in (fresh, cached):
            with torch.no_grad():
                for p in m.parameters():
                    p.sub_(1e-2 * p.grad)
                    p.grad = None
        invalidate_weight_caches(cached)
        assert cached.weight_cache.quantizations == 3 * (step + 1)  # w1, w2, w3 once per step


def _fresh(m, x):
    return four_over_six_linear(x, m.weight, m.bias, recipe=m.recipe)


def test_linear_cache_follows_the_writes_of_an_ema_or_a_weight_sync():
    """Issue 66 row 6: `p.data.copy_(new)` (and a fused optimizer's step) kept serving the old quantized weight
    until invalidate_weight_caches; now every common write re-quantizes, and reads do not."""
    torch.manual_seed(0)
    m = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe(), cache_weights=True)
    x = torch.randn(8, 64)
    m(x)
    writes = [lambda w: w.data.copy_(torch.randn(48, 64)),  # a weight sync, an EMA swap
              lambda w: w.data.lerp_(torch.randn(48, 64), 0.1),
              lambda w: w.copy_(torch.randn(48, 64)),  # under no_grad
              lambda w: w.lerp_(torch.randn(48, 64), 0.1),
              lambda w: setattr(w, "data", torch.randn(48, 64))]
    for n, write in enumerate(writes):
        with torch.no_grad():
            write(m.weight)
        assert torch.equal(m(x), _fresh(m, x)), n
        m(x)
        assert m.weight_cache.quantizations == n + 2, n  # once per write, not per forward
    kept = m.weight.data  # a tensor kept for later syncs: written after the cache read it
    m(x)
    kept.copy_(torch.randn(48, 64))
    assert torch.equal(m(x), _fresh(m, x))
    del kept
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)  # bumps no version counter
    m(x).square().mean().backward()
    opt.step()
    assert torch.equal(m(x), _fresh(m, x))
    assert isinstance(m.weight, nn.Parameter) and set(m.state_dict()) == {"weight", "bias"}


def test_writes_through_data_stay_invisible_to_autograd_and_copies_work():
    """The cache follows `.data` writes without bumping the parameter's version: autograd still lets them
    happen between forward and backward, as for any nn.Parameter; copies and pickles hold plain values."""
    torch.manual_seed(0)
    m = FourOverSixLinear(64, 48, recipe=FourOverSixRecipe(), cache_weights=True)
    x = torch.randn(8, 64)
    y = m(x)
    m.weight.data.mul_(1)
    y.square().mean().backward()
    assert m.weight.grad is not None
    twin = copy.deepcopy(m)
    twin.weight.data.copy_(torch.randn(48, 64))
    assert torch.equal(twin(x), _fresh(twin, x)) and not torch.equal(twin.weight, m.weight)
    assert torch.equal(m(x), _fresh(m, x))


def test_experts_cache_follows_writes_through_data():
    torch.manual_seed(0)
    base = GroupedExperts(64, 32, 4, use_grouped_mm=True)
    with torch.no_grad():
        base.init_weights(0.1)
    fresh, cached = (convert_experts(copy.deepcopy(base), FourOverSixRecipe(), cache_weights=c) for c in (0, 1))
    x, counts = torch.randn(40, 64), torch.tensor([10, 0, 25, 5])
    assert torch.equal(fresh(x, counts), cached(x, counts))
    for m in (fresh, cached):
        m.w2.data.copy_(base.w2 * 0.5)
    assert torch.equal(fresh(x, counts), cached(x, counts))
    assert cached.weight_cache.quantizations == 4
