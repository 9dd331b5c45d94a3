"""GPU sweep of the operand kernels: fused NVFP4 quantize-decode, columnwise (x^T read in place) 4/6 and NVFP4
quantization with and without the decode, the decode kernels and the GEMM epilogue, bitwise against the reference
compositions they replace, run on the same GPU (tests/helpers/operand_cases.py), over realistic and ragged shapes,
every dtype and knob, and adversarial data."""

import itertools

import pytest
import torch

from tests.helpers.kernel_cases import KINDS, cases, few_programs, map4_counts_pair, near_tie_case
from tests.helpers.operand_cases import (column_case, compare_columnwise, compare_decode, compare_epilogue,
                                         compare_nvfp4_decode, compare_row_groups, compare_token_blocks, decode_case,
                                         epilogue_cases, row_groups_cases, token_block_cases)
from titan_fp4six import quant
from titan_fp4six.numerics.spec import four_over_six_spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KNOBS = list(itertools.product(("mae", "mse"), (256, 448)))
ROW_SHAPES = [(1, 16), (7, 48), (33, 272), (64, 2064), (256, 4096)]
# (M, K): M ragged (zero-row padding) and not, K not a multiple of the 32-column programs, realistic sizes last.
COLUMN_SHAPES = [(1, 16), (5, 7), (16, 33), (37, 272), (100, 400), (255, 1000), (1024, 2048)]


@pytest.fixture(scope="module")
def kq():
    from titan_fp4six.kernels import quantize
    return quantize


@pytest.fixture(scope="module")
def kd():
    from titan_fp4six.kernels import decode
    return decode


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_quantize_decode_sweep(kq, dtype):
    checked, failures = 0, []
    for label, x, amax, block in cases(ROW_SHAPES, (dtype, ), KINDS, seed=2):
        if block != "1x16":
            continue
        checked += 1
        bad = compare_nvfp4_decode(kq, x.cuda(), amax.cuda())
        if bad:
            failures.append(f"{label}: {bad}")
    print(f"\n[{dtype}] NVFP4 quantize-decode configurations checked bitwise: {checked}")
    assert not failures, f"{len(failures)}/{checked} mismatching:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_columnwise_sweep(kq, dtype):
    gen = torch.Generator().manual_seed(3)
    checked, failures = 0, []
    for (m, k), kind in itertools.product(COLUMN_SHAPES, KINDS):
        x, amax = column_case(kind, m, k, dtype, gen)
        x, amax = x.cuda(), amax.cuda()
        for (err_mode, bound), decode in itertools.product(KNOBS, (False, True)):
            checked += 1
            bad = compare_columnwise(kq, x, amax, err_mode, bound, decode, nvfp4=(err_mode, bound) == ("mse", 448))
            if bad:
                failures.append(f"{m}x{k}/{kind} {err_mode} B={bound} decode={decode}: {bad}")
    print(f"\n[{dtype}] columnwise configurations checked bitwise: {checked}")
    assert not failures, f"{len(failures)}/{checked} mismatching:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("err_mode, bound", KNOBS)
def test_columnwise_near_tied_candidate_errors(kq, err_mode, bound):
    x, amax = near_tie_case("1x16", err_mode, bound, count=256)
    x = x.t().contiguous().cuda()  # columnwise quantizes x^T: the near-tie blocks
    for decode in (False, True):
        assert compare_columnwise(kq, x, amax.cuda(), err_mode, bound, decode, nvfp4=False) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_columnwise_rows_in_wider_storage(kq, dtype):
    """x a view of the first K columns of wider rows (row stride > K), odd strides included."""
    gen = torch.Generator().manual_seed(4)
    for m, k, stride in ((37, 272, 301), (64, 100, 129), (1000, 512, 1024)):
        x, amax = column_case("normal", m, k, dtype, gen, row_stride=stride)
        assert x.stride(0) == stride
        assert compare_columnwise(kq, x.cuda(), amax.cuda(), "mse", 256, True) == []


def test_columnwise_realistic_shapes_match_and_are_deterministic(kq):
    gen = torch.Generator(device="cuda").manual_seed(5)
    for m, k in ((8192, 5120), (4100, 7168)):
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
        amax = quant.tensor_amax(x)
        assert compare_columnwise(kq, x, amax, "mse", 256, True) == []
        first = kq.quantize_columnwise(x, amax, four_over_six_spec("1x16", "mse", 256, True), True)
        again = kq.quantize_columnwise(x, amax, four_over_six_spec("1x16", "mse", 256, True), True)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_nvfp4_quantize_decode_realistic_shape(kq):
    x = torch.randn(8192, 5120, device="cuda", dtype=torch.bfloat16)
    for amax in (quant.tensor_amax(x), quant.row_amax(x)):
        assert compare_nvfp4_decode(kq, x, amax) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_kernels_sweep(kd, dtype):
    gen = torch.Generator().manual_seed(6)
    failures = []
    for (rows, cols), edge in itertools.product(((1, 16), (9, 48), (33, 1040), (4096, 7168)), (True, False)):
        codes, scales, amax_rows = decode_case(rows, cols, gen, edge)
        codes, scales, amax_rows = codes.cuda(), scales.cuda(), amax_rows.cuda()
        for bound in (256, 448):
            for amax in (amax_rows, amax_rows[-1].clone(), torch.tensor(2.5, device="cuda"),
                         torch.tensor(1e36, device="cuda")):  # the rescaled order (numerics.md, Decoding)
                bad = compare_decode(kd, codes, scales, amax, bound, dtype)
                if bad:
                    failures.append(f"{rows}x{cols} edge={edge} B={bound}: {bad}")
    assert not failures, "\n".join(failures[:20])


