"""Run by test_kernels_interp in a subprocess with TRITON_INTERPRET=1: the operand kernels (fused NVFP4
quantize-decode, columnwise quantization, decode, GEMM epilogue), the public amax check and the grouped GEMM's
token groups against the reference compositions on the CPU.

    TRITON_INTERPRET=1 python -m tests.helpers.interp_sweep_operands [SECTION ...]  (all: none)

SECTION: nvfp4_decode, columnwise, decode, map6_only, epilogue, amax_check, token_groups, row_groups,
token_blocks.

Prints one line per mismatching configuration and a final `configs N mismatches M` line. A thin sample that
keeps the interpreter's time small (few programs per launch); the GPU sweep (test_kernels_operands_gpu.py)
takes realistic shapes.
"""

import os
import sys
import time

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from tests.helpers.kernel_cases import (_data, amax_check_cases, few_programs, map4_counts_pair,  # noqa: E402
                                        near_tie_case)
from tests.helpers.operand_cases import (column_case, compare_columnwise, compare_decode, compare_epilogue,  # noqa: E402
                                         compare_nvfp4_decode, compare_row_groups, compare_token_blocks, decode_case,
                                         epilogue_cases, row_groups_cases, token_block_cases)
from titan_fp4six.kernels import decode as kd  # noqa: E402
from titan_fp4six.kernels import quantize as kq  # noqa: E402
from titan_fp4six.quant import tensor_amax  # noqa: E402
from titan_fp4six.numerics.spec import NVFP4, four_over_six_spec  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "tiny_amax", "high_edge", "zero_amax",
         "nan_amax", "inf_amax")
COLUMN_KINDS = ("normal", "ties", "wide", "saturate", "nan_inf", "low_edge", "tiny_amax")


def nvfp4_decode(gen):
    """Row-major NVFP4 with its decode: 2 rows (2 programs), 5 blocks a row, every kind and dtype in rotation."""
    for index, kind in enumerate(KINDS):
        dtype = DTYPES[index % 3]
        x, amax = _data(kind, 2, 80, 448, gen)
        x = x.to(dtype)
        amax = (tensor_amax(x) if amax is None else amax).float()
        if index % 4 == 3:  # one amax per row
            amax = torch.stack([amax, amax * 3])
        yield f"nvfp4_decode/{kind}/{dtype}/amax{tuple(amax.shape)}", compare_nvfp4_decode(kq, x, amax)


def columnwise(gen):
    """Columnwise 4/6 (every knob pair, with and without the decode) and NVFP4: ragged M (zero-row padding),
    K not a multiple of anything, rows in wider storage, every kind and dtype in rotation, near ties."""
    knobs = (("mse", 256), ("mae", 448), ("mae", 256), ("mse", 448))
    shapes = ((37, 24, None), (16, 40, None), (5, 20, 29), (21, 31, None))
    for index, kind in enumerate(COLUMN_KINDS):
        dtype = DTYPES[index % 3]
        m, k, stride = shapes[index % len(shapes)]
        err_mode, bound = knobs[index % len(knobs)]
        x, amax = column_case(kind, m, k, dtype, gen, stride)
        bad = compare_columnwise(kq, x, amax, err_mode, bound, decode=index % 2 == 0, nvfp4=index % 3 == 0)
        yield f"columnwise/{m}x{k}/{kind}/{dtype}/{err_mode}/{bound}", bad
    # Near-tied candidate errors, several chunks per program (some redone exactly after the chunk loop).
    with few_programs(kq):
        for err_mode, bound, decode in (("mae", 448, True), ):
            x, amax = near_tie_case("1x16", err_mode, bound, count=4)
            x = x.t().contiguous()  # columnwise quantizes x^T: the near-tie blocks
            yield f"columnwise/near ties/{err_mode}/{bound}", compare_columnwise(kq, x, amax, err_mode, bound, decode,
                                                                                nvfp4=False)


def decode(gen):
    """Both decode kernels on every code byte and edge scales, per-tensor and per-row amax (1e36: the rescaled
    order), every output dtype."""
    for rows, cols, edge in ((9, 48, True), (3, 1040, False)):
        codes, scales, amax_rows = decode_case(rows, cols, gen, edge)
        for index, dtype in enumerate(DTYPES):
            for amax in (amax_rows, amax_rows[1].clone(), torch.tensor(float("nan")), torch.tensor(1e36)):
                bound = (256, 448)[index % 2]
                yield f"decode/{rows}x{cols}/{dtype}/{bound}/amax{tuple(amax.shape)}", compare_decode(
                    kd, codes, scales, amax, bound, dtype)


