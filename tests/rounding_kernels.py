"""Every FP32 input of the kernels' two one-add roundings, checked against the reference encoders: e2m1_magic
on [0, 6] and e4m3_round on [0, 448]. Shared by the GPU test (every value) and the interpreter run (a stride)."""

import torch
import triton
import triton.language as tl

from titan_fp4six.kernels.bits import e2m1_magic, e4m3_round
from titan_fp4six.numerics.formats import e2m1_encode

_BLOCK = 1024


@triton.jit
def _round_kernel(x_ptr, code_ptr, e4m3_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    a = tl.minimum(x, 6.0)
    code = (a + e2m1_magic(a)).to(tl.int32, bitcast=True) & 7
    tl.store(code_ptr + offs, code, mask=mask)
    tl.store(e4m3_ptr + offs, e4m3_round(tl.minimum(x, 448.0)), mask=mask)


def mismatches(start_bits: int, stop_bits: int, stride: int, device) -> int:
    """Inputs with FP32 bit patterns start..stop (step stride) where a rounding differs from the reference."""
    bits = torch.arange(start_bits, stop_bits, stride, dtype=torch.int32, device=device)
    x = bits.view(torch.float32)
    code = torch.empty_like(bits)
    e4m3 = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), _BLOCK), )](x, code, e4m3, x.numel(), BLOCK=_BLOCK)
    in_e2m1 = x <= 6.0
    bad = (code[in_e2m1] != e2m1_encode(x[in_e2m1]).to(torch.int32)).sum()
    in_e4m3 = x <= 448.0
    expect = x[in_e4m3].to(torch.float8_e4m3fn).float()
    return int(bad + (e4m3[in_e4m3] != expect).sum())


TOP = int(torch.tensor(448.0).view(torch.int32))  # every non-negative FP32 up to 448 (0 to 6 among them)
