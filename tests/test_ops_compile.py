"""torch.compile(fullgraph=True) of the ops gives bit-identical outputs and gradients to eager (the
quantize+GEMM pieces are custom ops, opaque to Inductor)."""

import torch
from torch._dynamo.backends.common import aot_autograd

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from titan_fp4six.quant.process_state import MAP4_STATS


class _Block(torch.nn.Module):
    """A linear (quantized backward) feeding routed experts (row-scaled, dequantized backward)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter((torch.randn(64, 32, generator=g) * 0.2).to(torch.bfloat16))
        self.experts = torch.nn.Parameter((torch.randn(4, 32, 64, generator=g) * 0.2).to(torch.bfloat16))
        self.dense = FourOverSixRecipe()
        self.grouped = FourOverSixRecipe(activation_scaling="row", backward="dequantized")

    def forward(self, x, offs):
        h = four_over_six_linear(x, self.w, recipe=self.dense)
        return four_over_six_grouped_mm(h.view(-1, 64), self.experts.transpose(-2, -1), offs, recipe=self.grouped)


def _step(fn, module, x, offs, dy):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = fn(x, offs)
    out.backward(dy)
    return [out.detach(), x.grad, module.w.grad, module.experts.grad]


def test_compiled_equals_eager_bitwise():
    torch._dynamo.reset()
    module = _Block()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 32, generator=g).to(torch.bfloat16)
    offs = torch.tensor([5, 5, 30, 40], dtype=torch.int32)
    dy = torch.randn(48, 32, generator=g).to(torch.bfloat16)
    MAP4_STATS.read_and_reset()
    eager = _step(module, module, x, offs, dy)
    eager_map4 = MAP4_STATS.read_and_reset()
    compiled = _step(torch.compile(module, fullgraph=True), module, x, offs, dy)
    assert MAP4_STATS.read_and_reset() == eager_map4 > 0  # the compiled forward feeds the stats once
    for e, c in zip(eager, compiled):
        assert e.dtype == c.dtype and torch.equal(e, c)
    assert eager[2].abs().sum() > 0 and not eager[0][40:].any()


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_runs_op_bodies_compile_records_custom_ops():
    """Eager calls skip the custom-op layer (its host cost buys nothing there); the compiled graph holds the
    opaque ops, forward and backward."""
    module = _Block()
    x = torch.randn(2, 24, 32).to(torch.bfloat16)
    offs = torch.tensor([5, 5, 30, 40], dtype=torch.int32)
    with _OpLog() as log:
        _step(module, module, x, offs, torch.ones(48, 32, dtype=torch.bfloat16))
    assert not any(n.startswith("titan_fp4six.") for n in log.names) and "aten.mm.default" in log.names
    with torch.profiler.profile() as prof:  # the eager calls still show under the ops' names in a profile
        _step(module, module, x, offs, torch.ones(48, 32, dtype=torch.bfloat16))
    assert {f"titan_fp4six::{op}" for op in ("dense_fwd", "dense_bwd", "grouped_fwd", "grouped_bwd")} <= {
        e.name for e in prof.events()}
    seen = []

    def record(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    _step(compiled, module, x, offs, torch.ones(48, 32, dtype=torch.bfloat16))
    assert {f"titan_fp4six.{op}.default" for op in ("dense_fwd", "dense_bwd", "grouped_fwd", "grouped_bwd")} <= set(
        seen), seen


def test_compiled_with_quantized_weights_equals_eager_bitwise():
    """The quantized_weight path (weights quantized ahead: its own custom ops) compiles to the eager bytes."""
    from titan_fp4six.ops import quantize_grouped_weight, quantize_linear_weight

    torch._dynamo.reset()
    module = _Block()
    qw = (quantize_linear_weight(module.w, recipe=module.dense),
          quantize_grouped_weight(module.experts.transpose(-2, -1), recipe=module.grouped))

    def forward(x, offs):
        h = four_over_six_linear(x, module.w, recipe=module.dense, quantized_weight=qw[0])
        return four_over_six_grouped_mm(h.view(-1, 64), module.experts.transpose(-2, -1), offs,
                                        recipe=module.grouped, quantized_weight=qw[1])

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 32, generator=g).to(torch.bfloat16)
    offs = torch.tensor([5, 5, 30, 40], dtype=torch.int32)
    dy = torch.randn(48, 32, generator=g).to(torch.bfloat16)
    reference = _step(module, module, x, offs, dy)
    eager = _step(forward, module, x, offs, dy)
    compiled = _step(torch.compile(forward, fullgraph=True), module, x, offs, dy)
    for r, e, c in zip(reference, eager, compiled):
        assert torch.equal(r, e) and torch.equal(e, c)
