"""Bad input gets a clear error naming the argument and what is valid; the amax helpers."""

import re
import subprocess
import sys

import pytest
import torch

from titan_fp4six import (decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, group_amax,
                          nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax)

X = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)).clamp(-4.0, 4.0)  # max |X| <= A
A = torch.tensor(4.0)


@pytest.mark.parametrize("x,amax,kw,match", [
    (torch.randn(4, 4, 16), A, {}, "must be 2-D"),
    (torch.randn(4, 40), A, {}, "multiple of 16"),
    (torch.randn(20, 32), A, {"block": "16x16"}, "multiple of 16, got 20 rows"),
    (X, A, {"block": "4x16"}, "block='4x16' is not supported; valid values: '1x16', '16x16'"),
    (X, A, {"err_mode": "l2"}, "err_mode='l2'"),
    (X, A, {"scale_bound": 300}, "scale_bound=300"),
    (X, A, {"scale_bound": 448.0}, r"scale_bound=448.0 is not supported.*type int; got float"),
    (X, A, {"scale_bound": True}, r"scale_bound=True is not supported.*got bool"),
    (X, torch.ones(31), {}, r"amax has shape \(31,\)"),
    (X, torch.ones(32, 1), {}, r"amax has shape \(32, 1\)"),
    (X, torch.arange(32.0), {"block": "16x16"}, "equal over every 16-row tile"),
])
def test_value_errors(x, amax, kw, match):
    with pytest.raises(ValueError, match=match):
        four_over_six_quantize(x, amax, **kw)


def test_compiled_quantize_checks_tile_uniform_amax():
    """Under torch.compile the row amax of a 16x16 quantize is checked as a graph op (values cannot be read while
    tracing): a per-row amax that varies within a tile fails at run time, a tile-uniform one passes."""
    fn = torch.compile(lambda x, amax: four_over_six_quantize(x, amax, block="16x16").scales, backend="eager",
                       fullgraph=True)
    uniform = X.abs().amax(dim=1).view(2, 16).amax(dim=1).repeat_interleave(16)
    assert torch.equal(fn(X, uniform), four_over_six_quantize(X, uniform, block="16x16").scales)
    with pytest.raises(RuntimeError, match="equal over every 16-row tile"):
        fn(X, uniform + torch.arange(32.0))


@pytest.mark.parametrize("x,amax,match", [
    (X.to(torch.float64), A, "x.dtype=torch.float64"),
    (X.to(torch.int32), A, "x.dtype=torch.int32"),
    (X, A.to(torch.bfloat16), "amax must be float32"),
    (X, 4.0, "amax must be an FP32 torch.Tensor"),
    ([[1.0] * 16], A, "x must be a torch.Tensor"),
])
def test_type_errors(x, amax, match):
    with pytest.raises(TypeError, match=match):
        four_over_six_quantize(x, amax)
    with pytest.raises(TypeError, match=match):
        nvfp4_quantize(x, amax)


def test_amax_on_another_device_is_rejected():
    with pytest.raises(ValueError, match="amax is on meta but x is on cpu"):
        four_over_six_quantize(X, A.to("meta"))


def test_dequantize_checks_its_arguments():
    codes, scales = four_over_six_quantize(X, A)
    with pytest.raises(ValueError, match="scale_bound=100"):
        nvfp4_dequantize(codes, scales, A, scale_bound=100)
    with pytest.raises(TypeError, match="scales must be float8_e4m3fn"):
        nvfp4_dequantize(codes, scales[:, :2], A, scale_bound=256)
    with pytest.raises(TypeError, match="amax must be float32"):
        nvfp4_dequantize(codes, scales, torch.ones(3), scale_bound=256)


def test_nan_and_inf_inputs_are_not_errors():
    """With their own amax (NaN here): an Inf above a finite amax would saturate, so that one is refused."""
    x = X.clone()
    x[0, 0], x[1, 1] = float("nan"), float("inf")
    codes, scales = four_over_six_quantize(x, tensor_amax(x))
    assert codes.shape == (32, 32) and scales.shape == (32, 4)
    with pytest.raises(ValueError, match="amax is below max"):
        four_over_six_quantize(x, tensor_amax(X))