def test_decode_of_quantized_operands_equals_fused_decode(kq, kd):
    """The decode kernel on a quantizer's codes and scales gives the fused kernel's decode, row and column."""
    x = torch.randn(1000, 2064, device="cuda", dtype=torch.bfloat16)
    amax = quant.tensor_amax(x)
    spec = four_over_six_spec("1x16", "mse", 256, True)
    codes, scales, _, dec = kq.quantize(x, amax, spec, decode=True)
    assert torch.equal(kd.decode_block_scaled(codes, scales).view(torch.int16), dec.view(torch.int16))
    codes, scales, _, dec = kq.quantize_columnwise(x, amax, spec, True)
    assert torch.equal(kd.decode_block_scaled(codes, scales).view(torch.int16), dec.view(torch.int16))


@pytest.mark.parametrize("err_mode, bound", KNOBS)
def test_amax_read_per_row_by_the_kernels(kq, kd, err_mode, bound):
    """Token groups (amax per group or per row, NaN garbage past offs[-1]) and expert runs of rows, read by the
    quantizer and the dequantizer themselves; the map-to-4 mask, counts and neither."""
    gen = torch.Generator().manual_seed(8)
    failures = []
    for rows, cols, experts in ((37, 48, (3, 16)), (2051, 1024, (8, 256))):
        for label, x, amax, groups, block in row_groups_cases(gen, "cuda", rows, cols, experts):
            bad = compare_row_groups(kq, kd, x, amax, groups, block, err_mode, bound)
            if bad:
                failures.append(f"{rows}x{cols} {label}: {bad}")
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("block", ["1x16", "16x16"])
def test_map4_counts_of_programs_redone_exactly(kq, block):
    """Counting programs of up to 8 chunks whose near ties send chunks through the exact path after the loop:
    the exact choice replaces the fast one in the counts, which equal the reference mask's."""
    x, amax = near_tie_case(block, "mse", 256)
    x = x.reshape(1, -1) if block == "1x16" else x.reshape(-1, 16, 256).transpose(0, 1).reshape(16, -1)
    with few_programs(kq):
        got, want = map4_counts_pair(kq, x.cuda(), amax.cuda(), block, "mse", 256)
    assert torch.equal(got, want) and 0 < want[0] < want[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_map6_only_kernels_match_reference(dtype):
    """choose=False (an operand outside the recipe's scope): row-major, fused and columnwise kernels keep
    map-to-6 in every block, bitwise equal to the reference, edge data included."""
    from titan_fp4six.quant.primitives import pick
    from titan_fp4six.quant.quantize import QUANTIZE_COLUMNWISE, run_quantize
    from titan_fp4six.numerics import reference

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(200, 512, generator=g) * torch.rand(200, 1, generator=g) * 10).to(dtype)
    x[3, :16] = 0
    x[5, 7] = float("nan")
    x[9, 100] = float("inf")
    x = x.cuda()
    differs = []  # where the choice matters on this data (not everywhere: 16x16 with mae keeps map-to-6 here)
    for block, err_mode, bound in itertools.product(("1x16", "16x16"), ("mae", "mse"), (256, 448)):
        rows = 192 if block == "16x16" else 200
        xb = x[:rows]
        amax = xb.float().nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().amax()  # finite: NaN/Inf stay local
        want = reference.four_over_six_reference(xb, amax, block, err_mode, bound, choose=False)
        differs.append(not torch.equal(want[0], reference.four_over_six_reference(xb, amax, block, err_mode, bound)[0]))
        for decode in (False, True):
            got = run_quantize(xb, amax, four_over_six_spec(block, err_mode, bound, False), "triton", decode)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
            assert not got[2].any()
            if decode:
                ref_dec = reference.decode_block_scaled_reference(want[0], want[1])
                assert torch.equal(got[3].isnan(), ref_dec.isnan())
                assert torch.equal(got[3].nan_to_num(), ref_dec.nan_to_num())
    assert sum(differs) >= 6, differs
    amax = x.float().nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().amax()
    padded = torch.nn.functional.pad(x, (0, 0, 0, 8)).t().contiguous()
    want = reference.four_over_six_reference(padded, amax, "1x16", "mse", 256, choose=False)
    got = pick(QUANTIZE_COLUMNWISE, "triton", x)(x, amax, four_over_six_spec("1x16", "mse", 256, False), False)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))


@pytest.mark.parametrize("rows, cols", [(50, 32), (100, 36), (3001, 528), (4096, 2048)])
def test_token_blocks_sweep(kq, rows, cols):
    """The columnwise quantizer reading the grouped wgrad's token blocks in place (group amaxes per block, per group
    or per group and column; 4/6, map-to-6 only, NVFP4, stochastic NVFP4; empty and short groups, NaN past
    offs[-1]; a column count that is not a multiple of the programs' columns, a row stride wider than the row)
    against the reference on this GPU."""
    gen = torch.Generator().manual_seed(rows)
    bad = [f"{label}: {diff}" for label, *case in token_block_cases(gen, "cuda", rows, cols)
           if (diff := compare_token_blocks(kq, *case))]
    assert not bad, "\n".join(bad[:20])


def test_epilogue_sweep():
    """The GEMM epilogue kernel (global factors x product -> output dtype), dense and grouped, edge values, ragged
    and realistic shapes (several programs per row and column), bitwise against the reference on this GPU."""
    from titan_fp4six.kernels import epilogue as ke
    gen = torch.Generator().manual_seed(9)
    bad = [f"{label}: {diff}" for label, kind, args in epilogue_cases(gen, "cuda", ((37, 300), (1, 16), (4096, 2560)))
           if (diff := compare_epilogue(ke, kind, args))]
    assert not bad, "\n".join(bad[:20])
