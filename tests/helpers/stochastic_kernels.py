"""The stochastic rounding's device pieces against the reference, shared by the interpreter run
(interp_stochastic.py) and the GPU tests: the kernels' Philox (tl.randint4x, or on a GPU its mul.wide rounds)
against numerics.philox.philox4x32 (all four words), and the kernels' E2M1 rule (kernels/encode.stochastic_e2m1) against
numerics.formats.e2m1_encode_stochastic at its thresholds: in every code interval, magnitudes whose t is an exact
integer k or k + 1/2 (up to 2^16 - 1/2) meet the 16-bit values k - 1, k, k + 1, plus the grid points, 6, and
random magnitudes with random bits. A wrong factor, offset or comparison flips decisions here that random bits
would reach once in 2^16."""

import torch
import triton
import triton.language as tl

from titan_fp4six.kernels.encode import stochastic_e2m1
from titan_fp4six.kernels.philox import randint4x
from titan_fp4six.numerics.formats import e2m1_encode_stochastic
from titan_fp4six.numerics.philox import philox4x32

INTERVALS = ((0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 6.0))


@triton.jit(do_not_specialize=["seed"])  # a seed of 1 stays an argument, as in the quantizer
def _randint4x_kernel(out_ptr, counters_ptr, seed, N: tl.constexpr, PTX: tl.constexpr):
    i = tl.arange(0, N)
    words = randint4x(seed, tl.load(counters_ptr + i), PTX)
    for w in tl.static_range(4):
        tl.store(out_ptr + 4 * i + w, words[w].to(tl.int64) & 0xFFFFFFFF)


def philox_matches(seed: int, counters: torch.Tensor, device, ptx: bool = False) -> bool:
    """kernels.philox.randint4x(seed, counters) run on `device` (ptx: the GPU's mul.wide rounds, else
    tl.randint4x) == philox4x32(seed, counters) on the CPU, all four words (counters: int64, a power-of-two
    count)."""
    got = torch.zeros(counters.numel(), 4, dtype=torch.int64, device=device)
    _randint4x_kernel[(1, )](got, counters.to(device), seed, counters.numel(), PTX=ptx)
    return torch.equal(got.cpu(), philox4x32(seed, counters.cpu()))


@triton.jit
def _rule_kernel(a_ptr, r_ptr, out_ptr, n, BLOCK: tl.constexpr, PTX: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out = stochastic_e2m1(tl.load(a_ptr + offs, mask=mask, other=0.0), tl.load(r_ptr + offs, mask=mask, other=0),
                          PTX)
    tl.store(out_ptr + offs, out, mask=mask)


def cases(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(magnitudes FP32, 16-bit values int32) of the checks above."""
    ks = torch.cat([torch.arange(0, 64), torch.arange(2 ** 15 - 8, 2 ** 15 + 8), torch.arange(2 ** 16 - 64, 2 ** 16),
                    torch.randint(0, 2 ** 16, (512, ), generator=gen)]).double()
    a, r = [], []
    for lo, hi in INTERVALS:
        for half in (0.0, 0.5):
            t = ks + half
            t = t[t < 2 ** 16]
            mag = (lo + t * (hi - lo) / 2 ** 16).float()  # exact: t has at most 17 significant bits
            for dr in (-1, 0, 1):
                a.append(mag)
                r.append((torch.ceil(t) + dr).clamp(0, 2 ** 16 - 1))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    # tiny magnitudes, whose a 2^17 is subnormal: t > 0, so the bits 0 round them up (a flushing ceiling would not)
    tiny = torch.tensor([2.0 ** -149, 2.0 ** -145, 2.0 ** -144, 2.0 ** -143, 2.0 ** -140, 2.0 ** -130])
    a += [grid.repeat(3), tiny.repeat(2), torch.rand(4096, generator=gen) * 6]
    r += [torch.tensor([0.0, 2 ** 15, 2 ** 16 - 1]).repeat_interleave(len(grid)).double(),
          torch.tensor([0.0, 1.0]).repeat_interleave(len(tiny)).double(),
          torch.randint(0, 2 ** 16, (4096, ), generator=gen).double()]
    return torch.cat(a).float(), torch.cat(r).to(torch.int32)


def rule_mismatches(device) -> tuple[int, int]:
    """(mismatching cases, cases) of the kernel rule against the reference on `device`."""
    a, r = cases(torch.Generator().manual_seed(12))
    want = e2m1_encode_stochastic(a, r.long()).to(torch.int32) & 7
    a, r = a.to(device), r.to(device)
    got = torch.empty_like(r)
    block = 1024 if a.is_cuda else 1 << 16
    _rule_kernel[(triton.cdiv(a.numel(), block), )](a, r, got, a.numel(), BLOCK=block, PTX=a.is_cuda)
    return int((got.cpu() != want).sum()), a.numel()
