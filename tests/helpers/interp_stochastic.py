"""Run by test_stochastic_rounding in a subprocess with TRITON_INTERPRET=1: numerics.philox against Triton's own
tl.randint4x (all four words), the kernels' rounding rule at its thresholds, and the Triton NVFP4 quantizer's
stochastic rounding (row-major and columnwise, with and without the decode) against the reference, bitwise, on
the CPU.

    TRITON_INTERPRET=1 python -m tests.helpers.interp_stochastic

Prints one line per mismatch and a final `configs N mismatches M` line. A thin sample (the interpreter is slow);
the GPU tests in test_stochastic_rounding.py take the full kind sweep and realistic shapes.
"""

import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from tests.helpers.kernel_cases import _data  # noqa: E402
from tests.helpers.operand_cases import same_bytes  # noqa: E402
from tests.helpers.stochastic_kernels import philox_matches, rule_mismatches  # noqa: E402
from titan_fp4six.kernels import quantize as kq  # noqa: E402
from titan_fp4six.numerics import reference  # noqa: E402
from titan_fp4six.numerics.spec import NVFP4, NVFP4_STOCHASTIC  # noqa: E402

SEEDS = (0, 1, 42, 2 ** 31 - 1, 2 ** 31 + 5, 2 ** 32 + 1, 2 ** 62 + 12345, 2 ** 63 - 1)
COUNTERS = (0, 1, 2, 15, 16, 255, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 7, 2 ** 40 + 3, 2 ** 62 + 11,
            123456789, 987654321012, 2 ** 63 - 1)
KINDS = ("normal", "ties", "wide", "nan_inf", "saturate", "tiny_amax", "zero_amax", "nan_amax", "inf_amax")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def philox(report):
    counters = torch.tensor(COUNTERS, dtype=torch.int64)
    for seed in SEEDS:
        report(f"philox/seed={seed}", philox_matches(seed, counters, "cpu"))


def quantizer(report):
    gen = torch.Generator().manual_seed(5)
    for index, kind in enumerate(KINDS):
        dtype = DTYPES[index % 3]
        x, amax = _data(kind, 3, 48, 448, gen)
        x = x.to(dtype)
        amax = (x.float().abs().amax() if amax is None else amax).float()
        seed = SEEDS[index % len(SEEDS)]
        decode = index % 2 == 0
        label = f"{kind}/{str(dtype)[6:]}/seed={seed}/decode={decode}"
        want_c, want_s = reference.nvfp4_reference(x, amax, seed)
        c, s, _, dec = kq.quantize(x, amax, NVFP4_STOCHASTIC, decode=decode, seed=seed)
        ok = same_bytes(c, want_c) and same_bytes(s, want_s)
        if decode:
            ok = ok and same_bytes(dec, reference.decode_block_scaled_reference(want_c, want_s))
        report(f"rows/{label}", ok)
        # columnwise: x (M, K) read in place as x^T (K, ceil16(M)), bits by the index in x^T
        xc = x[: 2 + index % 3, :32].contiguous()
        xt = torch.nn.functional.pad(xc, (0, 0, 0, -xc.shape[0] % 16)).t().contiguous()
        want_c, want_s = reference.nvfp4_reference(xt, amax, seed)
        c, s, _, dec = kq.quantize_columnwise(xc, amax, NVFP4_STOCHASTIC, decode, seed=seed)
        ok = same_bytes(c, want_c) and same_bytes(s, want_s)
        if decode:
            ok = ok and same_bytes(dec, reference.decode_block_scaled_reference(want_c, want_s))
        report(f"columns/{label}", ok)
        # nearest: a seed passed with a round-to-nearest spec changes nothing
        c, s, _, _ = kq.quantize(x, amax, NVFP4, seed=seed)
        want_c, want_s = reference.nvfp4_reference(x, amax)
        report(f"nearest/{label}", same_bytes(c, want_c) and same_bytes(s, want_s))


def row_groups(report):
    """Amaxes the quantizer reads per row (the grouped backward's dy: one amax per token group, garbage past
    offs[-1]; one per row; one per run of rows) with stochastic rounding."""
    from tests.helpers.operand_cases import row_groups_cases

    gen = torch.Generator().manual_seed(8)
    for label, x, amax, groups, block in row_groups_cases(gen, "cpu", rows=21, cols=32, dtypes=(torch.bfloat16, )):
        if block != "1x16":
            continue
        seed = 2 ** 33 + 17
        want_c, want_s = reference.nvfp4_reference(x, reference.amax_per_row(amax, x.shape[0], groups), seed)
        c, s, _, dec = kq.quantize(x, amax, NVFP4_STOCHASTIC, decode=True, groups=groups, seed=seed)
        report(f"row_groups/{label}", same_bytes(c, want_c) and same_bytes(s, want_s)
               and same_bytes(dec, reference.decode_block_scaled_reference(want_c, want_s)))


def short_rows(report):
    """Rows of 24 and 48 blocks, which the one-row launch runs as chunks of 8 and 16 blocks over 4 and 2 rows a
    warp (kernels.quantize._row_launch): the bits stay those of each element's own index."""
    for rows, cols in ((5, 384), (9, 768)):
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)).to(torch.bfloat16)
        amax = x.float().abs().amax()
        seed = 2 ** 40 + cols
        want_c, want_s = reference.nvfp4_reference(x, amax, seed)
        c, s, _, dec = kq.quantize(x, amax, NVFP4_STOCHASTIC, decode=True, seed=seed)
        report(f"short rows/{rows}x{cols}", same_bytes(c, want_c) and same_bytes(s, want_s)
               and same_bytes(dec, reference.decode_block_scaled_reference(want_c, want_s)))


def rule(report):
    """The per-element rule at its thresholds (tests/helpers/stochastic_kernels.py)."""
    bad, total = rule_mismatches("cpu")
    report(f"rule/{total} magnitudes and bits ({bad} differ)", bad == 0)


def main():
    configs, mismatches = 0, 0

    def report(label, ok):
        nonlocal configs, mismatches
        configs += 1
        if not ok:
            mismatches += 1
            print(f"MISMATCH {label}", flush=True)

    philox(report)
    rule(report)
    quantizer(report)
    row_groups(report)
    short_rows(report)
    print(f"configs {configs} mismatches {mismatches}")
    raise SystemExit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
