"""Stochastic rounding of the quantized backward's gradient operand (gradient_rounding = "stochastic",
docs/numerics.md section 12): Philox words equal to Triton's, 16 bits per element, the rounding rule and its
unbiasedness, kernel == reference bitwise (Triton's interpreter on the CPU; the GPU cases skip without CUDA),
nearest mode unchanged, the dense op's reproducibility and the recipe / config checks."""

import math
import re
from dataclasses import replace

import pytest
import torch

from tests.helpers.interpreter import configs_checked
from titan_fp4six.quant import nvfp4_dequantize, tensor_amax
from titan_fp4six.numerics import reference
from titan_fp4six.numerics.formats import e2m1_decode, e2m1_encode, e2m1_encode_stochastic
from titan_fp4six.numerics.philox import philox4x32, stochastic_bits
from titan_fp4six.numerics.spec import NVFP4, NVFP4_STOCHASTIC, OperandSpec
from titan_fp4six.ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm, quantize_linear_weight
from titan_fp4six.quant.process_state import GRADIENT_ROUNDING, set_rounding_seed
from titan_fp4six.quant.recipe import KNOBS
from titan_fp4six.quant.process_state import derive_seed

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---- Philox and the kernel under Triton's interpreter --------------------------------------------------------------

def test_interpreted_philox_and_kernel_match_reference():
    """numerics.philox == tl.randint4x (all four words) for seeds and counters up to 2^63 - 1, the kernels' rule
    at its thresholds, and the Triton quantizer's stochastic NVFP4 (rows, columnwise, with and without the decode;
    zeros, NaN, Inf, subnormal, saturating and NaN/Inf/zero amax data) == the reference, bitwise
    (tests/helpers/interp_stochastic.py, in a subprocess because TRITON_INTERPRET is read when the kernels are
    defined)."""
    assert configs_checked("interp_stochastic", 600) >= 30


def test_philox_known_values_and_range():
    """Pinned outputs (tl.randint4x's, checked under the interpreter above; word 0 is the former tl.randint's) and
    uint32 range for large counters."""
    counters = torch.tensor([0, 1, 2], dtype=torch.int64)
    assert philox4x32(0, counters).tolist() == [[1713891541, 3781805453, 3159862348, 2600524760],
                                                [4175744164, 1555169499, 2980410603, 159317863],
                                                [83534633, 1372009126, 605361069, 1167144420]]
    assert philox4x32(42, counters).tolist() == [[2632642643, 2012563771, 314527917, 1463989207],
                                                 [4242219303, 1404726525, 2207210094, 1951270651],
                                                 [3547071013, 2827443659, 2588765593, 3322520921]]
    big = philox4x32(2 ** 63 - 1, torch.arange(2 ** 40, 2 ** 40 + 4096))
    assert big.shape == (4096, 4) and big.dtype == torch.int64
    assert int(big.min()) >= 0 and int(big.max()) < 2 ** 32
    for seed in (-1, 2 ** 63):
        with pytest.raises(ValueError, match="seed"):
            philox4x32(seed, counters)
        with pytest.raises(ValueError, match="seed"):
            stochastic_bits(seed, (1, 16))


