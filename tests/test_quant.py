"""The quant layer's public entry points: the public quantizers are opaque custom ops under torch.compile
(compiled code gets the eager bytes), fake implementations agree with the real ones, and the `quantizer` choice
is honoured."""

import pytest
import torch

from titan_fp4six import quant
from titan_fp4six.quant import QUANTIZER_ENV
from titan_fp4six.quant.backends import backends_for

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)


def _inputs(row_scaled, nan=True, rows=32, cols=64, device="cpu"):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(device)
    if nan:
        x[3, 5] = float("nan")
    return x, quant.row_amax(x) if row_scaled else quant.tensor_amax(x)


@pytest.mark.parametrize("row_scaled", [False, True])
def test_opcheck(row_scaled):
    x, amax = _inputs(row_scaled, nan=False)  # opcheck compares with assert_close, for which NaN != NaN
    ops = torch.ops.titan_fp4six
    torch.library.opcheck(ops.four_over_six_quantize, (x, amax, "1x16", "mae", 448, "auto", True))
    torch.library.opcheck(ops.four_over_six_quantize_decode, (x, amax, "1x16", "mse", 256, "auto", False))
    torch.library.opcheck(ops.nvfp4_quantize, (x, amax, "auto"))


def _quantize_all(row_scaled):
    def fn(x, amax):
        dec, blocks = quant.four_over_six_quantize_decode(x * 2, amax * 2)
        tile = quant.four_over_six_quantize(x, amax, block="1x16" if row_scaled else "16x16", err_mode="mae",
                                               scale_bound=448)
        std = quant.nvfp4_quantize(x, amax)
        return dec, blocks.codes, blocks.scales, blocks.map4, tile.codes, tile.scales, tile.map4, std.codes, std.scales

    return fn


def _assert_same_bytes(got_all, want_all):
    for got, want in zip(got_all, want_all, strict=True):
        assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("row_scaled", [False, True])
def test_compiled_graph_calls_the_custom_ops(row_scaled):
    """Dynamo records the quantizers as the opaque custom ops (not the reference's arithmetic), and the
    compiled function gives the eager bytes."""
    x, amax = _inputs(row_scaled)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    fn = _quantize_all(row_scaled)
    torch._dynamo.reset()
    _assert_same_bytes(torch.compile(fn, fullgraph=True, backend=backend)(x, amax), fn(x, amax))
    assert {"titan_fp4six.four_over_six_quantize.default", "titan_fp4six.four_over_six_quantize_decode.default",
            "titan_fp4six.nvfp4_quantize.default"} <= set(seen)
    assert not any("abs" in s or "where" in s for s in seen), seen  # no reference arithmetic traced


@pytest.mark.parametrize("row_scaled", [False, True])
def test_inductor_same_bytes_as_eager_cpu(row_scaled):
    x, amax = _inputs(row_scaled)
    fn = _quantize_all(row_scaled)
    torch._dynamo.reset()
    _assert_same_bytes(torch.compile(fn, fullgraph=True)(x, amax), fn(x, amax))


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("row_scaled", [False, True])
def test_inductor_same_bytes_as_eager_cuda(row_scaled):
    """On CUDA, Inductor's own code for the reference gave other bytes (16384x7168 bf16, 1x16, mse, 256);
    through the custom ops the compiled function runs the eager kernels."""
    x, amax = _inputs(row_scaled, rows=4096, cols=7168, device="cuda")
    fn = _quantize_all(row_scaled)
    torch._dynamo.reset()
    _assert_same_bytes(torch.compile(fn, fullgraph=True)(x, amax), fn(x, amax))


def test_fake_implementation_rejects_bad_knobs():
    x, amax = _inputs(False)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx, famax = mode.from_tensor(x), mode.from_tensor(amax)
        codes, scales, map4 = torch.ops.titan_fp4six.four_over_six_quantize(fx, famax, "1x16", "mse", 256, "auto", True)
        assert codes.shape == (32, 32) and scales.shape == (32, 4) and scales.dtype == torch.float8_e4m3fn
        with pytest.raises(ValueError, match="block"):
            torch.ops.titan_fp4six.four_over_six_quantize(fx, famax, "8x8", "mse", 256, "auto", True)


