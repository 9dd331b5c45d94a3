"""The operand kernels' generated code, compiled ahead of time for Hopper (sm_90) on the CPU: they compile (the
GPU-only branches included), contract no a*b + c into an FMA (the only FMAs are the quantizer's explicit ones,
as in test_kernels_codegen.py), divide with div.rn only and are FP32 throughout; the row-streaming kernels
(epilogue, row amax) move 16 bytes per access when the launch's sizes are multiples of 16."""

import re

import pytest

triton = pytest.importorskip("triton")

from tests.helpers.codegen import FOUR_SIX_FMAS  # noqa: E402


def _compile(fn, signature, constexprs, num_warps=1, divisible=()) -> str:
    """PTX of fn; `divisible` names the arguments Triton may assume multiples of 16 (as its launcher specializes
    them, and pointers 16-byte aligned)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{k: "constexpr" for k in constexprs}}
    names = list(signature)
    attrs = {(names.index(a), ): [["tt.divisibility", 16]] for a in divisible}
    try:
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"enable_fp_fusion": False, "num_warps": num_warps})
    except Exception as exc:  # no NVIDIA backend / ptxas in this Triton build
        if "CompilationError" in type(exc).__name__:
            raise
        pytest.skip(f"cannot compile for sm_90 here: {exc}")
    return compiled.asm["ptx"]


def _quantizer_ptx(kind: int, four_six: bool, transposed: bool, stochastic: bool = False, vec: bool = True,
                   seed: str = "i64", token_blocks: bool = False) -> str:
    """PTX of the quantizer as the launcher compiles it for a 16-byte aligned x (vec: the vector loads it then
    takes, kernels.quantize._vector_loads; seed: "i32" as Triton types a seed below 2^31, "i64" above)."""
    from titan_fp4six.kernels.quantize import COLUMN_LAUNCH, LAUNCH, _quantize_kernel

    launch = (COLUMN_LAUNCH if transposed else LAUNCH)["1x16" if four_six else "nvfp4", True]
    signature = {"x_ptr": ("*fp32", "*bf16", "*fp16")[kind], "amax_ptr": "*fp32", "group_ptr": "*fp32",
                 "blocks_ptr": "*i32", "codes_ptr": "*u8", "scales_ptr": "*u8", "map4_ptr": "*i1", "dec_ptr": "*bf16",
                 "R": "i32", "NBLK": "i32", "row_words": "i32", "amax_div": "i32", "n_groups": "i32",
                 "amax_cols": "i32", "CHUNKS": "i32", "M": "i32", "seed": seed}
    constexprs = dict(KIND=kind, FOUR_SIX=four_six, TILE16=False, MSE=True, SIX_B=1536.0, R6B=1.0 / 1536.0,
                      WRITE_DEC=True, VEC=vec, PTX=True, SCALAR_AMAX=False, BR=launch.rows,
                      NB=launch.blocks, TRANSPOSED=transposed, MAP6_ONLY=False, CHECK_AMAX=False, GROUPS=False,
                      BY_GROUP=False, MAP4=int(four_six), STOCHASTIC=stochastic, TOKEN_BLOCKS=token_blocks)
    return _compile(_quantize_kernel, signature, constexprs, launch.warps,
                    divisible=("x_ptr", "codes_ptr", "scales_ptr", "map4_ptr", "dec_ptr"))


def _fmas(ptx: str) -> int:
    return len(re.findall(r"\bfma\.rn\.f32\b", ptx))


def _check_rounding(ptx: str) -> None:
    assert not re.search(r"\bdiv\.(full|approx)\.f32\b", ptx)
    assert not re.search(r"\.f64\b", ptx)


@pytest.mark.parametrize("token_blocks", (False, True))
def test_columnwise_four_over_six_with_decode(token_blocks):
    """Same explicit FMAs as the row-major 1x16 kernel (tests/helpers/codegen.py); read by token
    blocks (step 1 per block) too."""
    ptx = _quantizer_ptx(1, True, True, token_blocks=token_blocks)
    assert _fmas(ptx) == FOUR_SIX_FMAS
    assert re.search(r"\bdiv\.rn\.f32\b", ptx)
    _check_rounding(ptx)


@pytest.mark.parametrize("kind, transposed, token_blocks", ((1, False, False), (0, True, False), (1, True, True)))
def test_nvfp4_with_decode(kind, transposed, token_blocks):
    ptx = _quantizer_ptx(kind, False, transposed, token_blocks=token_blocks)
    assert _fmas(ptx) == 0
    _check_rounding(ptx)


@pytest.mark.parametrize("kind, transposed, seed, token_blocks", ((1, False, "i64", False), (0, False, "i32", False),
                                                                 (2, True, "i64", False), (1, True, "i32", False),
                                                                 (1, True, "i64", True)))
def test_nvfp4_stochastic_with_decode(kind, transposed, seed, token_blocks):
    """Stochastic rounding adds no FMA.rn but the Newton inverse scale's (below) and no FP64 to the NVFP4 kernel,
    and keeps subnormals (no .ftz instruction but that reciprocal's seed: tl.math.ceil's cvt.rpi.ftz would flush a
    subnormal t to 0). Its integer work sits on the FMA pipe (kernels/encode.py, kernels/philox.py): per block
    three fma.rp ceilings per element, two Philox evaluations of 10 mul.wide by A and 9 by B (the first round's c2
    is 0; the two counters differ in their low word only, so round 2's A products are one), per element one mad.lo
    (c - r) and one mul.hi (the rule's shift; a mad.hi for the first of each packed word, which takes the word's
    code biases off), per random word one mul.hi (its upper half) and one mad.lo (its lower half), one mad.lo per
    packed code but the first of each word. The code holds all of it twice: in the chunk loop and in the rewrite
    of a program's chunks that meet a NaN |q| (with their NaN codes), which the loop only notes. The loop's
    inverse scale is newton_inverse_scale's (one rcp.approx and its four FMAs, no division); the rewrite, which
    also takes the rows whose S_dec is outside that function's range, divides. Read by token blocks the same."""
    ptx = _quantizer_ptx(kind, False, transposed, stochastic=True, seed=seed, token_blocks=token_blocks)
    copies = 2
    assert _fmas(ptx) == 4 and len(re.findall(r"\brcp\.approx\.ftz\.f32\b", ptx)) == 1
    assert re.search(r"\bdiv\.rn\.f32\b", ptx)
    assert len(re.findall(r"\bfma\.rp\.f32\b", ptx)) == copies * 3 * 16
    assert len(re.findall(r"\bmul\.wide\.u32\b[^;]*0xd2511f53", ptx)) == copies * (2 * 10 - 1)  # round 2's shared
    assert len(re.findall(r"\bmul\.wide\.u32\b[^;]*0xcd9e8d57", ptx)) == copies * 2 * 9
    assert len(re.findall(r"\bmul\.hi\.u32\b", ptx)) == copies * (16 - 2 + 8)
    assert len(re.findall(r"\bmad\.hi\.u32\b", ptx)) == copies * 2
    assert len(re.findall(r"\bmad\.lo\.u32\b", ptx)) == copies * (16 + 8 + 2 * 7)
    assert ptx.count(".ftz") == 1 and not re.search(r"\bcvt\.rpi\b", ptx)  # the rcp.approx only
    _check_rounding(ptx)


def test_decode_kernel():
    from titan_fp4six.kernels import decode as kd

    signature = {"codes_ptr": "*u8", "scales_ptr": "*u8", "amax_ptr": "*fp32", "group_ptr": "*i64",
                 "out_ptr": "*bf16", "R": "i32", "NBLK": "i32", "amax_div": "i32", "n_groups": "i32"}
    constexprs = dict(GLOBAL=True, GROUPS=True, BY_GROUP=True, R6B=1.0 / 1536.0, OUT=0, BR=kd.BLOCK_ROWS,
                      NB=kd.BLOCK_BLOCKS)
    ptx = _compile(kd._decode_kernel, signature, constexprs, kd.WARPS)
    assert _fmas(ptx) == 0 and not re.search(r"\bdiv\.", ptx)
    _check_rounding(ptx)


def _accesses(ptx: str, op: str) -> dict:
    return {width: len(re.findall(rf"\b{op}\.global{width}\.", ptx)) for width in (".v4", ".v2", "")}


def test_epilogue_vectorizes_rows():
    """N must stay specialized: Triton then knows rows start 16-element aligned and moves 8 bf16 per access;
    unspecialized (N of unknown divisibility) every element is its own 2-byte load and store."""
    from titan_fp4six.kernels import epilogue as ke

    assert {p.name for p in ke._scale_cast_kernel.params if p.do_not_specialize} == {"M", "experts"}
    signature = {"acc_ptr": "*bf16", "a_amax_ptr": "*fp32", "b_amax_ptr": "*fp32", "group_ptr": "*i64",
                 "out_ptr": "*bf16", "M": "i32", "N": "i32", "experts": "i32"}
    constexprs = dict(A_MODE=ke.A_ROW, GROUPED=True, A_R6B=1.0 / 1536.0, B_R6B=1.0 / 1536.0, OUT=0,
                      BM=ke.BLOCK_ROWS, BN=ke.BLOCK_COLS)
    pointers = ("acc_ptr", "a_amax_ptr", "b_amax_ptr", "group_ptr", "out_ptr")
    fast = _compile(ke._scale_cast_kernel, signature, constexprs, ke.WARPS, divisible=pointers + ("N", ))
    slow = _compile(ke._scale_cast_kernel, signature, constexprs, ke.WARPS, divisible=pointers)
    assert _accesses(fast, "ld")[".v4"] > 0 and _accesses(fast, "st")[".v4"] > 0
    assert _accesses(slow, "ld")[".v4"] == 0  # what specializing N buys
    _check_rounding(fast)


def test_row_amax_vectorizes_rows():
    """The row kernel compiles for sm_90 and reads rows 16 bytes at a time."""
    from titan_fp4six.kernels import amax as ka

    assert {p.name for p in ka._row_amax_kernel.params if p.do_not_specialize} == {"R"}
    signature = {"x_ptr": "*bf16", "out_ptr": "*i32", "R": "i32", "C": "i32", "stride": "i32"}
    constexprs = dict(BR=ka.ROW_BLOCK_ROWS, BC=ka.ROW_BLOCK_COLS)
    ptx = _compile(ka._row_amax_kernel, signature, constexprs, 4, divisible=("x_ptr", "out_ptr", "C", "stride"))
    assert _accesses(ptx, "ld")[".v4"] > 0


@pytest.mark.parametrize("per_row", [False, True])
def test_token_groups_vectorizes_rows(per_row):
    """The grouped GEMM's token-group kernel reads rows 16 bytes at a time like the row kernel; per group it
    reduces with atomics, per row it stores."""
    from titan_fp4six.kernels import amax as ka

    assert {p.name for p in ka._token_groups_kernel.params if p.do_not_specialize} == {"R", "E"}
    signature = {"x_ptr": "*bf16", "offs_ptr": "*i32", "group_ptr": "*i64", "empty_ptr": "*i1", "out_ptr": "*i32",
                 "R": "i32", "C": "i32", "stride": "i32", "E": "i32"}
    constexprs = dict(BR=ka.ROW_BLOCK_ROWS, BC=ka.ROW_BLOCK_COLS, EP=8, PER_ROW=per_row)
    ptx = _compile(ka._token_groups_kernel, signature, constexprs, 4, divisible=("x_ptr", "C", "stride"))
    assert _accesses(ptx, "ld")[".v4"] > 0
    assert bool(re.search(r"\b(atom|red)\.", ptx)) != per_row


@pytest.mark.parametrize("kind, four_six, stochastic", ((1, True, False), (1, False, True), (0, False, False)))
def test_columnwise_reads_its_tile_16_bytes_per_access(kind, four_six, stochastic):
    """The columnwise kernel reads a chunk's tile of 16 rows x 8 columns (fp32: 4) per thread as 16-byte loads of
    consecutive columns: its 2 x 16 element loads per block (the first chunk's and the loop's) are gone; only the
    exact paths' scattered element loads stay. Without the alignment hints Triton reads one element at a time."""
    hinted = _accesses(_quantizer_ptx(kind, four_six, True, stochastic, vec=True), "ld")
    unhinted = _accesses(_quantizer_ptx(kind, four_six, True, stochastic, vec=False), "ld")

    def scalar(loads):
        return loads[""] - loads[".v4"] - loads[".v2"]

    assert hinted[".v4"] >= 4 and scalar(hinted) <= scalar(unhinted) - 32


def test_columnwise_vector_loads_only_where_aligned():
    """The launcher promises the hints' alignment only where it holds: x 16-byte aligned, its row stride and
    column count multiples of 8 bf16 (4 fp32) elements, and whole runs of columns per program."""
    torch = pytest.importorskip("torch")
    from titan_fp4six.kernels.quantize import COLUMN_LAUNCH, Launch, _vector_loads

    def vec(x, launch=COLUMN_LAUNCH["1x16", False]):
        return _vector_loads(x, True, 0, launch)

    assert vec(torch.zeros(40, 64, dtype=torch.bfloat16))
    assert vec(torch.zeros(40, 60, dtype=torch.float32))
    assert not vec(torch.zeros(40, 64, dtype=torch.bfloat16)[:, :60])  # 60 columns: a run of 8 crosses x's edge
    assert not vec(torch.zeros(40, 65, dtype=torch.bfloat16)[:, :64])  # row stride 65
    assert not vec(torch.zeros(40 * 64 + 1, dtype=torch.bfloat16)[1:].view(40, 64))  # 2 bytes off alignment
    assert not vec(torch.zeros(40, 64, dtype=torch.bfloat16), Launch(4, 8, 8, 1))  # 4 columns per program
    assert all(vec(torch.zeros(40, 64, dtype=torch.bfloat16), launch) for launch in COLUMN_LAUNCH.values())


def test_atomics_are_relaxed_reductions():
    """The amax kernels' and the RHT's atomic maxima are relaxed reductions, `red` with no result, as the
    quantizer's map-to-4 count is (test_kernels_codegen.py): Triton's default acq_rel atomic holds each program
    until its own stores are visible."""
    from titan_fp4six.kernels import amax as ka
    from titan_fp4six.kernels import hadamard as kh

    ptxs = {
        "tensor amax": _compile(ka._tensor_amax_kernel, {"x_ptr": "*bf16", "y_ptr": "*bf16", "out_ptr": "*i32",
                                                         "n": "i32", "m": "i32", "x_programs": "i32"},
                                dict(BLOCK=ka.TENSOR_BLOCK), 4),
        "token groups": _compile(ka._token_groups_kernel, {"x_ptr": "*bf16", "offs_ptr": "*i32", "group_ptr": "*i64",
                                                           "empty_ptr": "*i1", "out_ptr": "*i32", "R": "i32",
                                                           "C": "i32", "stride": "i32", "E": "i32"},
                                 dict(BR=ka.ROW_BLOCK_ROWS, BC=ka.ROW_BLOCK_COLS, EP=8, PER_ROW=False), 4),
        "RHT amax": _compile(kh._rht16_columns_kernel, {"x_ptr": "*i16", "blocks_ptr": "*i32", "out_ptr": "*i16",
                                                        "amax_ptr": "*i32", "M": "i32", "K": "i32", "stride": "i32",
                                                        "NBLK": "i32", "E": "i32"},
                             dict(KIND=1, NEG=kh._NEG_MASK, BK=kh.BLOCK_K, TOKEN_BLOCKS=True, AMAX=True), 4),
    }
    for name, ptx in ptxs.items():
        ops = re.findall(r"\b(?:atom|red)\.[\w.]+", ptx)
        assert ops and all(op.startswith("red.") and ".relaxed." in op for op in ops), (name, sorted(set(ops)))
