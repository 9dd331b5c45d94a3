"""A plain Triton bf16 GEMM, FP32 accumulation and output, no decode: where any Triton GEMM of the emulation
(one decoding FP4 operands in its prologue, say) starts from against cuBLAS on this GPU. Used by
`python -m scripts.bench kernels --only prologue`; shapes must be multiples of the tile (no masks)."""

import torch
import triton
import triton.language as tl

# (BM, BN, BK, GROUP_M, warps, stages): the usual Hopper tilings of a bf16 GEMM
CONFIGS = ((128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3),
           (128, 256, 64, 8, 4, 4), (64, 256, 64, 8, 4, 4))


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr):
    """c (M, N) = a (M, K) @ b (N, K)^T, tiles taken GROUP_M tile rows at a time (L2 reuse of b)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % size_m
    pn = (pid % per_group) // size_m
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    b = b_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BK
        b += BK
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc)


def plain_mm(a: torch.Tensor, w: torch.Tensor, bm, bn, bk, group_m, warps, stages) -> torch.Tensor:
    """a (M, K) @ w (N, K)^T in FP32, both bf16 contiguous CUDA tensors."""
    (m, k), n = a.shape, w.shape[0]
    c = torch.empty(m, n, dtype=torch.float32, device=a.device)
    _mm_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn), )](a, w, c, m, n, k, bm, bn, bk, group_m, num_warps=warps,
                                                            num_stages=stages)
    return c