def test_quantizer_knob_is_checked_and_triton_needs_cuda(monkeypatch):
    x, amax = _inputs(False)
    with pytest.raises(ValueError, match="quantizer='cuda' is not supported; valid values: 'auto', 'triton'"):
        quant.four_over_six_quantize(x, amax, quantizer="cuda")
    with pytest.raises(ValueError, match="quantizer='triton' needs CUDA tensors"):
        quant.four_over_six_quantize(x, amax, quantizer="triton")
    try:  # the environment is read when a device is first seen: forget what was resolved so far
        backends_for.cache_clear()
        monkeypatch.setenv(QUANTIZER_ENV, "triton")  # the override wins over the knob
        with pytest.raises(ValueError, match="needs CUDA"):
            quant.nvfp4_quantize(x, amax, quantizer="reference")
        monkeypatch.setenv(QUANTIZER_ENV, "fast")
        with pytest.raises(ValueError, match=f"{QUANTIZER_ENV}='fast' is not supported"):
            quant.nvfp4_quantize(x, amax)
    finally:
        monkeypatch.undo()
        backends_for.cache_clear()


@CUDA
@pytest.mark.gpu
def test_quantizer_choice_on_cuda(monkeypatch, caplog):
    """'reference' and 'triton' give the same bytes on CUDA, and each runs what it names."""
    import logging

    x, amax = _inputs(False, rows=256, cols=512, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="titan_fp4six.quant.primitives"):
        ref = quant.four_over_six_quantize(x, amax, block="16x16", quantizer="reference")
        fast = quant.four_over_six_quantize(x, amax, block="16x16", quantizer="triton")
    _assert_same_bytes((ref.codes, ref.scales, ref.map4), (fast.codes, fast.scales, fast.map4))
    strided = x.t()  # not a layout the kernel reads: 'triton' refuses, 'auto' falls back and says so
    with pytest.raises(ValueError, match="does not take x"):
        quant.four_over_six_quantize(strided, quant.tensor_amax(x), quantizer="triton")


def test_columnwise_reference_quantizes_the_zero_padded_transpose():
    """Where no kernel runs, the columnwise operands are the reference on x^T padded with zero columns to a
    multiple of 16 (what the kernel reads in place), with a map-to-6-only variant for operands out of scope."""
    from titan_fp4six.numerics import reference
    from titan_fp4six.numerics.spec import NVFP4, four_over_six_spec
    from titan_fp4six.quant.backends import Backends
    from titan_fp4six.quant.operands import RoleQuantizer

    x, amax = _inputs(False, nan=False, rows=37, cols=48)
    xt = torch.cat([x, x.new_zeros(11, 48)]).t().contiguous()  # 37 rows -> 48
    for choose in (True, False):
        spec = four_over_six_spec("1x16", "mse", 256, choose)
        got, _ = RoleQuantizer(spec, Backends("reference", False)).columns(x, amax)
        want = reference.four_over_six_reference(xt, amax, "1x16", "mse", 256, choose)
        _assert_same_bytes((got.codes, got.scales), want[:2])
        _assert_same_bytes((got.decoded,), (reference.decode_block_scaled_reference(want[0], want[1]),))
    op, _ = RoleQuantizer(NVFP4, Backends("reference", True)).columns(x, amax)  # real FP4 GEMMs: no decode
    codes, scales, dec = op.codes, op.scales, op.decoded
    _assert_same_bytes((codes, scales), reference.nvfp4_reference(xt, amax))
    assert dec is None and codes.shape == (48, 24)


