"""The quantizer kernel's generated code pins the rounding of docs/numerics.md: compiled ahead of time for Hopper (sm_90)
on the CPU, its PTX never contracts a*b + c into an FMA (enable_fp_fusion=False; the only FMAs are the explicit
ones of the four-over-six error estimate and its bounds, and of the division-free roundings div6 and
newton_inverse_scale, each proven or checked on every input) and every FP32 division is the correctly
rounded div.rn, never Triton's default approximate division; and it is FP32 throughout (an FP32 subnormal
constant once made Triton 3.6 compute the error bounds in FP64, with slow conversions)."""

import re

import pytest

triton = pytest.importorskip("triton")

from tests.helpers.codegen import FOUR_SIX_FMAS  # noqa: E402


def _ptx(enable_fp_fusion: bool, four_six: bool, check_amax: bool = False, debug: bool = False, map4: int = 1,
         groups: bool = False) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from titan_fp4six.kernels.quantize import CHECK_OPTIONS, _quantize_kernel

    pointers = {"x_ptr": "*bf16", "amax_ptr": "*fp32", "group_ptr": "*i64", "blocks_ptr": "*i32", "codes_ptr": "*u8",
                "scales_ptr": "*u8", "map4_ptr": "*i64" if map4 == 2 else "*i1", "dec_ptr": "*bf16"}  # as the launcher passes them
    constexprs = dict(KIND=1, FOUR_SIX=four_six, TILE16=False, MSE=True, SIX_B=1536.0, R6B=1.0 / 1536.0,
                      WRITE_DEC=four_six, VEC=True, PTX=True, SCALAR_AMAX=False, BR=1, NB=32, TRANSPOSED=False,
                      MAP6_ONLY=False, CHECK_AMAX=check_amax, GROUPS=groups, BY_GROUP=groups,
                      MAP4=map4 if four_six else 0, STOCHASTIC=False, TOKEN_BLOCKS=False)
    scalars = {"R": "i32", "NBLK": "i32", "row_words": "i32", "amax_div": "i32", "n_groups": "i32", "amax_cols": "i32",
               "CHUNKS": "i32", "M": "i32", "seed": "i64"}
    signature = {**pointers, **scalars, **{k: "constexpr" for k in constexprs}}
    src = ASTSource(fn=_quantize_kernel, signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"enable_fp_fusion": enable_fp_fusion, "num_warps": 1,
                                           **(CHECK_OPTIONS if debug else {})})
    except Exception as exc:  # no NVIDIA backend / ptxas in this Triton build
        pytest.skip(f"cannot compile for sm_90 here: {exc}")
    return compiled.asm["ptx"]


def _fmas(ptx: str) -> int:
    return len(re.findall(r"\bfma\.rn\.f32\b", ptx))


def test_correctly_rounded_division_and_no_approximate_one():
    ptx = _ptx(enable_fp_fusion=False, four_six=True)
    assert len(re.findall(r"\bdiv\.rn\.f32\b", ptx)) > 0
    assert not re.search(r"\bdiv\.(full|approx)\.f32\b", ptx)


def test_no_contracted_fma():
    """The only FMAs are the explicit ones (FOUR_SIX_FMAS); NVFP4 has none. Allowing contraction (the control)
    adds more, from the exact path's err + d * d."""
    assert _fmas(_ptx(enable_fp_fusion=False, four_six=True)) == FOUR_SIX_FMAS
    assert _fmas(_ptx(enable_fp_fusion=False, four_six=False)) == 0
    assert _fmas(_ptx(enable_fp_fusion=True, four_six=True)) > FOUR_SIX_FMAS


def test_fp32_only():
    """No FP64 arithmetic or conversions: every constant the kernel combines with FP32 values stays FP32."""
    for four_six in (True, False):
        assert not re.search(r"\.f64\b", _ptx(enable_fp_fusion=False, four_six=four_six))


@pytest.mark.parametrize("four_six", [True, False])
def test_amax_check_adds_only_its_asserts(four_six):
    """The public quantizers' variant (CHECK_AMAX, compiled with debug on) calls the device assert and keeps the
    same explicit FMAs; debug on without the check compiles no assert at all (no integer overflow checks)."""
    explicit = _fmas(_ptx(enable_fp_fusion=False, four_six=four_six))
    checked = _ptx(enable_fp_fusion=False, four_six=four_six, check_amax=True, debug=True)
    assert "__assertfail" in checked and _fmas(checked) == explicit
    assert "__assertfail" not in _ptx(enable_fp_fusion=False, four_six=four_six, debug=True)


def test_map4_counting_adds_only_its_atomics():
    """The ops' variant counts map-to-4 blocks per token group (MAP4=2, GROUPS) with two relaxed 64-bit reductions
    per program (an acq_rel atomic, Triton's default, would hold each program until its stores are visible) and
    the same explicit FMAs; the mask-writing variant has no atomics."""
    explicit = _fmas(_ptx(enable_fp_fusion=False, four_six=True))
    counting = _ptx(enable_fp_fusion=False, four_six=True, map4=2, groups=True)
    assert re.findall(r"\b(?:atom|red)\.[\w.]+", counting) == ["red.global.gpu.relaxed.add.u64"] * 2
    assert _fmas(counting) == explicit
    assert not re.search(r"\b(atom|red)\.", _ptx(enable_fp_fusion=False, four_six=True))
