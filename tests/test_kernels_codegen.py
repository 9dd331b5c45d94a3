"""The quantizer kernel's generated code pins the spec's rounding: compiled ahead of time for Hopper (sm_90)
on the CPU, its PTX has no FMA (enable_fp_fusion=False is what prevents one) and every FP32 division is
the correctly rounded div.rn, never Triton's default approximate division."""

import re

import pytest

triton = pytest.importorskip("triton")


def _ptx(enable_fp_fusion: bool) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from titan_fp4six.kernels.quantize import _quantize_kernel

    pointers = {"x_ptr": "*i32", "amax_ptr": "*fp32", "codes_ptr": "*i32", "scales_ptr": "*u8", "map4_ptr": "*u8",
                "dec_ptr": "*i32"}
    constexprs = dict(KIND=1, FOUR_SIX=True, TILE16=False, MSE=True, SIX_B=1536.0, WRITE_DEC=True, BR=16, NB=8)
    scalars = {"R": "i32", "NBLK": "i32", "row_words": "i32", "amax_stride": "i32"}
    signature = {**pointers, **scalars, **{k: "constexpr" for k in constexprs}}
    src = ASTSource(fn=_quantize_kernel, signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"enable_fp_fusion": enable_fp_fusion, "num_warps": 4})
    except Exception as exc:  # no NVIDIA backend / ptxas in this Triton build
        pytest.skip(f"cannot compile for sm_90 here: {exc}")
    return compiled.asm["ptx"]


def test_no_fma_and_correctly_rounded_division():
    ptx = _ptx(enable_fp_fusion=False)
    assert len(re.findall(r"\bdiv\.rn\.f32\b", ptx)) > 0
    assert not re.search(r"\bfma\.rn\.f32\b", ptx)
    assert not re.search(r"\bdiv\.(full|approx)\.f32\b", ptx)


def test_fusion_flag_is_what_keeps_fma_out():
    """Control: with contraction allowed, the MSE sum err + d*d becomes an FMA (so the check above can fail)."""
    assert re.search(r"\bfma\.rn\.f32\b", _ptx(enable_fp_fusion=True))
