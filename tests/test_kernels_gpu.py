"""GPU sweep: the Triton quantizers, fused quantize-decode and amax kernels bitwise against the reference run
on the same GPU, over shapes (some not a multiple of the tile), dtypes, every knob, and adversarial data."""

import itertools
import logging

import pytest
import torch

from tests.helpers.kernel_cases import (KINDS, amax_check_cases, cases, compare, compare_expert_amax,
                                        expert_weight_case, near_tie_case)
from titan_fp4six import quant
from titan_fp4six.numerics.spec import four_over_six_spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPES = [(1, 16), (7, 48), (16, 16), (33, 272), (48, 400), (64, 2064), (256, 4096), (9, 768), (5, 384)]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KNOBS = list(itertools.product(("mae", "mse"), (256, 448)))


@pytest.fixture(scope="module")
def kq():
    from titan_fp4six.kernels import quantize
    return quantize


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sweep_bitwise(kq, dtype):
    """Every output byte equal to the reference on the GPU, NaN and Inf data included."""
    checked, failures = 0, []
    for label, x, amax, block in cases(SHAPES, (dtype, ), KINDS, seed=1):
        x, amax = x.cuda(), amax.cuda()
        for err_mode, bound in KNOBS:
            checked += 1
            bad = compare(kq, x, amax, block, err_mode, bound)
            if bad:
                failures.append(f"{label} {err_mode} B={bound}: {bad}")
    print(f"\n[{dtype}] configurations checked bitwise: {checked}")
    assert not failures, f"{len(failures)}/{checked} mismatching:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("block", ("1x16", "16x16"))
@pytest.mark.parametrize("err_mode, bound", KNOBS)
def test_near_tied_candidate_errors(kq, block, err_mode, bound):
    """Candidate errors nearly tied at every distance down to a few ulps: the fast path's error bounds must
    settle a block only when the exact comparison agrees, and hand the rest to the exact arithmetic."""
    x, amax = near_tie_case(block, err_mode, bound, count=256)
    assert compare(kq, x.cuda(), amax.cuda(), block, err_mode, bound) == []


@pytest.mark.parametrize("rows_per_expert", (16, 48, 768))
@pytest.mark.parametrize("err_mode, bound", KNOBS)
def test_expert_weights_one_amax_per_expert(kq, rows_per_expert, err_mode, bound):
    """16x16 tiles of expert weights with one amax per expert's rows (the grouped forward's W): the kernel reads
    the tile row's amax as a scalar; bytes equal to the reference given each row's amax."""
    x, amax = expert_weight_case(rows_per_expert, cols=272)
    assert not compare_expert_amax(kq, x.cuda(), amax.cuda(), err_mode, bound)


@pytest.mark.parametrize("dtype, offset", ((torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 1)), ids=str)
def test_rows_not_16_byte_aligned(kq, dtype, offset):
    """A view whose rows start 4 bytes past a 16-byte boundary: the word-at-a-time path, same bytes."""
    x = torch.randn(48, 272 + 2 * offset, device="cuda").to(dtype)[:, offset:offset + 272]
    assert x.data_ptr() % 16 and kq.eligible(x)
    for block in ("1x16", "16x16"):
        assert compare(kq, x, quant.tensor_amax(x), block, "mse", 256) == []


def test_large_random_matches_and_is_deterministic(kq):
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1024, 7168, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
    for amax, block in ((quant.tensor_amax(x), "16x16"), (quant.row_amax(x), "1x16")):
        assert compare(kq, x, amax, block, "mse", 256) == []
        first = kq.quantize(x, amax, four_over_six_spec(block, "mse", 256, True), decode=True)
        again = kq.quantize(x, amax, four_over_six_spec(block, "mse", 256, True), decode=True)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_public_functions_dispatch_to_kernels(kq, monkeypatch, caplog):
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    amax = quant.tensor_amax(x)
    calls = []
    real = kq._launch
    monkeypatch.setattr(kq, "_launch", lambda *a, **k: calls.append(k) or real(*a, **k))
    fast = quant.four_over_six_quantize(x, amax, block="16x16")
    dec, _ = quant.four_over_six_quantize_decode(x, amax)
    quant.nvfp4_quantize(x, amax)
    assert len(calls) == 3
    # A column-strided view is not taken by the kernel: the reference runs (logged) with the same bytes.
    xt = x.t().contiguous().t()
    with caplog.at_level(logging.DEBUG, logger="titan_fp4six.quant.primitives"):
        slow = quant.four_over_six_quantize(xt, amax, block="16x16")
    assert len(calls) == 3 and "reference path" in caplog.text
    assert torch.equal(fast.codes, slow.codes) and torch.equal(fast.scales.view(torch.uint8), slow.scales.view(torch.uint8))
    assert dec.dtype == torch.bfloat16


