"""Weights as an inference checkpoint holds them (ops/checkpoint.py): the global factor gives back an amax with
exactly that factor; a loaded weight (codes, scales, amax only) runs the training forward's op, bit for bit."""

import pytest
import torch

from titan_fp4six.numerics.reference import global_decode_factor
from titan_fp4six.ops import (FourOverSixRecipe, QuantizedWeight, four_over_six_grouped_mm, four_over_six_mm,
                              loaded_weight_grouped_mm, loaded_weight_grouped_mms, loaded_weight_mm, quantize_grouped_weight,
                              quantize_linear_weight)
from titan_fp4six.ops.checkpoint import amax_for_factor, serving_knobs, serving_recipe, weight_tensors


@pytest.mark.parametrize("bound", [256, 448])
def test_amax_for_factor_gives_an_amax_with_exactly_that_factor(bound):
    g = torch.Generator().manual_seed(0)
    amax = torch.rand(100_000, generator=g) * torch.exp(torch.randn(100_000, generator=g) * 20)
    amax = torch.cat([amax, torch.tensor([0.0, 1e-42, 3e38, float("inf"), float("nan")])])
    factor = global_decode_factor(amax, bound)
    back = amax_for_factor(factor, bound)
    same = (global_decode_factor(back, bound) == factor) | (factor.isnan() & back.isnan())
    assert bool(same.all())
    with pytest.raises(ValueError, match=r"weight_scale_2 holds -0.5: a global decode factor amax/\(6B\) is >= 0"):
        amax_for_factor(torch.tensor([1.0, -0.5]), bound)


def test_a_compressed_tensors_divisor_could_not_carry_every_factor():
    """Why the export writes ModelOpt's multiplier: engines decode compressed-tensors' G as fl(1/G)."""
    f = global_decode_factor(torch.rand(100_000, generator=torch.Generator().manual_seed(1)) * 10, 256)
    unreachable = (torch.reciprocal(torch.reciprocal(f)) != f).float().mean().item()
    assert 0.05 < unreachable < 0.3


def _loaded(qw: QuantizedWeight) -> QuantizedWeight:
    """The weight as the checkpoint carries it, read back: codes, scales, an amax from the factor."""
    t = weight_tensors(qw.codes, qw.scales, qw.amax if qw.amax.dim() == 0 else qw.amax[0], 256)
    amax = amax_for_factor(global_decode_factor(qw.amax, 256), 256)
    assert torch.equal(amax_for_factor(t["weight_scale_2"], 256).reshape(()), amax.reshape(-1)[0])
    return QuantizedWeight.loaded(t["weight"], t["weight_scale"], amax)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("block", ["16x16", "1x16"])
def test_a_loaded_linear_weight_gives_the_training_forwards_output(scaling, block, device):
    """On CUDA the Triton quantizers and the emulated GEMM: the vLLM plugin's path on Hopper."""
    g = torch.Generator().manual_seed(2)
    recipe = FourOverSixRecipe(activation_scaling=scaling, weight_block=block)
    x = torch.randn(40, 64, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(48, 64, generator=g) * 0.05).to(torch.bfloat16).to(device)
    with torch.no_grad():
        expected = four_over_six_mm(x, w, recipe=recipe)
    got = loaded_weight_mm(x, _loaded(quantize_linear_weight(w, recipe=recipe)), recipe=recipe)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_loaded_expert_weights_give_the_training_forwards_output(scaling, device):
    g = torch.Generator().manual_seed(3)
    recipe = FourOverSixRecipe(activation_scaling=scaling, weight_block="1x16")
    A = torch.randn(50, 64, generator=g).to(torch.bfloat16).to(device)
    B = (torch.randn(3, 32, 64, generator=g) * 0.05).to(torch.bfloat16).to(device)  # (E, N, K)
    offs = torch.tensor([16, 16, 48], dtype=torch.int32, device=device)
    with torch.no_grad():
        expected = four_over_six_grouped_mm(A, B.transpose(-2, -1), offs, recipe=recipe)
    qw = quantize_grouped_weight(B.transpose(-2, -1), recipe=recipe)
    loaded = QuantizedWeight.loaded(qw.codes, qw.scales, amax_for_factor(global_decode_factor(qw.amax, 256), 256))
    assert torch.equal(loaded_weight_grouped_mm(A, offs, loaded, recipe=recipe), expected)
    with pytest.raises(ValueError, match=r"weight amax of shape \(3,\) for 96 rows; want \(2,\)"):
        loaded_weight_grouped_mm(A, offs[:2], loaded, recipe=recipe)
    # two weights of one A (the serving experts' w1 and w3): A quantized once, each output the single call's
    half = QuantizedWeight.loaded(loaded.codes[:48], loaded.scales[:48], loaded.amax)
    one, other = loaded_weight_grouped_mms(A, offs, [loaded, half], recipe=recipe)
    assert torch.equal(one, expected) and torch.equal(other, loaded_weight_grouped_mm(A, offs, half, recipe=recipe))


def test_serving_recipe_takes_exactly_the_serving_knobs():
    recipe = FourOverSixRecipe(err_mode="mae", scale_bound=448, scope="weights", backward="high_precision")
    knobs = serving_knobs(recipe)
    assert sorted(knobs) == sorted(["err_mode", "scale_bound", "weight_block", "activation_scaling", "scope"])
    assert serving_recipe(knobs, "m").key == FourOverSixRecipe(err_mode="mae", scale_bound=448, scope="weights").key
    with pytest.raises(ValueError, match=r"quantization_config of m: the knobs must be exactly"):
        serving_recipe({**knobs, "backward": "quantized"}, "m")
    with pytest.raises(ValueError, match=r"quantization_config of m: .*scale_bound"):
        serving_recipe({**knobs, "scale_bound": 300}, "m")
