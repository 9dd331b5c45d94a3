"""The quantizers as torch.library custom ops: registered, fake implementations that agree with the real
ones, and torch.compile(fullgraph=True) giving the same bytes as eager (CPU; the op runs the reference)."""

import pytest
import torch

from titan_fp4six import kernels, numerics


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)


def _inputs(row_scaled, nan=True):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    if nan:
        x[3, 5] = float("nan")
    return x, numerics.row_amax(x) if row_scaled else numerics.tensor_amax(x)


@pytest.mark.parametrize("row_scaled", [False, True])
def test_opcheck(row_scaled):
    x, amax = _inputs(row_scaled, nan=False)  # opcheck compares with assert_close, for which NaN != NaN
    torch.library.opcheck(torch.ops.titan_fp4six.four_over_six_quantize, (x, amax, "1x16", "mae", 448))
    torch.library.opcheck(torch.ops.titan_fp4six.four_over_six_quantize_decode, (x, amax, "1x16", "mse", 256))
    torch.library.opcheck(torch.ops.titan_fp4six.nvfp4_quantize, (x, amax))


def test_ops_equal_numerics():
    x, amax = _inputs(False)
    ref = numerics.four_over_six_quantize(x, amax, block="16x16", err_mode="mae", scale_bound=448)
    got = kernels.four_over_six_quantize(x, amax, block="16x16", err_mode="mae", scale_bound=448)
    assert torch.equal(got.codes, ref.codes) and torch.equal(got.map4, ref.map4)
    assert torch.equal(_bits(got.scales), _bits(ref.scales))


@pytest.mark.parametrize("row_scaled", [False, True])
def test_compile_fullgraph_same_bytes_as_eager(row_scaled):
    x, amax = _inputs(row_scaled)

    def quantize_all(x, amax):
        dec, blocks = kernels.four_over_six_quantize_decode(x * 2, amax * 2)
        tile = kernels.four_over_six_quantize(x, amax, block="1x16" if row_scaled else "16x16", err_mode="mae",
                                              scale_bound=448)
        std = kernels.nvfp4_quantize(x, amax)
        return dec, blocks.codes, blocks.scales, blocks.map4, tile.codes, tile.scales, tile.map4, std.codes, std.scales

    torch._dynamo.reset()
    compiled = torch.compile(quantize_all, fullgraph=True)(x, amax)
    eager = quantize_all(x, amax)
    for got, want in zip(compiled, eager):
        assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want))


def test_fake_implementation_rejects_bad_knobs():
    x, amax = _inputs(False)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx, famax = mode.from_tensor(x), mode.from_tensor(amax)
        codes, scales, map4 = torch.ops.titan_fp4six.four_over_six_quantize(fx, famax, "1x16", "mse", 256)
        assert codes.shape == (32, 32) and scales.shape == (32, 4) and scales.dtype == torch.float8_e4m3fn
        with pytest.raises(ValueError, match="block"):
            torch.ops.titan_fp4six.four_over_six_quantize(fx, famax, "8x8", "mse", 256)


def test_public_numerics_functions_still_trace_under_compile():
    """The CUDA dispatch must not break torch.compile of code calling numerics directly (the reference is
    traced then, no logging or kernel lookup inside the graph)."""
    x, amax = _inputs(False, nan=False)

    def quantize(x, amax):
        blocks = numerics.four_over_six_quantize(x, amax)
        return blocks.codes, blocks.scales.view(torch.uint8), numerics.tensor_amax(x)

    torch._dynamo.reset()
    compiled = torch.compile(quantize, fullgraph=True, backend="aot_eager")(x, amax)
    for got, want in zip(compiled, quantize(x, amax)):
        assert torch.equal(got, want)
