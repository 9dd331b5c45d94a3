"""Adversarial inputs for the bitwise kernel-vs-reference sweeps (shared by the interpreter and GPU tests).

Each case is (name, x, amax) with data made to hit E2M1 ties, exact error ties between the candidates,
E4M3 saturation and subnormal scales, zero blocks, FLT_MAX clamps of the global scale, NaN and Inf.
"""

import contextlib
import itertools

import torch

from titan_fp4six.numerics import reference
from titan_fp4six.numerics.spec import four_over_six_spec
from titan_fp4six.quant import process_state, row_amax, tensor_amax

TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


@contextlib.contextmanager
def few_programs(kq):
    """Launches under kernels.quantize module `kq` with the floor on the number of programs lowered to 1, so that
    a program takes up to its launch's most chunks, as on a GPU-sized input; _chunks_per_program's cache (kept
    under the floor in force when first asked) cleared on entry and exit."""
    floor, kq.MIN_PROGRAMS = kq.MIN_PROGRAMS, 1
    kq._chunks_per_program.cache_clear()
    try:
        yield
    finally:
        kq.MIN_PROGRAMS = floor
        kq._chunks_per_program.cache_clear()


def map4_counts_pair(kq, x, amax, block, err_mode, scale_bound, choose=True):
    """(kernel, reference) (map-to-4 blocks, blocks) of x: kernels.quantize module `kq` counting into a buffer
    of its own, against reference.map4_counts of the reference's mask."""
    counts = process_state.map4_count_buffer(x.device)
    kq.quantize(x, amax, four_over_six_spec(block, err_mode, scale_bound, choose), map4=counts)
    mask = reference.four_over_six_reference(x, amax, block, err_mode, scale_bound, choose=choose)[2]
    return process_state.map4_total(counts), reference.map4_counts(mask)


