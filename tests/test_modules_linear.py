"""FourOverSixLinear: same parameters/state_dict as nn.Linear, GEMM through the four-over-six op."""

import pytest
import torch
from torch import nn

from titan_fp4six.modules import FourOverSixLinear
from titan_fp4six.ops import FourOverSixRecipe, four_over_six_linear


def _linear(bias=True, in_f=64, out_f=48, device=None):
    torch.manual_seed(0)
    return nn.Linear(in_f, out_f, bias=bias, device=device)


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_shares_parameters_and_state_dict(bias):
    lin = _linear(bias)
    q = FourOverSixLinear.from_linear(lin, FourOverSixRecipe())
    assert q.weight is lin.weight and q.bias is lin.bias
    assert list(q.state_dict()) == list(lin.state_dict())
    assert list(q.buffers()) == []
    assert isinstance(q, nn.Linear)
    # checkpoints load both ways, strictly
    back = _linear(bias)
    back.load_state_dict(q.state_dict())
    q.load_state_dict(back.state_dict())


def test_from_linear_on_meta_device_and_rejects_subclasses():
    with torch.device("meta"):
        lin = nn.Linear(32, 16)
    q = FourOverSixLinear.from_linear(lin, FourOverSixRecipe())
    assert q.weight.is_meta and q.weight is lin.weight
    with pytest.raises(TypeError, match="plain nn.Linear"):
        FourOverSixLinear.from_linear(q, FourOverSixRecipe())


def test_a_recipe_that_is_not_a_recipe_is_a_clear_error():
    with pytest.raises(TypeError, match=r"recipe must be a titan_fp4six.FourOverSixRecipe, got str 'mse'; .*"
                                        r"FourOverSixRecipe\(err_mode='mse'\)"):
        FourOverSixLinear.from_linear(nn.Linear(64, 32), "mse")


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(err_mode="mae", weight_block="1x16"),
                                    FourOverSixRecipe(activation_scaling="row")])
def test_forward_backward_is_the_op(recipe):
    lin = _linear()
    q = FourOverSixLinear.from_linear(lin, recipe)
    x = torch.randn(3, 5, 64, requires_grad=True)
    y = q(x)
    x2 = x.detach().clone().requires_grad_()
    w2, b2 = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone().requires_grad_()
    y2 = four_over_six_linear(x2, w2, b2, recipe=recipe)
    assert torch.equal(y, y2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    assert torch.equal(x.grad, x2.grad) and torch.equal(q.weight.grad, w2.grad) and torch.equal(q.bias.grad, b2.grad)
    # quantized, so not the bf16 result, but close to it
    ref = lin(x)
    rel = (y - ref).norm() / ref.norm()
    assert 0 < rel < 0.2


def test_recipe_reaches_the_op():
    lin = _linear()
    x = torch.randn(64, 64)
    a = FourOverSixLinear.from_linear(lin, FourOverSixRecipe(err_mode="mse"))(x)
    b = FourOverSixLinear.from_linear(lin, FourOverSixRecipe(err_mode="mae", scale_bound=448))(x)
    assert not torch.equal(a, b)
    assert "err_mode='mae'" in repr(FourOverSixLinear.from_linear(lin, FourOverSixRecipe(err_mode="mae")))


def test_autocast_casts_operands_like_linear_and_keeps_the_op_exact():
    """Under AMP the op sees bf16 operands (as nn.Linear would) and runs with autocast off, so its inner
    GEMMs keep their FP32 accumulation: equal to calling the op on bf16 operands outside autocast."""
    lin = _linear()
    q = FourOverSixLinear.from_linear(lin, FourOverSixRecipe())
    x = torch.randn(32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = q(x)
    ref = four_over_six_linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16(), recipe=q.recipe)
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref)


def test_fullgraph_compile_under_autocast_equals_eager():
    """torchtitan compiles blocks with fullgraph=True and runs them under AMP on one device: the autocast
    handling must trace without a graph break."""
    q = FourOverSixLinear.from_linear(_linear(), FourOverSixRecipe())
    compiled = torch.compile(q, backend="aot_eager", fullgraph=True)
    x = torch.randn(16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(compiled(x), q(x))


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(activation_scaling="row")], ids=str)
def test_forward_and_backward_trace_shapes_on_the_meta_device(recipe):
    """Shape-only tracing, as nn.Linear allows: the ops' fake implementations give the shapes."""
    with torch.device("meta"):
        q = FourOverSixLinear.from_linear(nn.Linear(64, 32), recipe)
        x = torch.empty(3, 4, 64, requires_grad=True)
    y = q(x)
    y.sum().backward()
    assert y.shape == (3, 4, 32) and y.is_meta and x.grad.shape == x.shape and q.weight.grad.shape == (32, 64)
