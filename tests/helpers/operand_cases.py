"""Bitwise checks of the operand kernels (fused NVFP4 quantize-decode, columnwise quantization, decode) against
the reference compositions they replace; shared by the interpreter sweep and the GPU sweep.

Each compare_* returns the names of the outputs that differ ([]: bitwise equal). NaN values compare by
position only (a NaN's payload depends on the device's arithmetic), every other byte counts.
"""

import torch

from tests.helpers.kernel_cases import _data
from titan_fp4six.quant import process_state, tensor_amax
from titan_fp4six.numerics import reference
from titan_fp4six.numerics.groups import RowGroups, TokenBlocks
from titan_fp4six.numerics.spec import NVFP4, four_over_six_spec


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes; NaN positions equal (their payloads may differ)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.is_floating_point() and got.element_size() > 1:
        nan = want.isnan()
        return torch.equal(got.isnan(), nan) and torch.equal(_bits(got)[~nan], _bits(want)[~nan])
    return torch.equal(_bits(got), _bits(want))


def _diffs(prefix, got: dict, want: dict):
    return [f"{prefix}.{name}" for name in want if not same_bytes(got[name], want[name])]


def compare_nvfp4_decode(kq, x, amax):
    """The NVFP4 spec's fused quantize-decode against nvfp4_reference + decode_block_scaled."""
    codes, scales = reference.nvfp4_reference(x, amax)
    c, s, _, dec = kq.quantize(x, amax, NVFP4, decode=True)
    return _diffs("nvfp4_decode", {"codes": c, "scales": s, "dec": dec},
                  {"codes": codes, "scales": scales, "dec": reference.decode_block_scaled_reference(codes, scales)})


def compare_columnwise(kq, x, amax, err_mode, scale_bound, decode, nvfp4=True):
    """The columnwise kernels on x (M, K) against the reference on torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16)).t().contiguous()."""
    xt = torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16)).t().contiguous()
    bad = []
    codes, scales, map4 = reference.four_over_six_reference(xt, amax, "1x16", err_mode, scale_bound)
    c, s, m, dec = kq.quantize_columnwise(x, amax, four_over_six_spec("1x16", err_mode, scale_bound, True), decode)
    want = {"codes": codes, "scales": scales, "map4": map4}
    got = {"codes": c, "scales": s, "map4": m}
    if decode:
        want["dec"], got["dec"] = reference.decode_block_scaled_reference(codes, scales), dec
    elif dec is not None:
        bad.append("columnwise.dec (not None without decode)")
    bad += _diffs(f"columnwise[{err_mode},{scale_bound},decode={decode}]", got, want)
    if nvfp4:
        codes, scales = reference.nvfp4_reference(xt, amax)
        c, s, _, dec = kq.quantize_columnwise(x, amax, NVFP4, decode)
        want, got = {"codes": codes, "scales": scales}, {"codes": c, "scales": s}
        if decode:
            want["dec"], got["dec"] = reference.decode_block_scaled_reference(codes, scales), dec
        bad += _diffs(f"nvfp4_columnwise[decode={decode}]", got, want)
    return bad


def compare_decode(kd, codes, scales, amax, scale_bound, dtype):
    """decode_block_scaled and nvfp4_dequantize kernels against the reference (never through quant, which may pick the kernels)."""
    bad = _diffs("decode_block_scaled", {"dec": kd.decode_block_scaled(codes, scales)},
                 {"dec": reference.decode_block_scaled_reference(codes, scales)})
    got = kd.nvfp4_dequantize(codes, scales, amax, scale_bound, dtype)
    want = reference.dequantize_reference(codes, scales, amax, scale_bound, dtype)
    return bad + _diffs(f"nvfp4_dequantize[{scale_bound},{dtype},amax{tuple(amax.shape)}]", {"v": got}, {"v": want})


