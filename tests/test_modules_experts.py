"""Four-over-six routed experts: class factory, state_dict, padding/tail handling, the grouped op's wiring."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.moe.moe import GroupedExperts

from titan_fp4six.modules import GROUP_ALIGN, convert_experts, four_over_six_experts_class
from titan_fp4six.modules.experts import run_experts, run_experts_padded
from titan_fp4six.ops import FourOverSixRecipe, four_over_six_grouped_mm

DIM, HIDDEN, E = 64, 32, 4
COUNTS = torch.tensor([10, 0, 25, 5])


def _experts(use_grouped_mm=True):
    torch.manual_seed(0)
    e = GroupedExperts(DIM, HIDDEN, E, use_grouped_mm=use_grouped_mm)
    with torch.no_grad():
        e.init_weights(0.1)
    return e


def _x(rows):
    torch.manual_seed(1)
    return torch.randn(rows, DIM)


def test_factory_is_cached_per_parent_class():
    class OtherExperts(GroupedExperts):
        pass

    cls = four_over_six_experts_class(GroupedExperts)
    assert cls is four_over_six_experts_class(GroupedExperts)
    assert issubclass(cls, GroupedExperts)
    other = four_over_six_experts_class(OtherExperts)
    assert other is not cls and issubclass(other, OtherExperts)
    assert four_over_six_experts_class(cls) is cls


def test_convert_in_place_keeps_parameters_and_state_dict():
    e = _experts()
    params, keys = {n: p for n, p in e.named_parameters()}, list(e.state_dict())
    out = convert_experts(e, FourOverSixRecipe())
    assert out is e and type(e).__name__ == "FourOverSixGroupedExperts"
    assert {n: p for n, p in e.named_parameters()} == params and list(e.state_dict()) == keys
    with torch.no_grad():
        e.init_weights(0.02)  # the parent's init still applies
    with pytest.raises(TypeError, match="3-D"):
        convert_experts(nn.Linear(4, 4), FourOverSixRecipe())
    with pytest.raises(TypeError, match="recipe must be a titan_fp4six.FourOverSixRecipe, got dict"):
        convert_experts(_experts(), {"err_mode": "mse"})


def _manual(e, x, counts, recipe):
    """The three grouped GEMMs on exactly the token rows (no padding, no tail)."""
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    h = F.silu(four_over_six_grouped_mm(x, e.w1.transpose(-2, -1), offs, recipe=recipe))
    h = h * four_over_six_grouped_mm(x, e.w3.transpose(-2, -1), offs, recipe=recipe)
    return four_over_six_grouped_mm(h, e.w2.transpose(-2, -1), offs, recipe=recipe)


@pytest.mark.parametrize("use_grouped_mm", [True, False])  # False: where torchtitan would loop over experts
def test_forward_runs_the_grouped_op_with_aligned_groups(use_grouped_mm):
    recipe = FourOverSixRecipe()
    e = _experts(use_grouped_mm)
    bf16_ref = copy.deepcopy(e)
    bf16_ref.use_grouped_mm = False  # torchtitan's padded grouped path needs its Triton kernel (no CPU path)
    convert_experts(e, recipe)
    x = _x(int(COUNTS.sum()))
    out = e(x, COUNTS.float())  # torchtitan's histc hands float counts
    # zero padding rows change no amax and no token row
    assert torch.allclose(out, _manual(e, x, COUNTS, recipe), rtol=1e-5, atol=1e-6)
    ref = bf16_ref(x, COUNTS)
    rel = (out - ref).norm() / ref.norm()
    assert 0 < rel < 0.35  # three chained NVFP4 GEMMs give ~0.26 here; swapping w1 and w3 gives ~0.55


@pytest.mark.parametrize("recipe", [
    FourOverSixRecipe(backward="quantized", wgrad_rht=True, gradient_rounding="stochastic"),
    FourOverSixRecipe(backward="quantized", activation_scaling="row", weight_block="1x16"),
    FourOverSixRecipe(backward="dequantized"), FourOverSixRecipe(backward="high_precision")])
@pytest.mark.parametrize("cached", [False, True])
def test_gate_and_up_share_one_quantization_of_their_input_bitwise(recipe, cached):
    """w1 and w3 read the same tokens: the chain quantizes them once (four_over_six_grouped_mms) and, in the
    quantized backward, A^T once for both wgrads; outputs and every gradient are the bytes of three separate
    grouped GEMMs under autograd, the stochastic dy's seeds included (the shared backward runs w3's GEMM first,
    as autograd does)."""
    from titan_fp4six.ops import quantize_grouped_weight
    from titan_fp4six.quant.process_state import set_rounding_seed

    e = _experts()
    counts = torch.tensor([16, 0, 33, 7])
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    x = _x(int(counts.sum())).bfloat16()
    grads = []
    for shared in (False, True):
        ws = [w.detach().bfloat16().requires_grad_() for w in (e.w1, e.w2, e.w3)]
        xs = x.clone().requires_grad_()
        qws = [quantize_grouped_weight(w.transpose(-2, -1), recipe=recipe) if cached else None for w in ws]
        set_rounding_seed(7, 3)
        if shared:
            out = run_experts(*ws, xs, counts, recipe, rows=int(offs[-1]), quantized=tuple(qws))
        else:
            def mm(i, a):
                return four_over_six_grouped_mm(a, ws[i].transpose(-2, -1), offs, recipe=recipe,
                                                quantized_weight=qws[i])
            out = mm(1, F.silu(mm(0, xs)) * mm(2, xs))
        out.float().square().sum().backward()
        grads.append([out, xs.grad, *(w.grad for w in ws)])
    for want, got in zip(*grads):
        assert torch.equal(want, got)
    assert grads[1][1].abs().sum() > 0 and grads[1][2][1].abs().sum() == 0  # expert 1 got no tokens


def test_the_chain_quantizes_each_gemm_input_once():
    """A profiled step of the chain with the quantized backward: x (A, then the gate's product) and x_t are
    quantized twice, once per distinct input, not three times; each weight, dy and dy_t once per GEMM."""
    recipe = FourOverSixRecipe(backward="quantized")
    e = _experts()
    x = _x(int(COUNTS.sum())).requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_experts(e.w1, e.w2, e.w3, x, COUNTS, recipe).sum().backward()
    roles = [ev.name.removeprefix("titan_fp4six quantize ") for ev in prof.events()
             if ev.name.startswith("titan_fp4six quantize ")]
    assert sorted(roles) == sorted(["x", "x_t"] * 2 + ["w", "dy", "dy_t"] * 3), roles


def test_padded_groups_are_multiples_of_the_alignment(monkeypatch):
    seen = []
    import titan_fp4six.modules.experts as mod

    real = mod.experts_forward
    monkeypatch.setattr(mod, "experts_forward", lambda *a, **k: seen.append((a[0].shape[0], a[1].clone())) or real(*a, **k))
    e = convert_experts(_experts(), FourOverSixRecipe())
    e(_x(int(COUNTS.sum())), COUNTS)
    rows, sizes = seen[0]
    assert rows == int(sizes.sum()) and bool((sizes % GROUP_ALIGN == 0).all())
    assert sizes.tolist() == [GROUP_ALIGN, 0, GROUP_ALIGN, GROUP_ALIGN]


def test_over_allocated_tail_never_reaches_an_amax():
    """EP-style buffer: groups already padded, rows past offs[-1] hold garbage; output there is zero and the
    token rows are bit-identical to a run without the tail."""
    recipe = FourOverSixRecipe()
    e = convert_experts(_experts(), recipe)
    counts = torch.tensor([16, 0, 32, 16], dtype=torch.int32)
    real = _x(64)
    tail = torch.full((40, DIM), 1e4)
    x = torch.cat([real, tail]).requires_grad_()
    out = run_experts(e.w1, e.w2, e.w3, x, counts, recipe)
    assert out.shape == x.shape
    assert torch.equal(out[64:], torch.zeros(40, DIM))
    assert torch.equal(out[:64], run_experts(e.w1, e.w2, e.w3, real, counts, recipe))
    out.sum().backward()
    assert torch.equal(x.grad[64:], torch.zeros(40, DIM)) and x.grad[:64].abs().sum() > 0


def test_backward_reaches_weights_and_inputs():
    recipe = FourOverSixRecipe()
    e = convert_experts(_experts(), recipe)
    x = _x(int(COUNTS.sum())).requires_grad_()
    e(x, COUNTS).square().sum().backward()
    for w in (e.w1, e.w2, e.w3):
        assert w.grad is not None and w.grad.shape == w.shape and torch.isfinite(w.grad).all()
    assert e.w1.grad[1].abs().sum() == 0 and e.w1.grad[0].abs().sum() > 0  # expert 1 got no tokens
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # same gradients as the unpadded composition (padding rows carry zero gradient)
    x2 = x.detach().clone().requires_grad_()
    w = [p.detach().clone().requires_grad_() for p in (e.w1, e.w2, e.w3)]
    run_experts_padded(*w, x2, COUNTS, recipe, align=16).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(e.w2.grad, w[1].grad, rtol=1e-4, atol=1e-4)


def test_autocast_runs_the_op_on_bf16_operands_without_autocast_inside():
    recipe = FourOverSixRecipe()
    e = convert_experts(_experts(), recipe)
    x = _x(int(COUNTS.sum()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = e(x, COUNTS)
    w = [p.detach().bfloat16() for p in (e.w1, e.w2, e.w3)]
    assert out.dtype == x.dtype  # like torchtitan's experts: output in the routed input's dtype
    assert torch.equal(out, run_experts_padded(*w, x.bfloat16(), COUNTS, recipe).float())


def test_the_meta_device_is_refused_by_name():
    with torch.device("meta"):
        e = convert_experts(_experts(), FourOverSixRecipe())
        x = torch.empty(8, e.w1.shape[-1])
    with pytest.raises(NotImplementedError, match="cannot run on the meta device: its token groups are padded"):
        e(x, torch.tensor([8, 0, 0, 0], device="meta"))


def _autocast_step(e, x, counts):
    e.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        out = e(x, counts)
    out.float().square().sum().backward()
    return [out.detach(), x.grad, e.w1.grad, e.w2.grad, e.w3.grad]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
@pytest.mark.parametrize("backward", ["high_precision", "quantized"])
def test_compiled_chain_equals_eager_bitwise_in_one_graph(device, backward):
    """compile_backend (what the 0.2 converter passes when the model is compiled): on CUDA the FP32 weights' cast
    to autocast's bf16 and the gated chain run as one Inductor graph, outputs and every gradient bitwise equal to
    the eager chain, token counts changing between steps without a recompile (A's rows dynamic); on the CPU the
    chain stays eager (torch 2.11's C++ Inductor does not round the SiLU gate as eager does)."""
    from torch._dynamo.utils import counters
    base = _experts().to(device)
    recipe = FourOverSixRecipe(backward=backward)
    eager = convert_experts(copy.deepcopy(base), recipe)
    compiled = convert_experts(copy.deepcopy(base), recipe, compile_backend="inductor")
    assert "compile_backend='inductor'" in repr(compiled)
    torch._dynamo.reset()
    counters.clear()
    for counts in (COUNTS, torch.tensor([3, 7, 0, 31]), torch.tensor([16, 16, 16, 1])):
        x = _x(int(counts.sum())).to(device)
        for want, got in zip(_autocast_step(eager, x, counts.to(device)), _autocast_step(compiled, x, counts.to(device))):
            assert want.dtype == got.dtype == torch.float32 and torch.equal(want, got)
    assert counters["stats"]["unique_graphs"] == (device == "cuda")