def map6_only(gen):
    """Map-to-6 only (an operand outside the recipe's scope): row-major 1x16 / 16x16 with and without the decode,
    and columnwise, every kind in rotation, against the reference with choose=False."""
    from titan_fp4six.numerics import reference

    knobs = (("1x16", "mse", 256), ("16x16", "mae", 448), ("16x16", "mse", 256), ("1x16", "mae", 448))
    for index, kind in enumerate(COLUMN_KINDS):
        block, err_mode, bound = knobs[index % len(knobs)]
        x, amax = _data(kind, 16, 64, bound, gen)
        x = x.to(DTYPES[index % 3])
        amax = (tensor_amax(x) if amax is None else amax).float()
        want = reference.four_over_six_reference(x, amax, block, err_mode, bound, choose=False)
        spec = four_over_six_spec(block, err_mode, bound, False)
        codes, scales, map4, dec = kq.quantize(x, amax, spec, decode=True)
        plain = kq.quantize(x, amax, spec)
        bad = [name for name, got, ref in (("codes", codes, want[0]), ("plain codes", plain[0], want[0]),
                                           ("scales", scales.view(torch.uint8), want[1].view(torch.uint8)),
                                           ("plain scales", plain[1].view(torch.uint8), want[1].view(torch.uint8)))
               if not torch.equal(got, ref)]
        if map4.any() or plain[2].any():
            bad.append("map4")
        ref_dec = reference.decode_block_scaled_reference(want[0], want[1])
        if not torch.equal(dec.isnan(), ref_dec.isnan()) or not torch.equal(dec.nan_to_num(), ref_dec.nan_to_num()):
            bad.append("decode")
        yield f"map6_only/{block}/{kind}/{x.dtype}/{err_mode}/{bound}", bad
        if block == "1x16" and amax.dim() == 0:
            xt = torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16)).t().contiguous()
            want = reference.four_over_six_reference(xt, amax, "1x16", err_mode, bound, choose=False)
            codes, scales, map4, _ = kq.quantize_columnwise(x, amax, spec)
            ok = torch.equal(codes, want[0]) and torch.equal(scales.view(torch.uint8), want[1].view(torch.uint8))
            yield f"map6_only/columnwise/{kind}/{x.dtype}/{err_mode}/{bound}", [] if ok and not map4.any() else ["cw"]


def epilogue(gen):
    """The GEMM epilogue kernel (factors x product -> output dtype), dense and grouped, on edge values."""
    from titan_fp4six.kernels import epilogue as ke

    for label, kind, args in epilogue_cases(gen, "cpu", sizes=((5, 40), (16, 16))):
        yield f"epilogue/{label}", compare_epilogue(ke, kind, args)


