"""The Blackwell (SM100) NVFP4 GEMM path: scale swizzling, argument building and the strict gate on CPU;
the real kernels against the emulation only on a compute-capability-10 GPU."""

import pytest
import torch
import torch.nn.functional as F

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm
from titan_fp4six.ops import blackwell
from titan_fp4six.ops.gemm import EMULATE_ENV, fp4_gemms
from titan_fp4six.ops.operands import Operand


def _scales(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 127, shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)


def _swizzled_position(r, c, cols):
    """cuBLAS block-scaling layout: 128x4 tiles row-tile-major; (r, c) inside a tile at (r%32)*16 + (r//32%4)*4 + c%4."""
    col_tiles = -(-cols // 4)
    return ((r // 128) * col_tiles + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


@pytest.mark.parametrize("rows, cols", [(200, 6), (128, 4), (16, 1)])
def test_swizzle_matches_the_documented_layout(rows, cols):
    s = _scales(2, rows, cols)
    out = blackwell.swizzle_scales(s).view(torch.uint8)
    rows_p, cols_p = -(-rows // 128) * 128, -(-cols // 4) * 4
    assert out.shape == (2, rows_p * cols_p) and out.is_contiguous()
    expected = torch.zeros(2, rows_p * cols_p, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            expected[:, _swizzled_position(r, c, cols)] = s.view(torch.uint8)[:, r, c]
    assert torch.equal(out, expected)


def test_group_rows_start_on_128_row_boundaries():
    offs = torch.tensor([3, 3, 200, 250], dtype=torch.int32)
    dest, total = blackwell.group_padded_rows(offs, 260)
    assert total == 384 + 4 * 128  # round_up(rows, 128) + one tile per group: a bound, no sync
    expected = list(range(3)) + list(range(128, 128 + 197)) + list(range(384, 434)) + [total] * 10
    assert dest.tolist() == expected


def _operand(rows, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Operand(torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8), _scales(rows, k // 16))


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        return v.to("meta")
    return [_to_meta(t) for t in v] if isinstance(v, list) else v


def test_dense_arguments_pass_torch_checks():
    a, b = _operand(200), _operand(48, seed=1)
    args = blackwell.dense_args(a, torch.tensor(0.5), b, torch.tensor(0.25), torch.bfloat16)
    assert args["mat_a"].dtype == torch.float4_e2m1fn_x2 and args["mat_b"].shape == (32, 48)
    assert args["mat_b"].stride() == (1, 32)  # column-major (K, N) as cuBLAS takes it
    assert args["scale_a"][0].numel() == 256 * 4 and args["scale_b"][0].numel() == 128 * 4
    assert args["scale_recipe_a"] == [F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise]
    out = F.scaled_mm(**{k: _to_meta(v) for k, v in args.items()})  # torch's own shape/recipe checks
    assert out.shape == (200, 48) and out.dtype == torch.bfloat16


def test_grouped_arguments():
    offs = torch.tensor([3, 3, 150, 190], dtype=torch.int32)
    a, w = _operand(200), _operand(4 * 48, seed=1)
    a_factor, w_factor = torch.rand(4), torch.rand(4)
    args = blackwell.grouped_args(a, a_factor, w, w_factor, offs, 4, torch.bfloat16)
    assert args["mat_b"].shape == (4, 32, 48) and args["mat_b"].dtype == torch.float4_e2m1fn_x2
    assert args["scale_b"][0].shape == (4, 128 * 4)  # (G, round_up(N,128) * round_up(K/16,4)) per expert
    scale_a = args["scale_a"][0]
    assert scale_a.shape == (256 + 4 * 128, 4) and scale_a.shape[0] >= 200
    # group 2's first row (row 3) lands on padded row 128, i.e. the start of the second 128-row tile
    flat = scale_a.view(torch.uint8).reshape(-1)
    assert torch.equal(flat[_swizzled_position(128, 0, 4) + torch.arange(4)], a.scales.view(torch.uint8)[3])
    assert args["scale_a"][1] is a_factor and args["scale_b"][1] is w_factor and args["offs"] is offs


@pytest.mark.parametrize("major, expected", [(9, False), (10, True), (12, False)])
def test_gate_is_strictly_major_10(monkeypatch, major, expected):
    """gemm='auto' takes the real kernels only on major 10; 'emulated' and TITAN_FP4SIX_EMULATE=1 never do;
    'fp4' where they cannot run is an error naming the knob."""
    monkeypatch.setattr(blackwell, "_capability_major", lambda device: major)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    cuda = torch.device("cuda", 0)
    assert blackwell.available(cuda) is expected and fp4_gemms(cuda, "auto") is expected
    assert not blackwell.available(torch.device("cpu")) and not fp4_gemms(torch.device("cpu"), "auto")
    assert not fp4_gemms(cuda, "emulated")
    if expected:
        assert fp4_gemms(cuda, "fp4")
    else:
        with pytest.raises(ValueError, match="gemm='fp4' needs a Blackwell GPU"):
            fp4_gemms(cuda, "fp4")
    monkeypatch.setenv(EMULATE_ENV, "1")
    assert not fp4_gemms(cuda, "auto") and not fp4_gemms(cuda, "fp4")


def _sm100():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


@pytest.mark.sm100
@pytest.mark.skipif(not _sm100(), reason="needs a Blackwell (compute capability 10.x) GPU")
def test_blackwell_kernels_match_emulation():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 512, device="cuda", generator=g).bfloat16()
    w = torch.randn(4, 256, 512, device="cuda", generator=g).bfloat16()
    offs = torch.tensor([64, 64, 200, 250], dtype=torch.int32, device="cuda")
    real, emulated = ((four_over_six_mm(x, w[0], recipe=recipe),
                       four_over_six_grouped_mm(x, w.transpose(-2, -1), offs, recipe=recipe))
                      for recipe in (FourOverSixRecipe(gemm="fp4"), FourOverSixRecipe(gemm="emulated")))
    for r, e in zip(real, emulated):
        torch.testing.assert_close(r, e, rtol=2 ** -7, atol=1e-3)
