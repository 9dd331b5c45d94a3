"""The vectorized reference against docs/numerics.md: hand-made vectors per rounding rule, and a byte-for-byte
comparison with the independent scalar oracle (tests/helpers/spec_oracle.py) on sweeps of shapes, dtypes, knobs and
edge data."""

import itertools

import numpy as np
import pytest
import torch

from tests.helpers import spec_oracle as oracle
from titan_fp4six import (four_over_six_quantize, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax)
from titan_fp4six.numerics.formats import e2m1_decode, e2m1_encode, pack_codes, unpack_codes
from titan_fp4six.numerics.reference import _tile_error, global_encode_scale

F32 = torch.float32
UNIT_AMAX = torch.tensor(1536.0)  # with B=256: S_enc = 1536/1536 = 1, so x*inv is x itself for scale 1


def q46(x, amax=UNIT_AMAX, **kw):
    return four_over_six_quantize(torch.as_tensor(x, dtype=F32).reshape(-1, 16 * (len(x[0]) // 16))
                                  if isinstance(x, list) else x, amax, **kw)


def scale_bytes(blocks):
    return blocks.scales.view(torch.uint8)


def block_with(values, fill=0.0):
    row = list(values) + [fill] * (16 - len(values))
    return torch.tensor([row], dtype=F32)


# ---------------------------------------------------------------- hand-made vectors, one per rounding rule

def test_e2m1_tie_points_round_to_even():
    q = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2500001, 5.0000005, 6.0])
    assert e2m1_encode(q).tolist() == [0, 2, 2, 4, 4, 6, 6, 1, 7, 7]


def _e2m1_sweep():
    """Every bf16 value, every FP32 within 64 ulps of a grid point or tie point, and random FP32, in [-6, 6]."""
    every_bf16 = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    points = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0])
    near = torch.cat([(points.view(torch.int32) + d).view(F32) for d in range(-64, 65)])
    x = torch.cat([every_bf16, near, -near, torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 3])
    return x[~x.isnan()].clamp(-6.0, 6.0)


def test_e2m1_encode_matches_the_spec_oracle():
    x = _e2m1_sweep()
    got = e2m1_encode(x)
    want = torch.tensor([oracle.e2m1_code(v) for v in x.tolist()], dtype=torch.uint8)
    assert torch.equal(got, want)
    assert e2m1_encode(torch.tensor([-0.0, -1e-30, float("-inf"), float("inf")])).tolist() == [8, 8, 15, 7]


def test_e2m1_decode_every_code_with_signed_zero():
    got = e2m1_decode(torch.arange(16, dtype=torch.uint8).view(2, 8))
    assert got.shape == (2, 8) and got.dtype == F32
    want = torch.tensor([float(oracle.e2m1_value(c)) for c in range(16)]).view(2, 8)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bitwise: 0x8 is -0.0


def test_e2m1_helpers_match_torchao_bitwise():
    """The pure-PyTorch helpers replace torchao's (f32_to_f4_unpacked, f4_unpacked_to_f32, pack_uint4)."""
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    x = torch.cat([_e2m1_sweep(), torch.tensor([float("nan"), -float("nan")])])
    assert torch.equal(e2m1_encode(x), kernels.f32_to_f4_unpacked(x))
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(e2m1_decode(codes).view(torch.int32), kernels.f4_unpacked_to_f32(codes).view(torch.int32))
    codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(pack_codes(codes), kernels.pack_uint4(codes))


def test_e2m1_ties_through_the_quantizer():
    # Standard NVFP4 with amax = 6*448 has S_enc = 1 and, for bamax 6, block scale 1.0: codes are e2m1(x).
    x = block_with([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0])
    blocks = nvfp4_quantize(x, torch.tensor(2688.0))
    assert scale_bytes(blocks).tolist() == [[0x38]]  # E4M3 1.0
    assert unpack_codes(blocks.codes)[0, :10].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 14]
    # the same block under four-over-six: map-to-4 (scale 1.5) has the lower mse here (1.0625 vs 2.8125)
    four6 = four_over_six_quantize(x, UNIT_AMAX)
    assert scale_bytes(four6).tolist() == [[0x3C]] and four6.map4.all()


