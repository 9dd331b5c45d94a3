"""How the kernels are launched: how the quantizer splits a tensor into programs (pure Python: every program
runs whole chunks of its row group, as many as 8 while enough programs remain to fill a GPU), and the direct
launches through the compiled launcher (GPU)."""

import pytest
import torch

pytest.importorskip("triton")


def test_chunks_per_program_divide_the_row_and_fill_the_gpu():
    from titan_fp4six.kernels.quantize import MIN_PROGRAMS, _chunks_per_program

    assert _chunks_per_program(14, 16384, 8) == 7  # 7168 columns, 1x16: 448 blocks, 14 chunks of 32
    assert _chunks_per_program(16, 16384, 8) == 8
    assert _chunks_per_program(10, 8192, 8) == 5
    assert _chunks_per_program(13, 16384, 8) == 1  # a prime count of chunks: one per program, none wasted
    assert _chunks_per_program(8, 2048, 8) == 4  # 2048 * 8 / 8 programs would be too few
    assert _chunks_per_program(8, 16, 8) == 1
    for chunk_cols in range(1, 64):
        for row_groups in (1, 300, 4096, 20000):
            chunks = _chunks_per_program(chunk_cols, row_groups, 8)
            assert 1 <= chunks <= 8 and chunk_cols % chunks == 0
            assert chunks == 1 or row_groups * (chunk_cols // chunks) >= MIN_PROGRAMS


def test_short_rows_fill_the_warp_with_several_rows():
    """A one-row launch whose chunk does not divide a short row's blocks takes halved chunks over more rows (no
    chunk part empty), down to 8 blocks; long rows, rows that no such chunk divides, and tile launches keep
    theirs."""
    from titan_fp4six.kernels.quantize import LAUNCH, _row_launch

    one_row = LAUNCH["1x16", True]
    assert _row_launch(one_row, 448) == one_row  # 7168 columns: 14 whole chunks of 32
    assert _row_launch(one_row, 48)[:2] == (2, 16)  # 768 columns: 3 chunks of 16 blocks in 2 rows
    assert _row_launch(one_row, 24)[:2] == (4, 8)
    assert _row_launch(one_row, 17) == one_row and _row_launch(one_row, 4) == one_row
    assert _row_launch(one_row, 464) == one_row  # 7424 columns: 15 chunks, the last half empty, a small share
    assert _row_launch(LAUNCH["16x16", True], 48) == LAUNCH["16x16", True]
    for launch in LAUNCH.values():
        for nblk in range(1, 300):
            new = _row_launch(launch, nblk)
            assert new.rows * new.blocks == launch.rows * launch.blocks and new[2:] == launch[2:]


def test_generated_key_separates_what_triton_specializes_on():
    """The generated key (pure Python, CPU tensors): equal for arguments Triton compiles alike, different for
    each thing it specializes on, and a tensor subclass keyed like a tensor."""
    from titan_fp4six.kernels.launch import _key_function

    key = _key_function(("constexpr", "int_specialized", "int", "int_specialized"))
    buf = torch.zeros(64)
    base = key(0, (), 4, buf, 7, 3)
    assert key(0, (), 4, torch.zeros(8), 9, 5) == base  # other data, int 7 -> 9 (not specialized), 3 -> 5
    assert key(0, (), 4, torch.nn.Parameter(torch.zeros(8)), 7, 3) == base
    for changed in [key(1, (), 4, buf, 7, 3), key(0, (("num_warps", 2),), 4, buf, 7, 3),
                    key(0, (), 5, buf, 7, 3),  # constexpr value
                    key(0, (), 4, buf.to(torch.bfloat16), 7, 3), key(0, (), 4, buf[1:], 7, 3),  # dtype, alignment
                    key(0, (), 4, buf, 2 ** 31, 3),  # a 64-bit integer
                    key(0, (), 4, buf, 7, 1), key(0, (), 4, buf, 7, 32),  # 1, multiple of 16
                    key(0, (), 4, buf, 7, 3.0), key(0, (), 4, buf, 7, True), key(0, (), 4, buf, 7, None)]:
        assert changed != base
    assert key(0, (), 4, buf, 7, 32) == key(0, (), 4, buf, 7, 48)
    assert key(0, (), 4, buf, 7, 3.0) == key(0, (), 4, buf, 7, 2.5)  # floats: by type only


def test_kernel_arguments_travel_by_name():
    """Every launcher's Args names each kernel parameter in signature order, none defaulted: a missing, misspelt or
    extra argument is a TypeError where it is built, and a launcher refuses anything but its Args (no positional
    tuple whose two arguments of one type could trade places). Pure Python: nothing is launched."""
    import inspect

    from titan_fp4six.kernels import amax, decode, epilogue, quantize
    from titan_fp4six.kernels.launch import FastLaunch

    launchers = [v for m in (amax, decode, epilogue, quantize) for v in vars(m).values() if isinstance(v, FastLaunch)]
    assert len(launchers) == 8
    for launcher in launchers:
        assert launcher.Args._fields == tuple(inspect.signature(launcher.fn.fn).parameters)
        assert launcher.Args._field_defaults == {}
    q = quantize._QUANTIZE
    assert len(q.Args._fields) == 37 and q.Args._fields[:2] == ("x_ptr", "amax_ptr")
    full = dict.fromkeys(q.Args._fields, 0)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'TOKEN_BLOCKS'"):
        q.Args(**{k: v for k, v in full.items() if k != "TOKEN_BLOCKS"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        q.Args(x=0, **full)
    with pytest.raises(TypeError, match=r"_quantize_kernel takes its arguments as quantize_kernel_args\(name=value"):
        q((1, ), tuple(full.values()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_launch_keys_every_specialization_and_matches_triton_cuda():
    """FastLaunch's direct launches give what Triton's own launch gives, across the arguments Triton specializes
    on: dtype, 16-byte alignment (a view one element in), integers 1, multiples of 16 and others, constexprs."""
    import triton
    import triton.language as tl

    from titan_fp4six.kernels.launch import FastLaunch

    @triton.jit
    def _axpb(x_ptr, out_ptr, n, b, SCALE: tl.constexpr):
        offs = tl.program_id(0) * 128 + tl.arange(0, 128)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(out_ptr + offs, x * SCALE + b, mask=offs < n)

    launch = FastLaunch(_axpb)
    base = torch.arange(1, 302, device="cuda", dtype=torch.float32)
    cases = [(base[:n].to(dtype), n, b, scale) for dtype in (torch.float32, torch.bfloat16) for n in (1, 16, 300)
             for b in (1, 5) for scale in (2.0, 3.0)]
    cases += [(base[1:1 + n], n, 5, 2.0) for n in (16, 300)]  # unaligned views
    for _ in range(2):  # the second round runs every case through the compiled launcher
        for x, n, b, scale in cases:
            out, want = torch.full_like(x, -1.0), torch.full_like(x, -1.0)
            launch((triton.cdiv(n, 128), ), launch.Args(x_ptr=x, out_ptr=out, n=n, b=b, SCALE=scale))
            _axpb[(triton.cdiv(n, 128), )](x, want, n, b, scale)
            assert torch.equal(out, want), (x.dtype, n, b, scale, x.data_ptr() % 16)
            assert torch.allclose(out.float(), x.float() * scale + b, rtol=1e-2), (x.dtype, n, b, scale)
    assert len(launch._compiled) > 8 if launch._direct else not launch._compiled  # specializations kept apart
