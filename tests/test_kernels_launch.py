"""How the quantizer kernels split a tensor into programs (pure Python, no GPU): every program runs whole
chunks of its row group, as many as 8 while enough programs remain to fill a GPU."""

import pytest

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