def test_saturation_at_six():
    # bamax 6.2: base 1.0333 rounds to the E4M3 scale 1.0, so x*inv = 6.2 clamps to 6 (code 7).
    blocks = four_over_six_quantize(block_with([6.2, -6.2]), UNIT_AMAX)
    assert scale_bytes(blocks).tolist() == [[0x38]]
    assert unpack_codes(blocks.codes)[0, :2].tolist() == [7, 15]


def test_e4m3_round_to_nearest_even_and_candidate_scales():
    # base = 6.375/6 = 1.0625, the midpoint of 1.0 and 1.125 -> 1.0 (even); base*1.5 = 1.59375 -> 1.625.
    x = block_with([6.375])
    _, scales6, _, _, _ = oracle.four_over_six(x.numpy(), 1536.0, force="6")
    assert scales6.tolist() == [[0x38]]
    blocks = four_over_six_quantize(x, UNIT_AMAX)
    assert scale_bytes(blocks).tolist()[0][0] in (0x38, 0x3D)  # 1.0 or 1.625, per the error choice
    assert oracle.e4m3_bits(np.float32(1.59375)) == 0x3D


def test_e4m3_saturates_at_448():
    # amax below the data saturates per the spec; the public check refuses it unless told otherwise
    blocks = four_over_six_quantize(block_with([3000.0]), UNIT_AMAX, validate_amax=False)  # base 500 -> 448
    assert scale_bytes(blocks).tolist() == [[0x7E]]


def test_e4m3_subnormal_and_flush_to_zero_scales():
    sub = four_over_six_quantize(block_with([6 * 2.0 ** -8]), UNIT_AMAX, err_mode="mae")
    assert scale_bytes(sub).tolist()[0][0] in (0x02, 0x03)  # 2^-8 and 1.5*2^-8 = 3*2^-9 are subnormals
    # base = 2^-10 is the midpoint between 0 and 2^-9: RNE flushes it, so both candidates can differ
    flushed = four_over_six_quantize(block_with([6 * 2.0 ** -10]), UNIT_AMAX)
    sf6 = oracle.e4m3_bits(np.float32(2.0 ** -10))
    assert sf6 == 0x00
    assert scale_bytes(flushed).tolist()[0][0] in (0x00, oracle.e4m3_bits(np.float32(1.5 * 2.0 ** -10)))
    tiny = four_over_six_quantize(block_with([6 * 2.0 ** -11]), UNIT_AMAX)
    assert scale_bytes(tiny).tolist() == [[0x00]]  # both candidates flush: the block decodes to zero
    assert nvfp4_dequantize(*tiny, UNIT_AMAX, scale_bound=256).abs().max() == 0


def test_global_scale_flt_max_clamps():
    amax = torch.tensor([1e-45, 0.0, float("inf"), torch.finfo(F32).max, 1536.0])
    s_enc = global_encode_scale(amax, 256)
    assert s_enc[0] == torch.finfo(F32).max  # 1536/denormal overflows to inf -> FLT_MAX
    assert s_enc[1] == 1.0 and s_enc[2] == 1.0  # amax == 0 and S_enc == 0
    assert s_enc[3] == torch.tensor(1536.0) / torch.tensor(torch.finfo(F32).max)
    assert s_enc[4] == 1.0


@pytest.mark.parametrize("amax", [1e-40, 3e38, float("inf"), 0.0])
def test_extreme_amax_matches_oracle(amax):
    x = torch.randn(2, 32) * 1e-3
    a = torch.tensor(amax)
    _check_against_oracle(x, a, "1x16", "mse", 256)


def test_zero_block_and_negative_zero():
    x = block_with([-0.0, 0.0, -0.0])
    blocks = four_over_six_quantize(x, UNIT_AMAX)
    assert scale_bytes(blocks).tolist() == [[0x00]]
    assert not blocks.map4.any()  # both errors are 0: the tie keeps map-to-6
    assert unpack_codes(blocks.codes)[0, :3].tolist() == [8, 0, 8]
    assert unpack_codes(nvfp4_quantize(x, UNIT_AMAX).codes)[0, :3].tolist() == [8, 0, 8]
    assert unpack_codes(four_over_six_quantize(block_with([-1e-30], fill=1.0), UNIT_AMAX).codes)[0, 0] == 8