def test_stochastic_bits_are_16_bit_halves_of_the_philox_words():
    """Element n gets (W[(n mod 8) div 2] >> 16 (n mod 2)) & 0xFFFF of W = philox4x32(seed, n div 8), written out
    element by element; the first counter's by hand (0x6627E8D5 -> 0xE8D5, 0x6627); a shape whose element count
    is not a multiple of 8 takes a prefix; 16-bit range and every value about equally often."""
    for seed in (0, 5, 2 ** 63 - 1):
        bits = stochastic_bits(seed, (6, 48))
        words = philox4x32(seed, torch.arange(6 * 48 // 8)).tolist()
        want = [(words[n // 8][(n % 8) // 2] >> (16 * (n % 2))) & 0xFFFF for n in range(6 * 48)]
        assert bits.shape == (6, 48) and bits.dtype == torch.int64 and bits.flatten().tolist() == want
        assert torch.equal(stochastic_bits(seed, (3, 5)).flatten(), bits.flatten()[:15])
    assert stochastic_bits(0, (8, )).tolist()[:2] == [0xE8D5, 0x6627]
    big = stochastic_bits(9, (1 << 20, ))
    assert int(big.min()) == 0 and int(big.max()) == 2 ** 16 - 1
    counts = torch.bincount(big >> 8, minlength=256).double()  # 4096 expected per high byte
    assert bool(((counts - 4096).abs() <= 5 * math.sqrt(4096) + 1).all())


# ---- the rounding rule -------------------------------------------------------------------------------------------

def _neighbours(a: torch.Tensor):
    """(lo, hi) grid magnitudes around a in [0, 6]: lo <= a < hi, or (6, 6) at 6."""
    grid = torch.tensor(GRID)
    idx = (a[:, None] >= grid[None, 1:]).sum(dim=1)
    return grid[idx], grid[torch.clamp(idx + 1, max=7)]


def _interval_values():
    """Magnitudes in every interval: its ends, points one FP32 ulp inside them, quarter points, and subnormals."""
    vals = []
    for lo, hi in zip(GRID[:-1], GRID[1:]):
        lo_t, hi_t = torch.tensor(lo), torch.tensor(hi)
        vals += [lo, torch.nextafter(lo_t, hi_t).item(), lo + (hi - lo) / 4, (lo + hi) / 2, lo + 3 * (hi - lo) / 4,
                 torch.nextafter(hi_t, lo_t).item()]
    return torch.tensor(vals + [6.0, 1e-40, 2.0 ** -126, 2.0 ** -33, 0.3, 5.999], dtype=torch.float32)


def test_rule_goes_up_exactly_when_bits_are_below_the_threshold():
    """up <=> r < ceil(t), t = (a - lo) * 2^16 / (hi - lo): checked at r = ceil(t) - 1 and r = ceil(t); grid points
    (t = 0) never move; the sign is q's and NaN takes the canonical code."""
    a = _interval_values()
    lo, hi = _neighbours(a)
    step = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    t = ((a.double() - lo.double()) / step.double()) * 2.0 ** 16
    ceil_t = torch.ceil(t).to(torch.int64)
    for sign in (1.0, -1.0):
        q = a * sign
        down = e2m1_encode_stochastic(q, torch.clamp(ceil_t, max=2 ** 16 - 1))
        got_down = e2m1_decode(down)
        on_grid = ceil_t == 0
        assert torch.equal(got_down.abs(), torch.where(ceil_t >= 2 ** 16, hi, lo)), "r = ceil(t) must round down"
        up = e2m1_encode_stochastic(q, torch.clamp(ceil_t - 1, min=0))
        assert torch.equal(e2m1_decode(up).abs(), torch.where(on_grid, lo, hi)), "r = ceil(t) - 1 must round up"
        assert torch.equal(torch.signbit(e2m1_decode(up)), torch.signbit(q))
    nan = e2m1_encode_stochastic(torch.tensor([float("nan"), -float("nan")]), torch.tensor([0, 2 ** 16 - 1]))
    assert nan.tolist() == [3, 3]
    assert e2m1_encode_stochastic(torch.tensor([-0.0]), torch.tensor([0])).item() == 0x8


def test_gpu_rule_arithmetic_emulated():
    """The GPU branch of kernels.encode.stochastic_e2m1 emulated in integers from the kernel's own constants (its
    instructions run on a GPU only): each CEIL_* fma.rp(a, SCALE, ADDEND) with ADDEND in [2^23, 2^24) gives the
    bits of ADDEND + ceil(a SCALE) (saturating at 2^24, as the monotone rounding does); their min with
    CAP_BITS (every term carrying F32_2_23 + ROUND_UP), less r and shifted by 16, give the reference's codes plus
    CODE_BIAS at the rule's thresholds (tests/helpers/stochastic_kernels.cases) and for magnitudes past 6, which
    the branch clamps by the cap."""
    import struct

    from tests.helpers.stochastic_kernels import cases
    from titan_fp4six.kernels import encode

    a, r = cases(torch.Generator().manual_seed(12))
    a = torch.cat([a, torch.tensor([6.0, 6.0 + 2 ** -21, 6.5, 7.0, 100.0, 3e38, 1e-40, 1e-45, 0.0])])
    r = torch.cat([r, torch.tensor([0, 0, 1, 65535, 0, 5, 0, 0, 0], dtype=r.dtype)]).long()
    bias, cap = int(encode.F32_2_23), int(encode.CAP)
    assert bias == struct.unpack(">i", struct.pack(">f", 2.0 ** 23))[0]

    def biased_ceil(asm):
        scale, addend = (struct.unpack(">f", bytes.fromhex(h))[0] for h in re.findall(r"0f([0-9A-F]{8})", asm))
        assert 2 ** 23 <= addend < 2 ** 24 and math.log2(scale).is_integer()
        v = torch.ceil(a.double() * scale) + addend
        return torch.where(v < 2 ** 24, v.float().view(torch.int32).long(), torch.tensor(0x4B800000))

    assert int(encode.CAP_BITS) == bias + cap + encode.ROUND_UP and int(encode.CODE_BIAS) == bias >> 16
    c = torch.minimum(torch.minimum(biased_ceil(encode.CEIL_N.value), biased_ceil(encode.CEIL_HALF.value)),
                      torch.minimum(biased_ceil(encode.CEIL_QUARTER.value), torch.tensor(int(encode.CAP_BITS))))
    got = ((c - r) >> 16) - int(encode.CODE_BIAS)
    assert torch.equal(got, e2m1_encode_stochastic(a.clamp(max=6.0), r).long() & 7)
    # A word packed from 8 biased codes, the first one's addend UNBIAS_WORD: the packed codes, mod 2^32.
    codes = torch.arange(8) % 8
    word = (int(encode.UNBIAS_WORD) + sum((int(v) + int(encode.CODE_BIAS)) << (4 * k) for k, v in enumerate(codes)))
    assert word % 2 ** 32 == sum(int(v) << (4 * k) for k, v in enumerate(codes))


def test_codes_are_always_a_neighbour_of_q():
    g = torch.Generator().manual_seed(0)
    q = torch.clamp(torch.randn(1 << 14, generator=g) * 3, -6, 6)
    codes = e2m1_encode_stochastic(q, stochastic_bits(7, q.shape))
    lo, hi = _neighbours(q.abs())
    v = e2m1_decode(codes).abs()
    assert bool(((v == lo) | (v == hi)).all())
    nearest = e2m1_decode(e2m1_encode(q)).abs()
    assert bool(((nearest == lo) | (nearest == hi)).all())  # nearest picks one of the same two


def test_rule_is_unbiased_per_interval():
    """For each value (every interval, its edges, one ulp inside them), 8192 draws (distinct element indices): the
    rule's probability P = ceil(t) / 2^16 exceeds the exact p = (a - lo) / (hi - lo) by less than 2^-16, and the
    number of round-ups k satisfies |k - n P| <= 5 sqrt(n P (1 - P)) + 1 (5 binomial standard deviations, + one
    draw); so the mean decoded value is a within (hi - lo) (that bound / n + 2^-16)."""
    a = _interval_values()
    n = 8192
    q = a[:, None].expand(-1, n).contiguous()
    bits = stochastic_bits(123, q.shape)
    v = e2m1_decode(e2m1_encode_stochastic(q, bits)).double()
    lo, hi = _neighbours(a)
    step = torch.where(hi > lo, hi - lo, torch.ones_like(hi)).double()
    p = (a.double() - lo.double()) / step
    prob = torch.ceil(p * 2.0 ** 16) / 2.0 ** 16  # p * 2^16 is t, exact in FP64 as in FP32
    assert bool(((prob - p >= 0) & (prob - p <= 2.0 ** -16)).all())  # < 2^-16 exactly; FP64's difference rounds
    ups = (v > lo.double()[:, None]).sum(dim=1).double()
    bound = 5 * torch.sqrt(n * prob * (1 - prob)) + 1
    assert bool(((ups - n * prob).abs() <= bound).all()), (a[(ups - n * prob).abs() > bound], ups, n * prob)
    mean = v.mean(dim=1)
    assert bool(((mean - a.double()).abs() <= step * (bound / n + 2.0 ** -16)).all())


def test_reference_quantizer_is_unbiased_and_keeps_the_scales():
    """nvfp4_reference with a seed: the E4M3 scales are the nearest mode's, bitwise; with amax = 6 * 448
    (S_enc = 1) and blocks whose max is 6 * 2^k (exact scales 2^k), the dequantized mean over 4096 rows of the
    same values (distinct offsets) is x within 5 binomial standard deviations (+ 2^-20 relative for the decode's
    rounded constant)."""
    g = torch.Generator().manual_seed(1)
    k = torch.randint(-3, 4, (8, 1), generator=g).float()
    blocks = torch.rand(8, 16, generator=g) * 6
    blocks[:, 0] = 6.0
    blocks[:, 1:8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # the nearest rule's ties
    row = (blocks * torch.exp2(k) * torch.where(torch.rand(8, 16, generator=g) < 0.5, -1.0, 1.0)).view(1, -1)
    n = 4096
    x = row.expand(n, -1).contiguous()
    amax = torch.tensor(6.0 * 448)
    codes, scales = reference.nvfp4_reference(x, amax, seed=99)
    near_codes, near_scales = reference.nvfp4_reference(x, amax)
    assert torch.equal(scales.view(torch.uint8), near_scales.view(torch.uint8))
    assert not torch.equal(codes, near_codes)
    deq = nvfp4_dequantize(codes, scales, amax, scale_bound=448).double()
    scale = torch.exp2(k).repeat_interleave(16).double()
    step = torch.where(row.abs()[0] / scale.float() < 2, 0.5, torch.where(row.abs()[0] / scale.float() < 4, 1.0,
                                                                           2.0)).double() * scale
    assert bool((deq.mean(0) - row[0].double()).abs().le(5 * step * 0.5 / math.sqrt(n) + 2 ** -20 * 6 * scale).all())


# ---- the nearest mode is unchanged -------------------------------------------------------------------------------

def test_nearest_is_the_default_and_unchanged():
    """gradient_rounding='nearest' (the default) resolves dy to the plain NVFP4 spec, so every existing test of
    round-to-nearest covers it; the reference without a seed ignores nothing and a seed changes stochastic codes."""
    assert FourOverSixRecipe().gradient_rounding == "nearest"
    assert FourOverSixRecipe().plan(False).dy is NVFP4 and NVFP4.rounding == "nearest"
    assert FourOverSixRecipe(gradient_rounding="stochastic").plan(False).dy is NVFP4_STOCHASTIC
    x = torch.randn(4, 64)
    a = tensor_amax(x)
    c0, _ = reference.nvfp4_reference(x, a, seed=1)
    c1, _ = reference.nvfp4_reference(x, a, seed=2)
    assert not torch.equal(c0, c1)


# ---- the dense op --------------------------------------------------------------------------------------------------

def _grads(x, w, dy, recipe, seed, step=1):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    set_rounding_seed(seed, step)
    four_over_six_mm(x, w, recipe=recipe).backward(dy)
    return x.grad, w.grad


def _dense_operands(device="cpu"):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 64, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(48, 64, generator=g) * 0.1).to(device, torch.bfloat16)
    dy = torch.randn(40, 48, generator=g).to(device, torch.bfloat16)
    return x, w, dy


def test_dense_stochastic_backward_is_reproducible_and_seeded():
    x, w, dy = _dense_operands()
    r = FourOverSixRecipe(gradient_rounding="stochastic")
    dx1, dw1 = _grads(x, w, dy, r, 5)
    assert GRADIENT_ROUNDING.calls == 2  # one seed for dgrad's dy, one for wgrad's dy^T
    dx2, dw2 = _grads(x, w, dy, r, 5)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)
    dx3, dw3 = _grads(x, w, dy, r, 6)
    assert not torch.equal(dw1, dw3) and not torch.equal(dx1, dx3)
    dx4, dw4 = _grads(x, w, dy, r, 5, step=2)
    assert not torch.equal(dw1, dw4)
    dxn, dwn = _grads(x, w, dy, FourOverSixRecipe(), 5)
    dxn2, dwn2 = _grads(x, w, dy, FourOverSixRecipe(gradient_rounding="nearest"), 6)
    assert torch.equal(dxn, dxn2) and torch.equal(dwn, dwn2)  # nearest reads no seed


def test_dense_stochastic_dgrad_mean_approaches_the_exact_product():
    """The mean of dX over 32 seeds against dy @ Q(W) (the weight's quantization is deterministic): much closer
    than the round-to-nearest dX (loose: half its error)."""
    x, w, dy = _dense_operands()
    r = FourOverSixRecipe(gradient_rounding="stochastic")
    qw = quantize_linear_weight(w, recipe=r)
    wq = nvfp4_dequantize(qw.codes, qw.scales, qw.amax, scale_bound=r.scale_bound).double()
    exact = dy.double() @ wq
    mean = torch.stack([_grads(x, w, dy, r, s)[0].double() for s in range(32)]).mean(0)
    nearest = _grads(x, w, dy, FourOverSixRecipe(), 0)[0].double()
    err_mean = (mean - exact).norm() / exact.norm()
    err_nearest = (nearest - exact).norm() / exact.norm()
    assert err_mean < 0.5 * err_nearest, (err_mean, err_nearest)


def test_seeds_derive_from_seed_step_rank_and_call():
    seeds = {derive_seed(s, step, rank, call) for s in (0, 1) for step in (1, 2) for rank in (0, 1) for call in (0, 1)}
    assert len(seeds) == 16 and all(0 <= s < 2 ** 63 for s in seeds)
    set_rounding_seed(3, 4, 1)
    first = [GRADIENT_ROUNDING.next() for _ in range(3)]
    set_rounding_seed(3, 4, 1)
    assert [GRADIENT_ROUNDING.next() for _ in range(3)] == first == [derive_seed(3, 4, 1, c) for c in range(3)]


# ---- spec, recipe and config checks --------------------------------------------------------------------------------

def test_stochastic_spec_needs_nvfp4_candidates_and_a_seed():
    with pytest.raises(ValueError, match=r"OperandSpec.rounding='stochastic'.*candidates='4/6'"):
        OperandSpec(candidates="4/6", rounding="stochastic")
    with pytest.raises(ValueError, match="OperandSpec.rounding='dither' is not supported"):
        OperandSpec(rounding="dither")
    from titan_fp4six.quant.quantize import run_quantize
    for seed in (None, -1, 2 ** 63, 1.0):
        with pytest.raises(ValueError, match="needs a seed"):
            run_quantize(torch.randn(2, 16), torch.tensor(3.0), NVFP4_STOCHASTIC, "reference", False, seed=seed)


@pytest.mark.parametrize("kwargs, match", [
    (dict(backward="high_precision"), r"gradient_rounding='stochastic'.*backward='high_precision' quantizes none"),
    (dict(backward="dequantized"), r"gradient_rounding='stochastic'.*backward='dequantized' quantizes none"),
    (dict(activation_scaling="row"), r"gradient_rounding='stochastic'.*backward='auto' resolves to "
                                     r"'high_precision' for row-scaled"),
])
def test_recipe_rejects_stochastic_without_a_quantized_gradient(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FourOverSixRecipe(gradient_rounding="stochastic", **kwargs)


def test_recipe_stochastic_grouped_gemms_are_an_error_at_plan_resolution():
    recipe = FourOverSixRecipe(gradient_rounding="stochastic")  # auto: quantized for dense GEMMs
    assert recipe.resolve(grouped=False).backward == "quantized"
    with pytest.raises(ValueError, match=r"backward='auto' resolves to 'high_precision' for grouped"):
        recipe.plan(grouped=True)
    with pytest.raises(ValueError, match="gradient_rounding='random' is not supported"):
        FourOverSixRecipe(gradient_rounding="random")
    assert "gradient_rounding" in [f.name for f in KNOBS]


LIN = "quantize.linear.four_over_six"
GMM = "quantize.grouped_mm.four_over_six"


def test_config_sets_the_seeds_from_debug_seed_and_step():
    pytest.importorskip("torchtitan")
    from tests.helpers.integration_helpers import job_config
    from titan_fp4six.integration import rounding

    job = job_config(f"--{LIN}.gradient_rounding", "stochastic", "--debug.seed", "11")
    assert job.quantize.linear.four_over_six.gradient_rounding == "stochastic"
    rounding.start_step(job, 7)
    assert (GRADIENT_ROUNDING.seed, GRADIENT_ROUNDING.step, GRADIENT_ROUNDING.calls) == (11, 7, 0)
    rounding.start_step(job_config(), 2)  # debug.seed unset: 0
    assert (GRADIENT_ROUNDING.seed, GRADIENT_ROUNDING.step) == (0, 2)
    job = job_config(f"--{GMM}.gradient_rounding", "stochastic", f"--{GMM}.backward", "quantized")
    assert job.quantize.grouped_mm.four_over_six.recipe().plan(grouped=True).dy.rounding == "stochastic"


# ---- GPU (skipped without CUDA) ------------------------------------------------------------------------------------

@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_gpu_kernel_matches_reference_sweep(dtype):
    """The Triton stochastic NVFP4 quantizer on the GPU against the reference (same seed), bitwise: every data
    kind, row-major with and without the decode and columnwise, several seeds, realistic shapes last. The
    reference runs on the same CUDA tensors (integer ops and single FP32 ops: the same bytes on any device; on
    the CPU the larger shapes take minutes), and on one small case also on the CPU, bitwise equal."""
    from tests.helpers.kernel_cases import KINDS, cases
    from tests.helpers.operand_cases import column_case, same_bytes
    from titan_fp4six.kernels import quantize as kq

    x, amax = column_case("nan_inf", 37, 272, dtype, torch.Generator().manual_seed(5))
    cpu = reference.nvfp4_reference(x, amax, 2 ** 62 + 9)
    on_gpu = reference.nvfp4_reference(x.cuda(), amax.cuda(), 2 ** 62 + 9)
    assert same_bytes(cpu[0], on_gpu[0].cpu()) and same_bytes(cpu[1], on_gpu[1].cpu())

    failures, checked = [], 0
    shapes = [(1, 16), (7, 48), (33, 272), (64, 2064), (256, 4096)]
    for n, (label, x, amax, block) in enumerate(cases(shapes, (dtype, ), KINDS, seed=4)):
        if block != "1x16" or amax.dim():
            continue
        seed = (n * 0x9E3779B97F4A7C15) % 2 ** 63
        x, amax = x.cuda(), amax.cuda()
        want_c, want_s = reference.nvfp4_reference(x, amax, seed)
        want_d = reference.decode_block_scaled_reference(want_c, want_s)
        for decode in (False, True):
            c, s, _, d = kq.quantize(x, amax, NVFP4_STOCHASTIC, decode=decode, seed=seed)
            checked += 1
            ok = same_bytes(c, want_c) and same_bytes(s, want_s)
            if not (ok and (not decode or same_bytes(d, want_d))):
                failures.append(f"{label}/seed={seed}/decode={decode}")
    gen = torch.Generator().manual_seed(6)
    for (m, k), kind in [((1, 16), "normal"), ((37, 272), "nan_inf"), ((100, 400), "wide"),
                         ((255, 1000), "saturate"), ((1024, 2048), "normal")]:
        x, amax = column_case(kind, m, k, dtype, gen)
        x, amax = x.cuda(), amax.cuda()
        xt = torch.nn.functional.pad(x, (0, 0, 0, -m % 16)).t().contiguous()
        want_c, want_s = reference.nvfp4_reference(xt, amax, 77)
        c, s, _, d = kq.quantize_columnwise(x, amax, NVFP4_STOCHASTIC, True, seed=77)
        checked += 1
        if not (same_bytes(c, want_c) and same_bytes(s, want_s)
                and same_bytes(d, reference.decode_block_scaled_reference(want_c, want_s))):
            failures.append(f"columnwise/{m}x{k}/{kind}")
    assert not failures, f"{len(failures)}/{checked}:\n" + "\n".join(failures[:20])


@cuda
@pytest.mark.gpu
def test_gpu_rule_matches_reference_at_its_thresholds():
    """The kernels' per-element rule on the GPU (tests/helpers/stochastic_kernels.py: magnitudes whose t is an
    integer or a half, against the bits just below, at and above ceil(t), in every interval), bitwise."""
    from tests.helpers.stochastic_kernels import rule_mismatches

    bad, total = rule_mismatches("cuda")
    assert bad == 0 and total > 30000


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("ptx", (False, True), ids=("randint4x", "mul_wide"))
def test_gpu_philox_matches_reference(ptx):
    """The kernels' Philox compiled for the GPU (tl.randint4x, and the mul.wide rounds the quantizer runs) ==
    numerics.philox.philox4x32 (computed on the CPU), all four words, for seeds and counters up to 2^63 - 1."""
    from tests.helpers.stochastic_kernels import philox_matches

    counters = torch.cat([torch.arange(4096), torch.arange(2 ** 32 - 2048, 2 ** 32 + 2048),
                          torch.arange(2 ** 62, 2 ** 62 + 4096), 2 ** 63 - 1 - torch.arange(4096)])
    for seed in (0, 1, 2 ** 31 + 5, 2 ** 62 + 3, 2 ** 63 - 1):
        assert philox_matches(seed, counters, "cuda", ptx)


@cuda
@pytest.mark.gpu
def test_gpu_dense_stochastic_backward_triton_equals_reference_quantizer():
    """The same seed gives bitwise the same gradients with the Triton quantizers and the reference on the GPU (same
    emulated GEMMs), and again on a second run."""
    x, w, dy = _dense_operands("cuda")
    got = _grads(x, w, dy, FourOverSixRecipe(gradient_rounding="stochastic", quantizer="triton"), 9)
    again = _grads(x, w, dy, FourOverSixRecipe(gradient_rounding="stochastic", quantizer="triton"), 9)
    want = _grads(x, w, dy, FourOverSixRecipe(gradient_rounding="stochastic", quantizer="reference"), 9)
    for a, b, c in zip(got, again, want):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_compiled_stochastic_backward_equals_eager():
    """torch.compile(fullgraph=True): the backward custom op's body reads the seeds at run time, so compiled and
    eager gradients are bitwise equal for the same set_rounding_seed, and consume the same two seeds."""
    torch._dynamo.reset()
    x, w, dy = _dense_operands()
    r = FourOverSixRecipe(gradient_rounding="stochastic")

    def grads(fn):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        set_rounding_seed(21, 3)
        fn(xr, wr).backward(dy)
        return xr.grad, wr.grad, GRADIENT_ROUNDING.calls

    def mm(a, b):
        return four_over_six_mm(a, b, recipe=r)

    eager = grads(mm)
    compiled = grads(torch.compile(mm, fullgraph=True))
    assert eager[2] == compiled[2] == 2
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_torchao_config_has_the_knob():
    pytest.importorskip("torchao")
    from titan_fp4six.modules.torchao_config import FourOverSixTrainingConfig

    assert FourOverSixTrainingConfig().gradient_rounding == "nearest"
    with pytest.raises(ValueError, match="gradient_rounding='stochastic'"):
        FourOverSixTrainingConfig(gradient_rounding="stochastic", backward="high_precision").recipe()


def test_fidelity_metrics_of_a_stochastic_recipe():
    """The fidelity telemetry runs every backward mode: only the quantized one rounds stochastically (the others
    take gradient_rounding='nearest' instead of refusing), and dy's error is that of stochastic rounding
    (larger than round-to-nearest's, which the plain-NVFP4 variant of the nearest recipe measures)."""
    from titan_fp4six.modules import fidelity as fid

    g = torch.Generator().manual_seed(2)
    x, w, dy = torch.randn(64, 32, generator=g), torch.randn(48, 32, generator=g), torch.randn(64, 48, generator=g)
    set_rounding_seed(1, 1)
    sr = fid.gemm_fidelity(fid.GemmCase("c", x, w, dy, FourOverSixRecipe(gradient_rounding="stochastic")))
    assert GRADIENT_ROUNDING.calls == 0  # the seeds it drew are given back (tests/test_fidelity.py)
    near = fid.gemm_fidelity(fid.GemmCase("c", x, w, dy, FourOverSixRecipe()))
    assert sr["mse_dy/four_over_six"] > 1.2 * near["mse_dy/four_over_six"]
    assert sr["high_precision_dx_cos/four_over_six"] == near["high_precision_dx_cos/four_over_six"]
    assert 0.9 < sr["quantized_dx_cos/four_over_six"] < near["dequantized_dx_cos/four_over_six"]


# ---- the quantized backward's other layouts (row-scaled dense, grouped) --------------------------------------------

@pytest.mark.parametrize("scaling", ("tensor", "row"))
def test_dense_stochastic_equals_reference_composition(scaling):
    """The dense op's stochastic dx and dW equal the reference composition of tests/helpers/backward_oracle.py
    with dy rounded by the seeds the op drew (call 0: dy for dgrad, call 1: the zero-padded dy^T for wgrad):
    the random bits follow the element index of the matrix as quantized (numerics.md section 12)."""
    from tests.helpers.backward_oracle import dense_backward, narrow_data

    recipe = FourOverSixRecipe(backward="quantized", activation_scaling=scaling, gradient_rounding="stochastic")
    x, w, dy = narrow_data((37, 64), 1, 4.0), narrow_data((48, 64), 2, 0.1), narrow_data((37, 48), 3, 0.5)
    dx, dw = _grads(x, w, dy, recipe, 13, step=5)
    seeds = (derive_seed(13, 5, 0, 0), derive_seed(13, 5, 0, 1))
    want_dx, want_dw = dense_backward(x, w, dy, recipe, seeds)
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw)
    near_dx, _ = dense_backward(x, w, dy, replace(recipe, gradient_rounding="nearest"))
    assert not torch.equal(dx, near_dx)


def _grouped_case():
    g = torch.Generator().manual_seed(4)
    offs = torch.tensor([20, 20, 52, 64], dtype=torch.int32)
    A = torch.randn(70, 32, generator=g).to(torch.bfloat16)
    W = (torch.randn(4, 48, 32, generator=g) * 0.1).to(torch.bfloat16)
    dy = torch.randn(70, 48, generator=g).to(torch.bfloat16)
    return A, W, offs, dy


def _grouped_grads(A, W, offs, dy, recipe, seed):
    A, W = A.clone().requires_grad_(), W.clone().requires_grad_()
    set_rounding_seed(seed, 1)
    four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=recipe).backward(dy)
    return A.grad, W.grad


def test_grouped_stochastic_backward_is_reproducible_seeded_and_unbiased():
    """backward='quantized' on a grouped GEMM: dy rounds stochastically in dgrad and in the wgrad's token blocks
    (two seeds per backward); same seed -> same bytes, another seed -> other dA and dW; the mean dA over 32 seeds
    is much closer than round-to-nearest's to dy x deq(W) (the dequantized backward, whose dy is exact)."""
    A, W, offs, dy = _grouped_case()
    r = FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic")
    da1, dw1 = _grouped_grads(A, W, offs, dy, r, 1)
    assert GRADIENT_ROUNDING.calls == 2
    da2, dw2 = _grouped_grads(A, W, offs, dy, r, 1)
    assert torch.equal(da1, da2) and torch.equal(dw1, dw2)
    da3, dw3 = _grouped_grads(A, W, offs, dy, r, 2)
    assert not torch.equal(da1, da3) and not torch.equal(dw1, dw3)
    assert not da1[64:].any() and not dw1[1].any()  # rows past offs[-1], the empty group
    exact = _grouped_grads(A, W, offs, dy, FourOverSixRecipe(backward="dequantized"), 0)[0][:64].double()
    nearest = _grouped_grads(A, W, offs, dy, FourOverSixRecipe(backward="quantized"), 0)[0][:64].double()
    mean = torch.stack([_grouped_grads(A, W, offs, dy, r, s)[0][:64].double() for s in range(32)]).mean(0)
    assert (mean - exact).norm() < 0.5 * (nearest - exact).norm()


@cuda
@pytest.mark.gpu
def test_gpu_grouped_stochastic_backward_triton_equals_reference_quantizer():
    """The grouped quantized backward with stochastic dy: Triton quantizers (per-group amax rows, token blocks) and
    the reference give bitwise the same dA and dW on the GPU for the same seed."""
    A, W, offs, dy = (t.cuda() for t in _grouped_case())
    got = _grouped_grads(A, W, offs, dy, FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic",
                                                           quantizer="triton"), 3)
    want = _grouped_grads(A, W, offs, dy, FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic",
                                                            quantizer="reference"), 3)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_trainer_mixin_sets_each_steps_seeds_before_the_step():
    """RoundingSeedPerStep (over the launchers' trainers, torchtitan 0.2: job_config, 0.3: config): the step's
    seeds are set, call index 0, before torchtitan's train_step runs."""
    from types import SimpleNamespace

    from titan_fp4six.integration.rounding import RoundingSeedPerStep

    seen = []

    class Base:
        def train_step(self, data_iterator):
            seen.append((GRADIENT_ROUNDING.seed, GRADIENT_ROUNDING.step, GRADIENT_ROUNDING.calls))

    class Trainer02(RoundingSeedPerStep, Base):
        job_config, step = SimpleNamespace(debug=SimpleNamespace(seed=5)), 12

    class Trainer03(RoundingSeedPerStep, Base):
        config, step = SimpleNamespace(debug=SimpleNamespace(seed=None)), 4

    GRADIENT_ROUNDING.next()
    Trainer02().train_step(None)
    GRADIENT_ROUNDING.next()
    Trainer03().train_step(None)
    assert seen == [(5, 12, 0), (0, 4, 0)]


def test_stochastic_rounding_with_wgrad_rht():
    """gradient_rounding='stochastic' with wgrad_rht: dy^T is transformed (numerics.md section 11), then its codes
    round stochastically with the wgrad's seed; same seed -> same bytes, and dW differs from the nearest one."""
    x, w, dy = _dense_operands()
    r = FourOverSixRecipe(gradient_rounding="stochastic", wgrad_rht=True)
    assert r.plan(False).dy_t.transform == "rht16" and r.plan(False).dy_t.rounding == "stochastic"
    dx1, dw1 = _grads(x, w, dy, r, 8)
    assert GRADIENT_ROUNDING.calls == 2
    dx2, dw2 = _grads(x, w, dy, r, 8)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)
    _, dw_nearest = _grads(x, w, dy, FourOverSixRecipe(wgrad_rht=True), 8)
    assert not torch.equal(dw1, dw_nearest)