def test_compiled_kernel_divides_correctly_rounded(kq):
    """The kernels Triton compiled on this GPU: div.rn, no approximate division (contraction: test_kernels_codegen)."""
    x = torch.randn(32, 64, device="cuda")
    kq.quantize(x, quant.tensor_amax(x), four_over_six_spec("16x16", "mse", 256, True), decode=True)
    ptx = "\n".join(k.asm["ptx"] for k in _compiled(kq._quantize_kernel))
    assert "div.rn.f32" in ptx
    assert "div.full.f32" not in ptx and "div.approx.f32" not in ptx


def _compiled(jit_fn):
    caches = getattr(jit_fn, "device_caches", None) or {}
    kernels = [k for cache in caches.values() for k in cache[0].values()]
    if not kernels:
        pytest.skip("this Triton version does not expose its kernel cache")
    return kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_amax_kernels_match_torch(dtype):
    from titan_fp4six.kernels import amax as ka
    x = torch.randn(300, 1000, device="cuda").to(dtype)
    x[3, 7] = float("nan")
    x[5, 9] = -float("inf")
    x[7] = 0
    ref_rows = x.abs().amax(dim=-1).float()
    x.new_full((4096,), float("nan"), dtype=torch.float32)  # freed at once: garbage where the output may land
    rows = ka.row_amax(x)
    assert torch.equal(rows.isnan(), ref_rows.isnan())
    assert torch.equal(rows[~rows.isnan()], ref_rows[~ref_rows.isnan()])
    assert ka.tensor_amax(x).isnan()
    x[3, 7] = 1e4 if dtype != torch.float16 else 6e4
    assert torch.equal(ka.tensor_amax(x), x.abs().amax().float())
    assert torch.equal(quant.tensor_amax(x), x.abs().amax().float())
    offs = torch.tensor([100, 100, 250], device="cuda", dtype=torch.int32)
    groups = quant.group_amax(x, offs)
    expect = torch.stack([x[:100].abs().amax().float(), torch.zeros((), device="cuda"), x[100:250].abs().amax().float()])
    assert torch.equal(groups, expect)
    x[260] = float("nan")  # a row past the last group: not a token, its amax is 0 whatever it holds
    tokens, group, empty = ka.token_groups(x, offs, per_row=True)
    assert torch.equal(tokens[:250], ka.row_amax(x)[:250]) and not tokens[250:].any()
    assert torch.equal(group, torch.searchsorted(offs, torch.arange(300, device="cuda", dtype=torch.int32), right=True))
    assert empty.tolist() == [False, True, False]


@pytest.mark.parametrize("experts", [1, 3, 8, 40])
def test_token_groups_kernel_matches_the_reference(experts):
    """Each row's group and the per-row / per-group amaxes of a grouped GEMM's A from one launch equal the
    reference's (searchsorted; row amax with the rows past offs[-1] zeroed, or scatter_reduce per group),
    bitwise: empty groups, a last group ending before the last row, NaN and Inf in tokens and past the last group,
    dtypes, a row stride wider than the row, and recycled memory under the outputs; and the empty groups."""
    from titan_fp4six.quant.amax import run_token_groups
    from titan_fp4six.kernels import amax as ka
    g = torch.Generator(device="cuda").manual_seed(experts)
    rows = 1000
    offs = torch.sort(torch.randint(0, rows - 37, (experts,), device="cuda", generator=g)).values.to(torch.int32)
    if experts > 1:
        offs[experts // 2] = offs[experts // 2 - 1].item()  # an empty group
    for dtype in DTYPES:
        wide = (torch.randn(rows, 320, device="cuda", generator=g) * 4).to(dtype)
        x = wide[:, :256]  # row stride 320
        x[5, 3] = float("inf")
        x[rows - 1, 0] = float("nan")  # past the last group: never reaches an amax
        for per_row in (True, False):
            x.new_full((8192,), float("nan"), dtype=torch.float32)  # freed at once: garbage under the outputs
            got, group, empty = ka.token_groups(x, offs, per_row)
            want, want_group, want_empty = run_token_groups(x.cpu(), offs.cpu(), per_row, "reference")
            assert torch.equal(group.cpu(), want_group) and torch.equal(empty.cpu(), want_empty)
            assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), (dtype, per_row)
        x[int(offs[0]) // 2 if int(offs[0]) else 0, 1] = float("nan")  # in a token: that group's (or row's) amax
        got = ka.token_groups(x, offs, per_row=False)[0]
        want = run_token_groups(x.cpu(), offs.cpu(), False, "reference")[0]
        assert torch.equal(got.isnan().cpu(), want.isnan())
        assert torch.equal(got[~got.isnan()].cpu(), want[~want.isnan()])
    nothing, group, empty = ka.token_groups(x[:0], offs, per_row=False)
    assert torch.equal(nothing, torch.zeros(experts, device="cuda")) and group.shape == (0,)
    assert torch.equal(empty.cpu(), run_token_groups(x[:0].cpu(), offs.cpu(), False, "reference")[2])


def test_dense_amaxes_kernel_matches_the_reference():
    """The dense GEMM's amaxes vector (x's per tensor or per row, then the weight's) from the kernels equals the
    reference's, bitwise, NaN included: x and W of different dtypes and sizes (more programs for one than the
    other), an empty x, and recycled memory under the outputs."""
    from titan_fp4six.quant.amax import run_dense_amaxes
    from titan_fp4six.kernels import amax as ka
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(3000, 256, device="cuda", generator=g).bfloat16()
    w = torch.randn(512, 256, device="cuda", generator=g) * 3
    for xs, ws in ((x, w), (x[:0], w), (x, w.bfloat16()[:16])):
        for row_scaled in (False, True):
            x.new_full((4096,), float("nan"), dtype=torch.float32)  # freed at once
            got = ka.dense_amaxes(xs, ws, row_scaled)
            want = run_dense_amaxes(xs.cpu(), ws.cpu(), row_scaled, "reference")
            assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), (xs.shape, ws.shape, row_scaled)
    x[17, 3] = float("nan")
    tensor, rows = ka.dense_amaxes(x, w, False), ka.dense_amaxes(x, w, True)
    assert tensor[0].isnan() and rows[17].isnan() and not rows[16].isnan()
    assert torch.equal(tensor[1], w.abs().amax()) and torch.equal(rows[-1], w.abs().amax())


