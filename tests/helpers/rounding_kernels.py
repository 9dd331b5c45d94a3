"""Every FP32 input of the kernels' scalar shortcuts, checked against the reference: e2m1_magic on [0, 7) (the
fast path rounds values up to 7 without clamping them to 6), e4m3_round and e4m3_byte on [0, 448], div6 on
every finite non-negative FP32, and (GPU only) the Newton inverse scale on its range. Shared by the GPU test
(every value) and the interpreter run (a stride, plus one whole binade for div6, whose result scales with the
input)."""

import torch
import triton
import triton.language as tl

from titan_fp4six.kernels.bits import div6, e2m1_magic, e4m3_byte, e4m3_round
from titan_fp4six.kernels.encode import newton_inverse_scale
from titan_fp4six.numerics.formats import e2m1_encode

_BLOCK = {"cuda": 1024, "cpu": 1 << 16}  # the interpreter's cost is per program
DIV6_EXACT_FROM = 2.0 ** -124  # below, div6 only promises a result below this too
TOP = int(torch.tensor(448.0).view(torch.int32))  # every non-negative FP32 up to 448 (0 to 6 among them)
FINITE = int(torch.tensor(float("inf")).view(torch.int32))  # bit patterns below this: every finite x >= 0


@triton.jit
def _round_kernel(x_ptr, code_ptr, e4m3_ptr, byte_ptr, div6_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    a = tl.where(x < 7.0, x, 6.0)
    code = (a + e2m1_magic(a)).to(tl.int32, bitcast=True) & 7
    tl.store(code_ptr + offs, code, mask=mask)
    s = e4m3_round(tl.minimum(x, 448.0))
    tl.store(e4m3_ptr + offs, s, mask=mask)
    tl.store(byte_ptr + offs, e4m3_byte(s), mask=mask)
    tl.store(div6_ptr + offs, div6(x), mask=mask)


def mismatches(start_bits: int, stop_bits: int, stride: int, device) -> int:
    """Inputs with FP32 bit patterns start..stop (step stride, within [0, FINITE)) where a shortcut differs
    from the reference."""
    bits = torch.arange(start_bits, stop_bits, stride, dtype=torch.int32, device=device)
    x = bits.view(torch.float32)
    code, byte = torch.empty_like(bits), torch.empty_like(bits)
    e4m3, quotient = torch.empty_like(x), torch.empty_like(x)
    block = _BLOCK[torch.device(device).type]
    _round_kernel[(triton.cdiv(x.numel(), block), )](x, code, e4m3, byte, quotient, x.numel(), BLOCK=block)
    in_e2m1 = x < 7.0
    bad = (code[in_e2m1] != e2m1_encode(x[in_e2m1].clamp(max=6.0)).to(torch.int32)).sum()
    in_e4m3 = x <= 448.0
    expect = x[in_e4m3].to(torch.float8_e4m3fn)
    bad += (e4m3[in_e4m3] != expect.float()).sum() + (byte[in_e4m3] != expect.view(torch.uint8).int()).sum()
    exact = x >= DIV6_EXACT_FROM
    six = torch.full_like(x, 6.0)  # a tensor divisor: PyTorch's CUDA division by a scalar multiplies by 1/6
    bad += (quotient[exact] != x[exact] / six[exact]).sum() + (quotient[~exact] >= DIV6_EXACT_FROM).sum()
    return int(bad)


@triton.jit
def _inverse_kernel(b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, newton_inverse_scale(tl.load(b_ptr + offs, mask=mask, other=1.0), 1.0, -1.0),
             mask=mask)


def newton_inverse_mismatches(start_bits: int, stop_bits: int) -> int:
    """b with FP32 bit patterns start..stop where newton_inverse_scale(b) != min(1 / b, FLT_MAX) (GPU only:
    inline PTX)."""
    b = torch.arange(start_bits, stop_bits, dtype=torch.int32, device="cuda").view(torch.float32)
    out = torch.empty_like(b)
    _inverse_kernel[(triton.cdiv(b.numel(), _BLOCK["cuda"]), )](b, out, b.numel(), BLOCK=_BLOCK["cuda"])
    expect = torch.div(torch.ones_like(b), b).clamp(max=torch.finfo(torch.float32).max)
    return int((out.view(torch.int32) != expect.view(torch.int32)).sum())