def test_error_tie_picks_map_to_six():
    # 6 is exact under both candidates (scale 1 -> code 6; scale 1.5 -> code 4): err4 == err6 == 0.
    blocks = four_over_six_quantize(block_with([6.0, 3.0, -1.5]), UNIT_AMAX)
    assert scale_bytes(blocks).tolist() == [[0x38]] and not blocks.map4.any()


def test_map_to_four_wins_when_strictly_better():
    # values on the map-to-4 grid (scale 1.5: 0.75, 1.5, 2.25, 4.5) and off the map-to-6 grid
    blocks = four_over_six_quantize(block_with([6.0, 4.5, 2.25, 0.75]), UNIT_AMAX)
    assert blocks.map4.all() and scale_bytes(blocks).tolist() == [[0x3C]]  # E4M3 1.5


def test_tile_error_uses_the_fixed_tree_order():
    # r0 = 2^24 absorbs a lone +1 (tie to even) but not the pre-summed small rows: the tree order gives
    # 2^24 + 14, a left-to-right sum gives 2^24.
    r = torch.ones(16, 1)
    r[0] = 2.0 ** 24
    assert _tile_error(r)[0, 0].item() == 2.0 ** 24 + 14
    assert float(np.float32(sum(np.float32(v) for v in r[:, 0].tolist()))) != 2.0 ** 24 + 14


def test_row_scaled_equals_each_row_with_its_own_scalar_amax():
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 8)[:, None]
    amax = row_amax(x)
    whole = four_over_six_quantize(x, amax)
    for r in range(8):
        one = four_over_six_quantize(x[r:r + 1], amax[r])
        assert torch.equal(whole.codes[r], one.codes[0])
        assert torch.equal(scale_bytes(whole)[r], scale_bytes(one)[0])


def test_packing_even_element_in_low_nibble():
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert pack_codes(codes).tolist() == [[0x21, 0x43]]
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)


# ---------------------------------------------------------------- byte-for-byte against the scalar oracle

def _edge_data(rows, cols, kind, gen):
    x = torch.randn(rows, cols, generator=gen)
    if kind == "ties":  # values on E2M1 tie points times powers of two
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.0, -0.0])
        x = ties[torch.randint(0, 10, (rows, cols), generator=gen)] * 2.0 ** torch.randint(-3, 4, (rows, 1),
                                                                                         generator=gen)
    elif kind == "wide":  # magnitudes from subnormal-scale to huge
        x = x * 10.0 ** torch.randint(-12, 12, (rows, cols // 16, 1), generator=gen).repeat_interleave(16, -1).view(
            rows, cols)
    elif kind == "special":
        x.view(-1)[torch.randint(0, rows * cols, (6,), generator=gen)] = torch.tensor(
            [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 65504.0])
        x[0, :16] = 0.0
    return x


def _check_against_oracle(x, amax, block, err_mode, bound):
    # any amax, also one below max|x| (saturation is spec'd): the public amax check is off here
    got = four_over_six_quantize(x, amax, block=block, err_mode=err_mode, scale_bound=bound, validate_amax=False)
    xf = x.float().numpy()
    a = amax.numpy() if amax.dim() else float(amax)
    codes, scales, map4, err4, err6 = oracle.four_over_six(xf, a, block, err_mode, bound)
    np.testing.assert_array_equal(unpack_codes(got.codes).numpy(), codes)
    np.testing.assert_array_equal(scale_bytes(got).numpy(), scales)
    np.testing.assert_array_equal(got.map4.numpy(), map4)
    deq = nvfp4_dequantize(got.codes, got.scales, amax, scale_bound=bound).numpy()
    want = oracle.dequantize(codes, scales, a, bound)
    nan = np.isnan(want)  # NaN payload and sign are device arithmetic, not spec: compare NaN-ness there
    np.testing.assert_array_equal(np.isnan(deq), nan)
    np.testing.assert_array_equal(deq.view(np.int32)[~nan], want.view(np.int32)[~nan])
    return got, err4, err6


# per-row amax under 16x16 must be tile-uniform: covered by its own test below
SWEEP = [c for c in itertools.product(["1x16", "16x16"], ["mae", "mse"], [256, 448], ["tensor", "row"])
         if c[0] == "1x16" or c[3] == "tensor"]


@pytest.mark.parametrize("block,err_mode,bound,scaling", SWEEP)
@pytest.mark.parametrize("kind", ["gauss", "ties", "wide", "special"])
def test_matches_scalar_oracle(block, err_mode, bound, scaling, kind):
    gen = torch.Generator().manual_seed(hash((block, err_mode, bound, scaling, kind)) % 2 ** 31)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = _edge_data(32, 48, kind, gen).to(dtype)
        amax = row_amax(x) if scaling == "row" else tensor_amax(x)
        _check_against_oracle(x, amax, block, err_mode, bound)


def test_tile_uniform_row_amax_under_16x16_matches_oracle():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(32, 32, generator=gen)
    amax = torch.tensor([2.0] * 16 + [7.0] * 16)
    _check_against_oracle(x, amax, "16x16", "mse", 256)


def test_stored_candidate_error_is_the_minimum():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 64, generator=gen) * torch.rand(16, 64, generator=gen) ** 3
    got, err4, err6 = _check_against_oracle(x, tensor_amax(x), "1x16", "mse", 256)
    codes = unpack_codes(got.codes).numpy()
    scales = scale_bytes(got).numpy()
    a = float(tensor_amax(x))
    for r in range(16):
        for b in range(4):
            xs = [np.float32(v) for v in x[r, b * 16:(b + 1) * 16].tolist()]
            stored = oracle._block_error(xs, codes[r, b * 16:(b + 1) * 16], oracle.e4m3_value(int(scales[r, b])),
                                         a, 256, "mse")
            assert stored == min(err4[r][b], err6[r][b])