def column_case(kind, m, k, dtype, gen, row_stride=None):
    """(x, amax): x (m, k) row-major in dtype whose columns carry the kind's blocks (kernel_cases' data built for
    x^T, so ties and edge blocks line up with the columnwise blocks), amax per tensor. With row_stride, x is a
    view into wider rows."""
    mpad = -(-m // 16) * 16
    data, amax = _data(kind, k, mpad, 256, gen)
    x = data.t()[:m].to(dtype)
    if row_stride is not None:
        wide = torch.zeros(m, row_stride, dtype=dtype)
        wide[:, :k] = x
        x = wide[:, :k]
    else:
        x = x.contiguous()
    return x, (tensor_amax(x) if amax is None else amax).float()


def decode_case(rows, cols, gen, edge: bool):
    """Random codes and scales (every byte pattern; with `edge` the scales include NaN, zero, subnormal and
    the largest E4M3 values) and amax vectors with zero, tiny, huge, Inf and NaN rows."""
    codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 256, (rows, cols // 16), dtype=torch.uint8, generator=gen)
    if edge:
        flat = scales.view(-1)
        special = torch.tensor([0x7F, 0xFF, 0x00, 0x80, 0x01, 0x07, 0x7E, 0x08], dtype=torch.uint8)
        idx = torch.arange(0, flat.numel(), 5)
        flat[idx] = special[torch.arange(idx.numel()) % special.numel()]
    amax_rows = torch.rand(rows, generator=gen) * 10
    special = torch.tensor([0.0, 1e-40, 3e38, float("inf"), float("nan"), 2.0 ** -126])
    idx = torch.arange(0, rows, 6)
    amax_rows[idx] = special[torch.arange(idx.numel()) % special.numel()]
    return codes, scales.view(torch.float8_e4m3fn), amax_rows


def epilogue_cases(gen, device, sizes=((37, 300), (16, 16))):
    """(label, dense, grouped or wgrad, args) of the GEMM epilogue: products with NaN, +-Inf, +-0 and values that
    round across bf16 / fp16 boundaries and overflow; amaxes per tensor, row or group including 0, NaN and Inf;
    grouped rows past offs[-1] holding NaN garbage; the grouped wgrad's per-group and per-column factors and an
    empty group; the bf16 grouped backward's zeroing of those rows and groups."""
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 65504.0, 3.4e38, 1e-40])
    for (m, n), out_dtype, bound in zip(sizes * 3, (torch.bfloat16, torch.float16, torch.float32) * 2, (256, 448) * 3):
        acc = torch.randn(m, n, generator=gen) * 2.0 ** torch.randint(-20, 20, (m, n), generator=gen)
        acc.view(-1)[:special.numel()] = special
        row_amax = torch.rand(m, generator=gen) * 1e3
        row_amax[:3] = torch.tensor([0.0, float("nan"), float("inf")])[:m]
        for a_amax in (row_amax, torch.tensor(7.25), torch.tensor(0.0)):
            for b_amax in (torch.tensor(3.5e2), torch.tensor(float("inf"))):
                yield (f"dense/{m}x{n}/{out_dtype}/{bound}/a{tuple(a_amax.shape)}/b{b_amax.item()}", "dense",
                       (acc.to(device), a_amax.to(device), bound, b_amax.to(device), 448 if bound == 256 else 256,
                        out_dtype))
        experts = 4
        offs = torch.tensor([0, m // 3, m // 3, m - 2], dtype=torch.int32)  # an empty group, two tail rows
        group_of_row = torch.searchsorted(offs, torch.arange(m, dtype=torch.int32), right=True)
        prod = acc.to(torch.bfloat16)
        prod[m - 2:] = float("nan")
        w_amax = torch.tensor([5.0, 0.0, float("nan"), 1.5e3])
        for a_amax, per_group in ((row_amax, False), (torch.tensor([2.0, 9.0, 0.0, 11.0]), True)):
            yield (f"grouped/{m}x{n}/{out_dtype}/{bound}/per_group={per_group}", "grouped",
                   (prod.to(device), a_amax.to(device), per_group, w_amax.to(device), group_of_row.to(device), bound,
                    out_dtype))
        assert experts == w_amax.numel()
        # the grouped wgrad (E, R, C): a group's rows share fa, fb per group or per group and column; an empty group
        r = max(m // experts, 1)
        wprod = torch.cat([acc] * experts)[:experts * r].reshape(experts, r, n).to(torch.bfloat16)
        empty = torch.tensor([False, True, False, False])
        col_amax = torch.rand(experts, n, generator=gen) * 1e2
        col_amax.view(-1)[:4] = torch.tensor([0.0, float("nan"), float("inf"), 3e38])
        for b_amax in (w_amax, col_amax):
            yield (f"wgrad/{experts}x{r}x{n}/{out_dtype}/{bound}/b{tuple(b_amax.shape)}", "wgrad",
                   (wprod.to(device), torch.tensor([2.0, 9.0, 0.0, float("nan")]).to(device), bound,
                    b_amax.to(device), 448, empty.to(device), out_dtype))
        # the bf16 grouped backward's zeroing: rows past offs[-1] by their group (int64, limit E), empty groups'
        # weight gradients (bool, limit 1), none or every row flagged
        garbage = acc.to(out_dtype)
        yield f"zero_rows/tail/{m}x{n}/{out_dtype}", "zero_rows", (garbage.to(device), group_of_row.to(device), experts)
        yield (f"zero_rows/empty/{experts}x{r}x{n}/{out_dtype}", "zero_rows",
               (wprod.to(out_dtype).to(device), empty.to(device), 1))
        for flag in (torch.zeros(m, dtype=torch.int64), torch.ones(m, dtype=torch.int64)):
            yield (f"zero_rows/all={bool(flag[0])}/{m}x{n}/{out_dtype}", "zero_rows",
                   (garbage.to(device), flag.to(device), 1))


def compare_epilogue(ke, kind, args):
    """The epilogue kernels against scale_cast_reference / grouped_scale_cast_reference /
    grouped_wgrad_scale_cast_reference / zero_rows_reference."""
    if kind == "zero_rows":  # both in place: each on its own copy
        x, flag, limit = args
        got, want = ke.zero_rows(x.clone(), flag, limit), reference.zero_rows_reference(x.clone(), flag, limit)
    elif kind == "dense":
        got, want = ke.scale_cast(*args), reference.scale_cast_reference(*args)
    elif kind == "wgrad":
        got, want = ke.grouped_wgrad_scale_cast(*args), reference.grouped_wgrad_scale_cast_reference(*args)
    else:
        got, want = ke.grouped_scale_cast(*args), reference.grouped_scale_cast_reference(*args)
    return _diffs(kind, {"out": got}, {"out": want})


def row_groups_cases(gen, device, rows=37, cols=48, experts_rows=(3, 16), dtypes=(torch.bfloat16, torch.float32)):
    """(label, x, amax, groups, block) of amaxes the quantizer reads per row itself: a grouped GEMM's A by token
    group (amax per group, or per row when row-scaled; empty groups, NaN garbage past offs[-1], a NaN token and
    a zero-amax group) and expert weights flattened to (E*N, K) with one amax per expert's N rows (1x16 and
    16x16 tiles inside an expert)."""
    from titan_fp4six.quant.amax import run_expert_amax, run_token_groups

    offs = torch.tensor([0, rows // 3, rows // 3, rows - 7], dtype=torch.int32, device=device)
    for dtype in dtypes:
        x = (torch.randn(rows, cols, generator=gen) * 4).to(dtype).to(device)
        x[rows - 7:] = float("nan")  # not tokens: never read by an amax, never counted
        x[rows // 3 + 1, 3] = float("nan")
        for per_row in (False, True):
            amax, group, _ = run_token_groups(x, offs, per_row, "reference")
            if not per_row:
                amax[3] = 0.0  # a group whose amax is 0 (its blocks quantize to zeros and count)
            groups = RowGroups(group, offs.numel(), amax_by_group=not per_row)
            yield f"tokens/{dtype}/per_row={per_row}", x, amax, groups, "1x16"
        experts, n = experts_rows
        for block, per_expert in (("1x16", 5), ("16x16", n)):
            w = (torch.randn(experts * per_expert, cols, generator=gen) * 2.0 ** torch.randint(
                -6, 6, (experts * per_expert, 1), generator=gen)).to(dtype).to(device)
            yield (f"experts/{dtype}/{block}/{experts}x{per_expert}", w, run_expert_amax(w, experts, "reference"), None,
                   block)


def compare_row_groups(kq, kd, x, amax, groups, block, err_mode, scale_bound):
    """The quantizer and the dequantizer reading the amax per row themselves (token groups, expert runs), with
    the mask, with the counts added to a running pair, and with neither, against the reference of the amax
    expanded per row (reference.amax_per_row) and reference.map4_counts."""
    amax_rows = reference.amax_per_row(amax, x.shape[0], groups)
    codes, scales, mask = reference.four_over_six_reference(x, amax_rows, block, err_mode, scale_bound)
    want = {"codes": codes, "scales": scales, "map4": mask}
    spec = four_over_six_spec(block, err_mode, scale_bound, True)
    c, s, m, dec = kq.quantize(x, amax, spec, decode=True, groups=groups)
    want["dec"] = reference.decode_block_scaled_reference(codes, scales)
    bad = _diffs("mask", {"codes": c, "scales": s, "map4": m, "dec": dec}, want)
    counts = process_state.map4_count_buffer(x.device)
    counts[-1, :2] = start = torch.tensor([5, 7])
    c, s, m, _ = kq.quantize(x, amax, spec, groups=groups, map4=counts)
    same = {"codes": codes, "scales": scales}
    bad += _diffs("counted", {"codes": c, "scales": s}, same) + ([] if m is None else ["counted.map4 not None"])
    want_counts = start.to(x.device) + reference.map4_counts(mask, groups)
    got_counts = process_state.map4_total(counts)
    bad += [] if torch.equal(got_counts, want_counts) else [f"counts {got_counts.tolist()} != {want_counts.tolist()}"]
    c, s, m, dec = kq.quantize(x, amax, spec, decode=True, groups=groups, map4=False)
    same["dec"] = want["dec"]
    bad += _diffs("no map4", {"codes": c, "scales": s, "dec": dec}, same) + ([] if m is None else ["map4 not None"])
    for dtype in (torch.bfloat16, torch.float32):
        got = kd.nvfp4_dequantize(codes, scales, amax, scale_bound, dtype, groups)
        ref = reference.dequantize_reference(codes, scales, amax_rows, scale_bound, dtype)
        bad += _diffs(f"dequantize[{dtype}]", {"v": got}, {"v": ref})
    return bad


TOKEN_BLOCK_ENDS = ([0, 12, 12, 30, 47], [3, 40], [50])  # an empty first group, a repeated end, a group of
# fewer than 16 tokens, rows past offs[-1] (NaN there), all rows one group


def token_block_cases(gen, device, rows=50, cols=32, kinds=("normal", "ties", "wide", "saturate", "nan_inf",
                                                            "low_edge", "tiny_amax", "zero_amax", "nan_amax"),
                      dtypes=(torch.bfloat16, torch.float16, torch.float32)):
    """(label, x, TokenBlocks, amax, spec, seed) of the grouped wgrad's columnwise operands read by token blocks:
    every data kind with one amax per group (a kind's given amax, else the groups' own, one group's replaced by
    the kind's) or per group and column (the groups' own), 4/6 in both error modes and bounds, map-to-6 only,
    NVFP4 and stochastic NVFP4; rows past offs[-1] hold NaN, which no block reads."""
    from titan_fp4six.quant.amax import group_index, run_group_column_amax, run_token_groups
    from titan_fp4six.numerics.spec import NVFP4_STOCHASTIC

    specs = (four_over_six_spec("1x16", "mse", 256, True), four_over_six_spec("1x16", "mae", 448, True),
             four_over_six_spec("1x16", "mse", 256, False), NVFP4, NVFP4_STOCHASTIC)
    for index, kind in enumerate(kinds):
        dtype = dtypes[index % len(dtypes)]
        ends = TOKEN_BLOCK_ENDS[index % len(TOKEN_BLOCK_ENDS)]
        offs = torch.tensor(ends, dtype=torch.int32, device=device)
        x, given = _data(kind, rows, -(-cols // 16) * 16, 256, gen)  # the kinds' data comes in 16-element runs
        x = x.to(dtype)[:, :cols]  # a row stride wider than the row where cols is not a multiple of 16
        x[ends[-1]:] = float("nan")
        x = x.to(device)
        tb = TokenBlocks.of(offs, rows)
        group_amax = run_token_groups(x, offs, False, "reference")[0]
        if given is not None:
            group_amax = group_amax.clone()
            group_amax[-1] = given.to(device)
        column_amax = run_group_column_amax(x, group_index(offs, rows), offs.numel())
        for spec_index, spec in enumerate(specs):
            amax = column_amax if spec_index == 1 else group_amax
            seed = 12345 + index if spec.rounding == "stochastic" else None
            yield (f"token_blocks/{kind}/{dtype}/{ends}/{spec.candidates}/{spec.err_mode}/{spec.scale_bound}/"
                   f"{spec.rounding}/amax{tuple(amax.shape)}", x, tb, amax, spec, seed)


def compare_token_blocks(kq, x, tb, amax, spec, seed):
    """The quantizer reading x in place by token blocks against the reference of the gathered layout
    (quant.quantize.run_quantize_token_blocks with the reference), codes, scales and decode."""
    from titan_fp4six.quant.quantize import run_quantize_token_blocks

    codes, scales, _, dec = kq.quantize_token_blocks(x, tb, amax, spec, True, seed)
    want = run_quantize_token_blocks(x, tb, amax, spec, "reference", True, seed)
    return _diffs("token_blocks", {"codes": codes, "scales": scales, "dec": dec},
                  {"codes": want[0], "scales": want[1], "dec": want[2]})
