"""The `scope` knob changes exactly the operands it names, and `pad_multiple` sets the token-group padding."""

import pytest
import torch

from titan_fp4six import FourOverSixRecipe, four_over_six_quantize, row_amax, tensor_amax
from titan_fp4six.modules import convert_experts
from titan_fp4six.numerics.reference import nvfp4_reference

CHOOSERS = {"all": (True, True), "weights": (False, True), "activations": (True, False), "none": (False, False)}


def _bits(t):
    return t.view(torch.uint8)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g).to(torch.bfloat16)
    w = (torch.randn(4, 48, 128, generator=g) * 0.1).to(torch.bfloat16)
    return x, w


def _expected(t, amax, block, choose):
    return four_over_six_quantize(t, amax, block=block, choose=choose)


@pytest.mark.parametrize("scope", list(CHOOSERS))
def test_dense_scope_picks_the_operands_that_choose(scope):
    x, w = _data()
    recipe = FourOverSixRecipe(scope=scope).resolve(grouped=False)
    _, xc, xs, wc, ws, amaxes = torch.ops.titan_fp4six.dense_fwd(x, w[0], recipe.key)
    x_amax, w_amax = amaxes
    act, wgt = CHOOSERS[scope]
    for (codes, scales), t, amax, block, choose in (((xc, xs), x, x_amax, "1x16", act),
                                                     ((wc, ws), w[0], w_amax, "16x16", wgt)):
        want = _expected(t, amax, block, choose)
        other = _expected(t, amax, block, not choose)
        assert torch.equal(codes, want.codes) and torch.equal(_bits(scales), _bits(want.scales))
        assert not torch.equal(codes, other.codes)  # the data has blocks where the choice matters


@pytest.mark.parametrize("scope", list(CHOOSERS))
def test_grouped_scope_picks_the_operands_that_choose(scope):
    x, w = _data()
    offs = torch.tensor([16, 16, 48, 64], dtype=torch.int32)
    recipe = FourOverSixRecipe(scope=scope, activation_scaling="row", weight_block="1x16").resolve(grouped=True)
    fwd = torch.ops.titan_fp4six.grouped_fwd(x, [w.transpose(-2, -1)], offs, recipe.key)
    ac, as_, a_amax, (wc,), (ws,), (w_amax,) = fwd[1:7]
    act, wgt = CHOOSERS[scope]
    want_a = _expected(x, a_amax, "1x16", act)
    want_w = _expected(w.reshape(-1, 128), w_amax.repeat_interleave(48), "1x16", wgt)
    assert torch.equal(ac, want_a.codes) and torch.equal(_bits(as_), _bits(want_a.scales))
    assert torch.equal(wc, want_w.codes) and torch.equal(_bits(ws), _bits(want_w.scales))


def test_scope_none_at_bound_448_is_plain_nvfp4_on_this_data():
    """scope='none', scale_bound=448, 1x16 keeps map-to-6 only: standard NVFP4's codes and scales (the two
    compute the block scale with different associations, docs/numerics.md; on these inputs they agree)."""
    x, _ = _data()
    for amax in (tensor_amax(x), row_amax(x)):
        got = four_over_six_quantize(x, amax, scale_bound=448, choose=False)
        codes, scales = nvfp4_reference(x, amax)
        assert torch.equal(got.codes, codes) and torch.equal(_bits(got.scales), _bits(scales))
        assert not got.map4.any()


def test_pad_multiple_pads_token_groups(monkeypatch):
    from titan_fp4six.modules import experts as experts_module

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(3)
            self.w1 = torch.nn.Parameter(torch.randn(2, 32, 64, generator=g) * 0.1)
            self.w2 = torch.nn.Parameter(torch.randn(2, 64, 32, generator=g) * 0.1)
            self.w3 = torch.nn.Parameter(torch.randn(2, 32, 64, generator=g) * 0.1)

        def forward(self, x, num_tokens_per_expert):
            raise AssertionError("the converted class runs its own forward")

    seen = []
    run = experts_module.experts_forward
    monkeypatch.setattr(experts_module, "experts_forward",
                        lambda x, sizes, mm, **kw: seen.append(sizes.tolist()) or run(x, sizes, mm, **kw))
    mod = convert_experts(Experts(), FourOverSixRecipe(), pad_multiple=48)
    mod(torch.randn(20, 64), torch.tensor([5, 15]))
    assert mod.pad_multiple == 48 and seen == [[48, 48]]
    with pytest.raises(ValueError, match="pad_multiple=40; it must be a positive multiple of 16"):
        convert_experts(Experts(), FourOverSixRecipe(), pad_multiple=40)