@pytest.mark.parametrize("kind", ["gauss", "wide", "special"])
def test_standard_nvfp4_matches_oracle(kind):
    gen = torch.Generator().manual_seed(11)
    for scaling in ("tensor", "row"):
        x = _edge_data(16, 64, kind, gen)
        amax = row_amax(x) if scaling == "row" else tensor_amax(x)
        got = nvfp4_quantize(x, amax)
        codes, scales = oracle.nvfp4(x.numpy(), amax.numpy() if amax.dim() else float(amax))
        np.testing.assert_array_equal(unpack_codes(got.codes).numpy(), codes)
        np.testing.assert_array_equal(scale_bytes(got).numpy(), scales)


def test_nan_in_a_block_decodes_to_nan_and_stays_local():
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    a = row_amax(x)
    deq = nvfp4_dequantize(*four_over_six_quantize(x, a), a, scale_bound=256)
    assert deq[1, :16].isnan().all()  # the NaN's block (row amax is NaN too: the whole row)
    assert not deq[[0, 2, 3]].isnan().any()
    t = tensor_amax(x)
    assert nvfp4_dequantize(*four_over_six_quantize(x, t), t, scale_bound=256).isnan().all()


@pytest.mark.parametrize("magnitude", [1e36, 3e38, float(torch.finfo(F32).max)])
@pytest.mark.parametrize("bound", [256, 448])
def test_huge_finite_data_decodes_finite_and_scales_by_powers_of_two(magnitude, bound):
    """f32(sf) * amax overflowed for amax >= ~7.6e35 (1952 of 2048 values Inf/NaN): the decode of docs/numerics.md
    rescales it, so the values are those of amax * 2^-100, times 2^100, exactly."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    x = x / x.abs().max() * magnitude
    amax = tensor_amax(x)
    codes, scales = four_over_six_quantize(x, amax, scale_bound=bound)
    deq = nvfp4_dequantize(codes, scales, amax, scale_bound=bound)
    assert torch.isfinite(deq).all()
    small = nvfp4_dequantize(codes, scales, amax * 2.0 ** -100, scale_bound=bound)
    assert torch.equal(deq, small * 2.0 ** 100)
    assert (deq - x).abs().max() <= 0.2 * magnitude


def test_the_rescaled_decode_keeps_the_plain_orders_bytes_where_it_does_not_overflow():
    """Every scale byte, at amaxes on both sides of 2^119: where (f32(sf) * amax) * fl(1/(6B)) is finite the
    decode is exactly it (bitwise), and the rescaled order is used only where it would not be."""
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).view(16, 16)
    codes = torch.full((16, 128), 0x22, dtype=torch.uint8)  # 1.0 in both nibbles: the values are the scales
    inv = (torch.tensor(1.0) / torch.tensor(6.0 * 256)).item()
    plain_overflows = 0
    for amax in (2.0 ** 118 * 1.75, 2.0 ** 119, 1e36, 3e37, 3e38):
        a = torch.tensor(amax, dtype=F32)
        deq = nvfp4_dequantize(codes, scales, a, scale_bound=256)
        plain = ((scales.float() * a) * inv).repeat_interleave(16, 1)
        finite = torch.isfinite(plain)
        assert torch.equal(deq[finite], plain[finite])
        sf_nan = scales.float().isnan().repeat_interleave(16, 1)
        assert torch.isfinite(deq[~sf_nan]).all()
        plain_overflows += int((~finite & ~sf_nan).sum())
    assert plain_overflows > 0


@pytest.mark.parametrize("block,scaling", [("1x16", "tensor"), ("16x16", "tensor"), ("1x16", "row")])
def test_bytes_depend_only_on_the_tile_and_its_amax(block, scaling):
    """Each 16x16 tile quantized on its own (with its rows' amax) gives the whole tensor's bytes there: catches
    a block amax, a tile error sum or a reshape that mixes neighbouring rows or columns."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 128, generator=gen) * (torch.rand(64, 1, generator=gen) + 0.5)
    x[:, :64] = torch.rand(64, 64, generator=gen) * 2 - 1  # uniform tiles: map-to-4 wins many of them
    x = x.to(torch.bfloat16)
    a = row_amax(x) if scaling == "row" else tensor_amax(x)
    whole = four_over_six_quantize(x, a, block=block)
    codes = unpack_codes(whole.codes)
    assert whole.map4.any() and not whole.map4.all()  # both candidates occur, so a mixed-up choice shows
    for r in range(0, 64, 16):
        for c in range(0, 128, 16):
            part = four_over_six_quantize(x[r:r + 16, c:c + 16].contiguous(), a[r:r + 16] if a.dim() else a,
                                          block=block)
            assert torch.equal(unpack_codes(part.codes), codes[r:r + 16, c:c + 16])
            assert torch.equal(scale_bytes(part), scale_bytes(whole)[r:r + 16, c // 16:c // 16 + 1])
            assert torch.equal(part.map4, whole.map4[r:r + 16, c // 16:c // 16 + 1])


# ---------------------------------------------------------------- quantization quality

def _mse(x, blocks, amax, bound):
    return ((nvfp4_dequantize(*blocks, amax, scale_bound=bound) - x) ** 2).mean().item()


@pytest.mark.parametrize("dist", ["gaussian", "student_t3"])
def test_four_over_six_beats_standard_nvfp4(dist):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1024, generator=gen)
    if dist == "student_t3":
        x = x / (torch.randn(512, 1024, 3, generator=gen).pow(2).mean(-1).sqrt())
    a = tensor_amax(x)
    ratio = _mse(x, four_over_six_quantize(x, a), a, 256) / _mse(x, nvfp4_quantize(x, a), a, 448)
    print(f"\n4/6 (1x16, mse, B=256) / NVFP4 MSE on {dist}: {ratio:.4f}")
    assert ratio < 0.95
    if dist == "gaussian":
        assert 0.80 < ratio < 0.88


def test_16x16_four_over_six_beats_its_own_map_to_six():
    # Uniform data sits below the tile max often enough for map-to-4 to win most tiles (Gaussian tiles of
    # 256 values rarely do: their max is an outlier).
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(32, 64, generator=gen) * 2 - 1
    a = tensor_amax(x)
    codes6, scales6, *_ = oracle.four_over_six(x.numpy(), float(a), "16x16", "mse", 256, force="6")
    mse6 = ((torch.from_numpy(oracle.dequantize(codes6, scales6, float(a), 256)) - x) ** 2).mean().item()
    mse46 = _mse(x, four_over_six_quantize(x, a, block="16x16"), a, 256)
    print(f"\n16x16 4/6 / 16x16 map-to-6 MSE: {mse46 / mse6:.4f}")
    assert mse46 < mse6


@pytest.mark.parametrize("block", ["1x16", "16x16"])
def test_candidate_errors_match_the_oracle(block):
    """The errors of reference.four_over_six_candidates (what the choice, near-tie mining and error reports
    read) are the oracle's per-block errors, summed in the spec's tree for 16x16, bit for bit."""
    from titan_fp4six.numerics.reference import four_over_six_candidates

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(32, 48, generator=gen) * torch.rand(32, 1, generator=gen)
    err6, err4 = four_over_six_candidates(x, tensor_amax(x), block, "mse", 256)[4:]
    *_, o4, o6 = oracle.four_over_six(x.numpy(), float(tensor_amax(x)), block, "mse", 256)
    for got, rows in ((err4, o4), (err6, o6)):
        want = np.array(rows, dtype=np.float32)
        if block == "16x16":
            want = np.array([[oracle.tree_sum([rows[t * 16 + i][b] for i in range(16)]) for b in range(3)]
                             for t in range(2)], dtype=np.float32).repeat(16, axis=0)
        np.testing.assert_array_equal(got.numpy().view(np.int32), want.view(np.int32))


def test_amax_per_row_maps_tensor_runs_groups_and_rows():
    """The rule every quantizer and dequantizer reads each row's amax by: per tensor, runs of consecutive rows
    (an expert's rows), per token group or per row, rows that are not data (group >= n_groups) getting 0."""
    from titan_fp4six.numerics.groups import RowGroups
    from titan_fp4six.numerics.reference import amax_per_row

    scalar = torch.tensor(3.0)
    assert amax_per_row(scalar, 5) is scalar
    per_row = torch.arange(5.0)
    assert amax_per_row(per_row, 5) is per_row
    assert amax_per_row(torch.tensor([1.0, 2.0]), 6).tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    group = torch.tensor([0, 0, 2, 2, 3, 3])  # group 1 empty, the last two rows past offs[-1] (group 3 of 3)
    by_group = amax_per_row(torch.tensor([4.0, 5.0, float("nan")]), 6, RowGroups(group, 3, amax_by_group=True))
    assert by_group[:2].tolist() == [4.0, 4.0] and by_group[2:4].isnan().all() and by_group[4:].tolist() == [0, 0]
    rows = amax_per_row(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), 6, RowGroups(group, 3, amax_by_group=False))
    assert rows.tolist() == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]


def test_map4_counts_count_data_rows_and_the_buffer_sums_its_rows():
    from titan_fp4six.quant.process_state import map4_count_buffer, map4_total
    from titan_fp4six.numerics.groups import RowGroups
    from titan_fp4six.numerics.reference import map4_counts

    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    assert map4_counts(mask).tolist() == [5, 9]
    assert map4_counts(mask, RowGroups(torch.tensor([0, 1, 2]), 2, True)).tolist() == [2, 6]  # row 2: no group
    buffer = map4_count_buffer("cpu")
    buffer[0, :2] += torch.tensor([2, 6])
    buffer[-1, :2] += torch.tensor([1, 3])
    buffer[7, 2:] = 99  # the padding of a row's cache line is not a count
    assert map4_total(buffer).tolist() == [3, 9]


@pytest.mark.parametrize("err_mode", ["mse", "mae"])
def test_candidates_that_decode_alike_tie_and_are_common_in_sparse_blocks(err_mode):
    """The quantizer's decode ties (kernels/four_six.py, decode_tie): s4 == 1.5 s6 and v6 == 1.5 v4 for every
    element means both candidates decode alike, so the spec's errors are bitwise equal (a tie: map-to-6, what the
    fast path writes). Blocks of one nonzero value (a token block holding a group's last token) meet it in about
    a third of cases, full Gaussian blocks almost never: the reason the chunk loop's exact path is skipped for
    them."""
    from titan_fp4six.numerics.reference import four_over_six_candidates

    full = torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)).bfloat16()
    sparse = torch.zeros_like(full)
    sparse[:, ::16] = full[:, ::16]
    for x, least, most in ((full, 0.0, 1e-3), (sparse, 0.25, 0.40)):
        code6, code4, sf6, sf4, err6, err4 = four_over_six_candidates(x, tensor_amax(x), "1x16", err_mode, 256)
        tie = (sf4.float() == 1.5 * sf6.float()) & (e2m1_decode(code4) * 1.5 == e2m1_decode(code6)).all(-1)
        assert torch.equal(err4[tie], err6[tie])
        assert least <= tie.float().mean().item() <= most