def _pick_all(primitives, table, quantizer, x) -> list[str]:
    """What each primitive of `table` picked for x runs: its kernel or its reference."""
    return [primitives.pick(p, quantizer, x)(x) for p in table]


def test_every_primitive_row_names_a_kernel_and_its_predicate():
    """Each Primitive row's functions of the kernel modules resolve (on the CPU too, where no kernel runs): a
    misspelt kernel shows here, not on the first GPU call."""
    pytest.importorskip("triton")
    from titan_fp4six.quant import amax, epilogue, quantize
    from titan_fp4six.quant.backends import kernels
    from titan_fp4six.quant.primitives import Primitive

    k = kernels()
    rows = [v for m in (amax, epilogue, quantize) for v in vars(m).values() if isinstance(v, Primitive)]
    assert len(rows) == 16
    for row in rows:
        kernel, eligible = row.kernel(k), row.eligible(k)
        assert callable(kernel) and kernel.__module__.startswith("titan_fp4six.kernels."), row.name
        assert eligible.__name__.startswith("eligible") and eligible.__module__ == kernel.__module__, row.name


def test_pick_owns_the_choice_of_kernel_or_reference(monkeypatch):
    """primitives.pick: the reference for quantizer='reference' and while torch.compile traces; with 'auto' the
    kernel where both predicates take the inputs, else the reference; with 'triton' an error there, except for a
    primitive whose reference is only slower (strict=False)."""
    from types import SimpleNamespace

    from titan_fp4six.quant import primitives

    taken = {"x": True}
    fake = SimpleNamespace(fake=SimpleNamespace(eligible=lambda x: taken["x"], run=lambda x: "kernel"))
    monkeypatch.setattr(primitives, "kernels", lambda: fake)
    reference = lambda x: "reference"  # noqa: E731
    kernel, eligible = (lambda k: k.fake.run), (lambda k: k.fake.eligible)
    strict = primitives.Primitive("fake", reference, kernel, eligible)
    lenient = primitives.Primitive("fake", reference, kernel, eligible, takes=lambda x: x.numel() > 0, strict=False)
    x = torch.ones(2)
    assert _pick_all(primitives, (strict, lenient), "auto", x) == ["kernel", "kernel"]
    assert _pick_all(primitives, (strict, lenient), "reference", x) == ["reference", "reference"]
    assert _pick_all(primitives, (lenient,), "triton", torch.ones(0)) == ["reference"]  # `takes` refuses: not strict
    taken["x"] = False
    assert _pick_all(primitives, (strict, lenient), "auto", x) == ["reference", "reference"]
    assert _pick_all(primitives, (lenient,), "triton", x) == ["reference"]
    with pytest.raises(ValueError, match="quantizer='triton': the fake kernel does not take x"):
        primitives.pick(strict, "triton", x)
    taken["x"] = True
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _pick_all(primitives, (strict, lenient), "triton", x) == ["reference", "reference"]


def test_role_quantizers_name_their_quantizations_in_a_profile(monkeypatch):
    """A profiled dense GEMM with the quantized backward: each operand's quantization runs inside a range named
    after its role (what `scripts.runs profile` attributes quantize launches by); none is opened unprofiled."""
    from titan_fp4six.ops import four_over_six_linear
    from titan_fp4six.quant.recipe import FourOverSixRecipe

    recipe = FourOverSixRecipe(backward="quantized", weight_block="1x16")  # 1x16: W^T quantized, not transposed
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(48, 64, dtype=torch.bfloat16, requires_grad=True)

    def step():
        four_over_six_linear(x, w, recipe=recipe).sum().backward()

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    names = [e.name for e in prof.events() if e.name.startswith("titan_fp4six quantize ")]
    assert sorted(names) == sorted(f"titan_fp4six quantize {r}" for r in ("x", "w", "dy", "w_t", "dy_t", "x_t"))
    def no_range(name):
        raise AssertionError(f"{name} opened with no profiler recording")
    monkeypatch.setattr(torch.profiler, "record_function", no_range)
    step()