def _device_asserts_on() -> None:
    """Compile the interpreter's device asserts in, as the launch option debug=True does on the GPU (the
    interpreter keeps one builder whose options ignore launch options)."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, debug=True, sanitize_overflow=False)


def amax_check(gen):
    """The quantize kernel's amax check (the public quantizers' validate_amax, device asserts) against the
    reference's verdict: every quantizer variant that takes the amax (four-over-six 1x16, 16x16 where the amax
    is per tensor and the rows whole tiles, standard NVFP4 with its decode)."""
    _device_asserts_on()
    for label, x, amax, covers in amax_check_cases(gen):
        runs = {"1x16": lambda: kq.quantize(x, amax, four_over_six_spec("1x16", "mse", 256, True), check_amax=True),
                "nvfp4": lambda: kq.quantize(x, amax, NVFP4, decode=True, check_amax=True)}
        if amax.dim() == 0 and x.shape[0] % 16 == 0:
            runs["16x16"] = lambda: kq.quantize(x, amax, four_over_six_spec("16x16", "mae", 448, True), check_amax=True)
        bad = []
        for variant, run in runs.items():
            try:
                run()
                passed = True
            except Exception as exc:  # the interpreter wraps the device assert's AssertionError
                if "AssertionError" not in repr(exc):
                    raise
                passed = False
            if passed != covers:
                bad.append(f"{variant}: {'passed' if passed else 'asserted'}, expected {covers}")
        yield label, bad


def token_groups(gen):
    """The grouped GEMM's token-group kernel (each row's group; amax per row or per group; empty groups) against
    the reference: one expert, empty groups (a repeated end, a first group of no rows), groups ending before the
    last row, NaN and Inf in tokens and past the last group, a row stride wider than the row, every dtype."""
    from titan_fp4six.quant.amax import run_token_groups
    from titan_fp4six.kernels import amax as ka

    ends = ([40], [0, 12, 12, 30, 47], [5, 9, 20], [3, 3, 3, 3, 3, 50, 50, 50, 50])
    for index, offs in enumerate(ends):
        dtype = DTYPES[index % 3]
        wide = (torch.randn(50, 48, generator=gen) * 3).to(dtype)
        x = wide[:, :32]  # row stride 48
        x[2, 5] = float("inf")
        x[49, 0] = float("nan")  # a token only where offs[-1] is 50
        offs = torch.tensor(offs, dtype=torch.int32)
        for per_row in (True, False):
            got, group, empty = ka.token_groups(x, offs, per_row)
            want, want_group, want_empty = run_token_groups(x, offs, per_row, "reference")
            bad = [] if torch.equal(group, want_group) else ["group ids"]
            bad += [] if torch.equal(empty, want_empty) else [f"empty groups {empty.tolist()}"]
            same = torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])
            bad += [] if same else [f"amax {got.tolist()} != {want.tolist()}"]
            yield f"token_groups/{offs.tolist()}/{dtype}/per_row={per_row}", bad


def token_blocks(gen):
    """The columnwise quantizer reading the grouped wgrad's token blocks in place (per-block group amaxes, per group
    or per group and column; every spec of the quantized backward) against the reference of the gathered layout."""
    for label, x, tb, amax, spec, seed in token_block_cases(gen, "cpu"):
        yield label, compare_token_blocks(kq, x, tb, amax, spec, seed)


def row_groups(gen):
    """Amax read per row by the kernels (token groups, per-row tokens, expert runs), the map-to-4 mask, counts
    and neither, and the dequantizer; then the counts of programs of several chunks, some redone exactly after
    the chunk loop (the near ties, as in the quantizer sweep), whose exact choice replaces the fast one's count."""
    from titan_fp4six.numerics import formats, reference

    knobs = (("mse", 256), ("mae", 448))
    cases = row_groups_cases(gen, "cpu", rows=23, cols=32, dtypes=(torch.bfloat16, ))
    for index, (label, x, amax, groups, block) in enumerate(cases):
        err_mode, bound = knobs[index % 2]
        yield f"row_groups/{label}/{err_mode}/{bound}", compare_row_groups(kq, kd, x, amax, groups, block, err_mode,
                                                                          bound)
    # rows of 48 blocks, which the one-row launch runs 2 rows a warp (kernels.quantize._row_launch)
    for label, x, amax, groups, block in row_groups_cases(gen, "cpu", rows=23, cols=768, dtypes=(torch.bfloat16, )):
        if block == "1x16":
            yield f"row_groups/short rows/{label}", compare_row_groups(kq, kd, x, amax, groups, block, "mse", 256)
    with few_programs(kq):
        for block, err_mode, bound in (("1x16", "mse", 256), ("16x16", "mse", 448)):
            x, amax = near_tie_case(block, err_mode, bound, count=8)
            x = x.reshape(1, -1) if block == "1x16" else x.reshape(-1, 16, 256).transpose(0, 1).reshape(16, -1)
            got, want = map4_counts_pair(kq, x, amax, block, err_mode, bound)
            ok = torch.equal(got, want) and 0 < want[0] < want[1]
            yield f"row_groups/near ties counted/{block}", [] if ok else [f"{got.tolist()} != {want.tolist()}"]
        # 16x16 counts a tile's choice once per row of the tile: two tile rows, a program of 2 chunks of 4 blocks whose
        # second holds 1 block of the row's 5, and map-to-6 only (its plain twin: no map-to-4)
        assert kq._chunks_per_program(2, 2, kq.LAUNCH["16x16", False].most_chunks) == 2
        x = torch.randn(32, 80, generator=gen)
        ints = torch.randint(-4, 5, (32, 80), generator=gen).float()  # map-to-4 represents them exactly: it wins
        x = torch.where(torch.tensor([1, 0, 1, 0, 1]).repeat_interleave(16).bool(), ints, x)
        x[16:, :16] = torch.randn(16, 16, generator=gen)  # one tile column choosing both ways
        x = x.to(torch.bfloat16)
        amax = tensor_amax(x).float()
        for choose in (True, False):
            got, want = map4_counts_pair(kq, x, amax, "16x16", "mse", 256, choose)
            ok = torch.equal(got, want) and want[1] == 32 * 5 and (0 < want[0] < want[1] if choose else want[0] == 0)
            yield f"row_groups/tiles counted/choose={choose}", [] if ok else [f"{got.tolist()} != {want.tolist()}"]


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    configs = mismatches = 0
    start = time.time()
    sections = {"nvfp4_decode": nvfp4_decode, "columnwise": columnwise, "decode": decode, "map6_only": map6_only,
                "epilogue": epilogue, "amax_check": amax_check, "token_groups": token_groups,
                "row_groups": row_groups, "token_blocks": token_blocks}
    for name in sys.argv[1:] or sections:
        for label, bad in sections[name](gen):
            configs += 1
            print(f"{time.time() - start:6.1f} s {label}", flush=True)
            if bad:
                mismatches += 1
                print("MISMATCH", label, bad)
    print("configs", configs, "mismatches", mismatches)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