def test_amax_helpers():
    x = torch.tensor([[1.0, -3.0], [2.0, 0.5], [-7.0, 1.0], [float("nan"), 9.0]])
    assert tensor_amax(x[:3]).item() == 7.0 and tensor_amax(x).isnan()
    assert row_amax(x[:3]).tolist() == [3.0, 2.0, 7.0]
    # groups [0,1), [1,1) (empty), [1,3); row 3 is past offs[-1]: its NaN must not leak into any group
    offs = torch.tensor([1, 1, 3], dtype=torch.int32)
    assert group_amax(x, offs).tolist() == [3.0, 0.0, 7.0]
    assert group_amax(x.bfloat16(), offs).dtype == torch.float32
    with pytest.raises(TypeError, match="offs must be a non-empty 1-D int32"):
        group_amax(x, offs.long())
    # the grouped GEMM's offs checks: group_amax returned values for offs it refuses
    with pytest.raises(ValueError, match=r"offs must be non-negative and non-decreasing .* got \[3, 1, 3\]"):
        group_amax(x, torch.tensor([3, 1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offs\[-1\]=5 exceeds the 4 rows of x"):
        group_amax(x, torch.tensor([1, 1, 5], dtype=torch.int32))


def test_token_groups_reference():
    """A grouped GEMM's A by token group: each row's group (E past offs[-1]) and the amax per row (0 past
    offs[-1], whatever the row holds) or per group (0 for an empty group)."""
    from titan_fp4six.quant.amax import run_token_groups
    x = torch.tensor([[1.0, -3.0], [2.0, 0.5], [-7.0, 1.0], [float("nan"), 9.0]])
    offs = torch.tensor([1, 1, 3], dtype=torch.int32)
    rows, group, empty = run_token_groups(x, offs, True, "reference")
    assert group.tolist() == [0, 2, 2, 3] and rows.tolist() == [3.0, 2.0, 7.0, 0.0]
    assert empty.tolist() == [False, True, False]
    groups, group, _ = run_token_groups(x, offs, False, "reference")
    assert group.tolist() == [0, 2, 2, 3] and groups.tolist() == [3.0, 0.0, 7.0]
    assert run_token_groups(x, torch.tensor([0, 4], dtype=torch.int32), False, "reference")[2].tolist() == [True, False]


def test_empty_inputs_round_trip():
    x = torch.empty(0, 32)
    for amax in (torch.tensor(1.0), torch.empty(0)):
        codes, scales = four_over_six_quantize(x, amax)
        assert codes.shape == (0, 16) and scales.shape == (0, 2)
        assert nvfp4_dequantize(codes, scales, amax, scale_bound=256).shape == (0, 32)


_QUANTIZERS = [
    lambda x, a, **kw: four_over_six_quantize(x, a, **kw),
    lambda x, a, **kw: nvfp4_quantize(x, a, **kw),
    lambda x, a, **kw: four_over_six_quantize_decode(x, a, **kw),
]


@pytest.mark.parametrize("quantize", _QUANTIZERS)
@pytest.mark.parametrize("amax, match", [
    (-tensor_amax(X), "amax must be >= 0"),
    (-row_amax(X), "amax must be >= 0"),
    (tensor_amax(X) * 0.5, "amax is below max |x| of the data"),
    (torch.cat([row_amax(X)[:5], row_amax(X)[5:6] * 0.99, row_amax(X)[6:]]), "amax is below max |x|"),
    (torch.tensor(0.0), "amax is below max |x|"),  # amax 0 with nonzero data would decode everything to 0
])
def test_public_quantizers_check_amax_against_the_data(quantize, amax, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        quantize(X, amax)
    quantize(X, amax.abs(), validate_amax=False)  # the ops' path: amax computed from x, not checked again


@pytest.mark.parametrize("quantize", _QUANTIZERS)
def test_amax_at_or_above_the_data_and_nan_amax_pass(quantize):
    for amax in (tensor_amax(X), row_amax(X), tensor_amax(X) * 2, torch.tensor(float("nan")),
                 torch.tensor(float("inf"))):
        quantize(X, amax)


def test_zero_amax_on_zero_data_decodes_to_zero():
    """The spec takes S_enc = 1 where amax == 0; every decoded value is code * scale * 0 / (6B) = 0."""
    zeros = torch.zeros(16, 32)
    codes, scales = four_over_six_quantize(zeros, torch.tensor(0.0))
    assert not codes.any() and not scales.float().any()
    assert not nvfp4_dequantize(codes, scales, torch.tensor(0.0), scale_bound=256).any()


CUDA_PROBE = """
import torch
from titan_fp4six import four_over_six_quantize, four_over_six_quantize_decode, nvfp4_quantize, row_amax, tensor_amax
x = torch.randn(64, 64, device="cuda")
rows = row_amax(x)
({call})(x, tensor_amax(x))
torch.cuda.synchronize()
print("valid amax ok", flush=True)
x[5, 7] = float("nan")
({call})(x, {amax})
torch.cuda.synchronize()
print("bad amax passed", flush=True)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("call, amax", [
    ("four_over_six_quantize", "-tensor_amax(x.nan_to_num(0.0))"),
    ("four_over_six_quantize", "tensor_amax(x.nan_to_num(0.0)) * 0.5"),  # the NaN excuses no other value
    ("lambda x, a: four_over_six_quantize(x, a, block='16x16')", "tensor_amax(x.nan_to_num(0.0)) * 0.5"),
    ("four_over_six_quantize_decode", "rows.index_fill(0, torch.tensor([9], device='cuda'), 0.1)"),
    ("nvfp4_quantize", "-rows"),
])
def test_cuda_amax_check_is_an_asynchronous_device_assert(call, amax):
    """No host sync on CUDA: the bad amax fails at the next synchronization, from the quantize kernel's device
    asserts (in a subprocess: a device assert poisons the CUDA context)."""
    done = subprocess.run([sys.executable, "-c", CUDA_PROBE.format(call=call, amax=amax)], capture_output=True,
                          text=True, timeout=300)
    assert "valid amax ok" in done.stdout and "bad amax passed" not in done.stdout, done.stdout + done.stderr[-2000:]
    assert done.returncode != 0 and "device-side assert" in done.stderr


@pytest.mark.parametrize("width", [7, 4, 12])
def test_codes_of_a_width_that_no_block_layout_has_are_named(width):
    codes, scales = torch.zeros(4, width, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.float8_e4m3fn)
    match = rf"codes has shape \(4, {width}\); .* the width must be a multiple of 8"
    with pytest.raises(ValueError, match=match):
        nvfp4_dequantize(codes, scales, A, scale_bound=256)
    with pytest.raises(ValueError, match=match):
        decode_block_scaled(codes, scales)
    with pytest.raises(TypeError, match="codes must be 2-D uint8"):
        decode_block_scaled(codes.view(-1), scales)