def test_grouped_stochastic_rounding_with_wgrad_rht():
    """Grouped quantized backward with wgrad_rht: the transformed token blocks of dy round stochastically with the
    wgrad's seed; reproducible, and dW differs from round-to-nearest's."""
    A, W, offs, dy = _grouped_case()
    r = FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic", wgrad_rht=True)
    da1, dw1 = _grouped_grads(A, W, offs, dy, r, 4)
    assert GRADIENT_ROUNDING.calls == 2
    da2, dw2 = _grouped_grads(A, W, offs, dy, r, 4)
    assert torch.equal(da1, da2) and torch.equal(dw1, dw2)
    _, dw_nearest = _grouped_grads(A, W, offs, dy, FourOverSixRecipe(backward="quantized", wgrad_rht=True), 4)
    assert not torch.equal(dw1, dw_nearest)


@pytest.mark.parametrize("args", [(1.5, 1), ("7", 1), (torch.tensor(3), 1), (1, 1.9), (2 ** 64, 1), (-1, 1),
                                  (True, 1), (1, 1, 0.5)])
def test_set_rounding_seed_refuses_what_would_alias_another_seed(args):
    with pytest.raises(ValueError, match=r"set_rounding_seed: \w+=.*; it must be an int in \[0, 2\*\*64\)"):
        set_rounding_seed(*args)
    set_rounding_seed(2 ** 64 - 1, 0)  # the largest seed is taken
    set_rounding_seed(0, 0)


def test_stochastic_rounding_with_a_backward_that_quantizes_nothing_names_the_fix():
    with pytest.raises(ValueError, match=r"use backward='quantized' \('auto' resolves to it for per-tensor dense "
                                         r"GEMMs only\)"):
        FourOverSixRecipe(gradient_rounding="stochastic", backward="high_precision")