def test_amax_check_passes_what_the_reference_passes():
    """The quantize kernel's amax check (device asserts in its own read of x) lets through every case the
    reference's rule passes (NaN data or amax, Inf, -0, amax above the data), in every quantizer variant, and
    changes no output byte. A wrong assert would poison the context and fail the final synchronization; the
    failing cases run in subprocesses (test_numerics_validation.py) and all of them in the interpreter sweep."""
    from titan_fp4six import four_over_six_quantize, four_over_six_quantize_decode, nvfp4_quantize
    checked = 0
    for label, x, amax, covers in amax_check_cases(torch.Generator().manual_seed(0), "cuda"):
        if not covers:
            continue
        blocks = ["1x16"] + (["16x16"] if amax.dim() == 0 and x.shape[0] % 16 == 0 else [])
        for block in blocks:
            got = four_over_six_quantize(x, amax, block=block, quantizer="triton")
            want = four_over_six_quantize(x, amax, block=block, quantizer="triton", validate_amax=False)
            assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8))
                       for g, w in ((got.codes, want.codes), (got.scales, want.scales), (got.map4, want.map4))), label
            four_over_six_quantize_decode(x, amax, block=block, quantizer="triton")
        got, want = (nvfp4_quantize(x, amax, quantizer="triton", validate_amax=check) for check in (True, False))
        assert torch.equal(got.codes, want.codes), label
        checked += 1
    torch.cuda.synchronize()
    assert checked >= 20


def test_every_fp32_magnitude_up_to_six(kq):
    """Every FP32 in [0, 6] (and its negation) as a block element with a global scale of 1 and a block max of 6,
    so the map-to-6 inverse scale is exactly 1 and q = x: the kernels' E2M1 rounding, codes and candidate
    errors see every possible input, bitwise against the reference."""
    top = torch.tensor(6.0).view(torch.int32).item()
    per_chunk = 15 * (1 << 22)
    for start in range(0, top + 1, per_chunk):
        bits = torch.arange(start, min(start + per_chunk, top + 1), device="cuda", dtype=torch.int32)
        vals = bits.view(torch.float32)
        vals = torch.cat([vals, vals.new_zeros((-vals.numel()) % 240)])
        for sign in (1.0, -1.0):
            body = (sign * vals).view(-1, 15)
            x = torch.cat([body.new_full((body.shape[0], 1), 6.0), body], dim=1).view(-1, 256)
            assert compare(kq, x, torch.tensor(6.0 * 256, device="cuda"), "1x16", "mse", 256) == []
            assert compare(kq, x, torch.tensor(6.0 * 448, device="cuda"), "1x16", "mae", 448) == []


def test_scalar_shortcuts_on_every_input():
    """e2m1_magic, e4m3_round, e4m3_byte and div6 against the reference on every FP32 they take."""
    from tests.helpers.rounding_kernels import FINITE, mismatches
    step = 1 << 26
    assert sum(mismatches(start, min(start + step, FINITE), 1, "cuda") for start in range(0, FINITE, step)) == 0


def test_newton_inverse_scale_on_every_input():
    """The fast path's division-free inverse scale equals min(1 / b, FLT_MAX) for b = 0 and every b in
    [2^-100, 2^57], the range the fast path's setting gives it."""
    from tests.helpers.rounding_kernels import newton_inverse_mismatches
    lo, hi = (int(torch.tensor(2.0 ** e).view(torch.int32)) for e in (-100, 57))
    step = 1 << 26
    assert newton_inverse_mismatches(0, 1) == 0
    assert sum(newton_inverse_mismatches(start, min(start + step, hi + 1)) for start in range(lo, hi + 1, step)) == 0