def _tie_data(rows, cols, scale_bound, gen):
    """With amax = 6B the global scale is 1, so a block whose max is 6*2^k gets sf6 = 2^k exactly and
    x / 2^k lands on the E2M1 tie points; blocks of {0, 6*2^k} make both candidates exact (an error tie)."""
    k = torch.randint(-8, 6, (rows, cols // 16, 1), generator=gen).float()
    pick = torch.randint(0, len(TIES), (rows, cols // 16, 16), generator=gen)
    t = torch.tensor(TIES)[pick]
    t[..., 0] = 6.0
    sign = torch.where(torch.rand(t.shape, generator=gen) < 0.5, -1.0, 1.0)
    exact = torch.rand((rows, cols // 16, 1), generator=gen) < 0.2
    t = torch.where(exact, torch.where(torch.rand(t.shape, generator=gen) < 0.5, 0.0, 6.0), t)
    return (sign * t * torch.exp2(k)).view(rows, cols), torch.tensor(6.0 * scale_bound)


def _data(kind, rows, cols, scale_bound, gen):
    x = torch.randn(rows, cols, generator=gen)
    if kind == "normal":
        return x, None
    if kind == "ties":
        return _tie_data(rows, cols, scale_bound, gen)
    if kind == "wide":  # block magnitudes over ~30 binades: subnormal and zero E4M3 scales, zero blocks
        x = x * torch.exp2(torch.randint(-30, 4, (rows, cols // 16, 1), generator=gen).float()).repeat_interleave(16, -1).view(rows, cols)
        x[:, :16] = 0.0
        return x, None
    if kind == "saturate":  # amax far below the data: q clamps at +-6 and the scales saturate at 448
        return x, tensor_amax(x) / 64
    if kind == "nan_inf":
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 97),), generator=gen)
        flat[idx[0::3]] = float("nan")
        flat[idx[1::3]] = float("inf")
        flat[idx[2::3]] = -float("inf")
        return x, tensor_amax(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
    if kind == "low_edge":  # small amax (S_enc ~ 2^67) with blocks below 2^-124, where div6 is not exact
        tiny = torch.rand(rows, cols // 16, 1, generator=gen) < 0.25
        scales = torch.where(tiny, torch.tensor(2.0 ** -128), torch.tensor(2.0 ** -58))
        return x * scales.repeat_interleave(16, -1).view(rows, cols), torch.tensor(2.0 ** -56)
    if kind == "high_edge":  # amax at the fast path's upper edge; some blocks above its 2^56 block max
        x = x * 2.0 ** 52
        x[::8, :16] *= 32.0
        return x, torch.tensor(2.0 ** 58)
    if kind == "huge_amax":
        return x, torch.tensor(3.0e38)
    if kind == "tiny_amax":  # S_enc = 6B / amax overflows: clamped to FLT_MAX
        return x * 1e-38, torch.tensor(1e-42)
    if kind == "zero_amax":
        return x, torch.tensor(0.0)
    if kind == "inf_amax":
        return x, torch.tensor(float("inf"))
    if kind == "nan_amax":
        return x, torch.tensor(float("nan"))
    raise ValueError(kind)


KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "high_edge", "huge_amax", "tiny_amax",
         "zero_amax", "inf_amax", "nan_amax")


def _row_amax(x, given, block):
    """Per-row amax; for 16x16 one amax per 16-row tile (what expert weights give). Some rows get 0 / NaN."""
    a = row_amax(x) if given is None else given.expand(x.shape[0]).clone()
    if block == "16x16":
        a = a.view(-1, 16).amax(dim=1).repeat_interleave(16)
    elif a.numel() > 2:
        a[1] = 0.0
        a[-1] = float("nan") if a.numel() % 2 else a[-1]
    return a


def cases(shapes, dtypes, kinds=KINDS, seed=0):
    """Yield (label, x, amax, block) over shapes x dtypes x kinds x block x amax mode, on CPU."""
    gen = torch.Generator().manual_seed(seed)
    for (rows, cols), dtype, kind, block, per_row in itertools.product(shapes, dtypes, kinds, ("1x16", "16x16"),
                                                                    (False, True)):
        if block == "16x16" and rows % 16:
            continue
        x, amax = _data(kind, rows, cols, 256, gen)
        x = x.to(dtype)
        if amax is None:
            amax = tensor_amax(x)
        amax = amax.float()
        if per_row:
            amax = _row_amax(x, None if kind in ("normal", "wide", "ties", "nan_inf") else amax, block)
        yield f"{rows}x{cols}/{str(dtype)[6:]}/{kind}/{block}/{'row' if per_row else 'tensor'}", x, amax, block


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.uint8)


def compare(kq, x, amax, block, err_mode, scale_bound):
    """Outputs where the kernel module `kq` differs from the reference on the same device ([]: bitwise equal).

    Runs four-over-six quantize, the fused quantize-decode and (for 1x16, B=448) standard NVFP4; every byte
    counts, the codes inside NaN-scale blocks too (NaN encodes as the canonical reference.NAN_CODE).
    """
    from titan_fp4six.numerics import reference
    from titan_fp4six.numerics.spec import NVFP4, four_over_six_spec

    def code_diffs(name, codes, ref_codes, ref_scales):
        return [] if torch.equal(codes, ref_codes) else [f"{name}.codes"]

    bad = []
    rc, rs, rm = reference.four_over_six_reference(x, amax, block, err_mode, scale_bound)
    spec = four_over_six_spec(block, err_mode, scale_bound, True)
    c, s, m, _ = kq.quantize(x, amax, spec)
    c2, s2, m2, dec = kq.quantize(x, amax, spec, decode=True)
    rdec = reference.decode_block_scaled_reference(rc, rs)
    for name, got_c, got_s, got_m in (("quantize", c, s, m), ("quantize_decode", c2, s2, m2)):
        bad += code_diffs(name, got_c, rc, rs)
        if not torch.equal(_bits(got_s), _bits(rs)):
            bad.append(f"{name}.scales")
        if not torch.equal(got_m, rm):
            bad.append(f"{name}.map4")
    nan = rdec.isnan()
    if not (torch.equal(dec.isnan(), nan) and torch.equal(_bits(dec)[~nan], _bits(rdec)[~nan])):
        bad.append("quantize_decode.decode")
    if block == "1x16" and scale_bound == 448:
        rc, rs = reference.nvfp4_reference(x, amax)
        c, s, _, _ = kq.quantize(x, amax, NVFP4)
        bad += code_diffs("nvfp4", c, rc, rs)
        if not torch.equal(_bits(s), _bits(rs)):
            bad.append("nvfp4.scales")
    return bad


def expert_weight_case(rows_per_expert, cols=48, scales=(1.0, 0.0, 1e-3, 30.0), seed=0):
    """(x, amax): expert weights (E * N, K) in bf16, E = len(scales) experts of very different magnitudes (a
    zero one among them), and their amaxes (E,), one per expert's run of N rows, as the grouped forward quantizes
    them (the 16x16 kernels read one amax per tile row)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(scales) * rows_per_expert, cols, generator=gen)
    x = (x * torch.tensor(scales).repeat_interleave(rows_per_expert)[:, None]).to(torch.bfloat16)
    return x, x.view(len(scales), -1).abs().amax(dim=1).float()


def compare_expert_amax(kq, x, amax, err_mode, scale_bound):
    """Outputs where `kq`'s 16x16 quantize (with and without the decode) of x with one amax per expert's run of
    rows differs from the reference given each row's amax ([]: bitwise equal)."""
    from titan_fp4six.numerics import reference
    from titan_fp4six.numerics.spec import four_over_six_spec

    rc, rs, rm = reference.four_over_six_reference(x, amax.repeat_interleave(x.shape[0] // amax.numel()), "16x16",
                                                   err_mode, scale_bound)
    spec = four_over_six_spec("16x16", err_mode, scale_bound, True)
    bad = []
    for decode in (False, True):
        c, sc, m, _ = kq.quantize(x, amax, spec, decode)
        bad += [f"{name} (decode={decode})" for name, got, want in
                (("codes", c, rc), ("scales", _bits(sc), _bits(rs)), ("map4", m, rm)) if not torch.equal(got, want)]
    return bad


def near_tie_case(block, err_mode, scale_bound, count=128, steps=28, seed=0):
    """(x, amax) in FP32 whose blocks (1x16) or tiles (16x16) have nearly tied candidate errors, at every distance
    from ~1e-1 down to a few ulps: each is a mix t * a + (1 - t) * b of a block that map-to-4 wins and one that
    map-to-6 wins (same max, so the same scales), with t bisected toward the crossing of err4 - err6 and the
    block kept at every step. These are the blocks where the kernels' error bounds have the least room, so a
    bound that is too tight shows up as a wrong choice; the closest ones take the exact path."""
    from titan_fp4six.numerics import reference

    gen = torch.Generator().manual_seed(seed)
    amax = torch.tensor(4.0 if scale_bound == 256 else 8.0)  # block max 4: sf6 = 256 or 224, sf4 = 1.5 sf6
    rows = 16 if block == "16x16" else 1
    # Blocks of either candidate's grid values plus noise (here map-to-6 decodes to 4/6 of the E2M1 values and
    # map-to-4 to the E2M1 values), which that candidate tends to win.
    e2m1 = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    pick = torch.randint(0, 6, (2, 8 * count, rows, 16), generator=gen)
    pool = torch.cat([e2m1[pick[0]] * (4.0 / 6.0), e2m1[pick[1]]])
    pool = pool * (1 + 0.05 * torch.randn(pool.shape, generator=gen))
    pool = pool * torch.where(torch.rand(pool.shape, generator=gen) < 0.5, -1.0, 1.0)
    pool[:, 0, 0] = 4.0  # every block (tile) max is 4, so the candidate scales stay put

    def gap(x):  # err4 - err6 of every block (tile) of x (n, rows, 16)
        flat = x.permute(1, 0, 2).reshape(rows, -1)
        err6, err4 = reference.four_over_six_candidates(flat, amax, block, err_mode, scale_bound)[4:]
        return (err4 - err6)[0]

    g = gap(pool)
    wins4, wins6 = pool[g < 0], pool[g > 0]
    assert len(wins4) >= count and len(wins6) >= count, "too few blocks won by each candidate"
    a, b = wins4[:count], wins6[:count]
    lo, hi = torch.zeros(count), torch.ones(count)  # gap(mix(lo)) > 0 > gap(mix(hi))
    kept = []
    for _ in range(steps):
        mid = (lo + hi) / 2
        x = a * mid[:, None, None] + b * (1 - mid[:, None, None])
        x[:, 0, 0] = 4.0
        kept.append(x)
        above = gap(x) > 0
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    x = torch.cat(kept)  # (steps * count, rows, 16): 16 blocks (tiles) side by side per 256 columns
    x = x.reshape(-1, 16, rows, 16).permute(2, 0, 1, 3).reshape(rows, -1, 256)
    return x.permute(1, 0, 2).reshape(-1, 256), amax


def amax_check_cases(gen, device="cpu"):
    """(label, x, amax, covers) for the public amax check: data with NaN, Inf and zero rows, in every dtype and
    in rows of wider storage; per-tensor and per-row amaxes at, above and below the data, negative, -0, NaN, and
    a finite amax below finite data that also holds a NaN (the NaN does not excuse the rest). `covers` is the
    verdict of numerics.validation.check_amax_covers (the rule's one home)."""
    from titan_fp4six.numerics.reference import row_amax_reference, tensor_amax_reference
    from titan_fp4six.numerics.validation import check_amax_covers

    def reference_verdict(x, amax):
        try:
            check_amax_covers(x.cpu(), amax.cpu())
        except ValueError:
            return False
        return True

    base = torch.randn(7, 32, generator=gen) * 3
    base[2, 5], base[4, 9], base[6] = float("nan"), -float("inf"), 0.0
    finite = torch.randn(16, 64, generator=gen)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        data = (("nan_inf", base.to(dtype)), ("finite", finite.to(dtype)), ("strided", finite.to(dtype)[:, :32]))
        for name, x in data if dtype == torch.bfloat16 else data[:1]:  # the rule is dtype-blind; the loads are not
            x = x.to(device)
            t, r = tensor_amax_reference(x), row_amax_reference(x)
            lowered = r.clone()
            lowered[1] = lowered[1] * 0.99
            amaxes = {"tensor": t, "rows": r, "tensor / 2": t / 2, "rows one lowered": lowered,
                      "negative row": torch.where(torch.arange(len(r), device=device) == 3, -1.0, r.abs() + 1),
                      "one": torch.tensor(1.0, device=device)}
            if dtype == torch.bfloat16:  # NaN and Inf amaxes send every block down the slow exact path
                amaxes.update({"tensor x2": t * 2, "negative": -t.abs() - 1, "-0": torch.tensor(-0.0, device=device),
                               "nan": torch.tensor(float("nan"), device=device),
                               "inf": torch.tensor(float("inf"), device=device)})
            for label, amax in amaxes.items():
                yield f"amax_check/{name}/{dtype}/{label}", x, amax.float(), reference_verdict(x, amax.float())
