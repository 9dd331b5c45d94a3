"""Batch-invariant ("consistent") kernels: every output row is computed by the same arithmetic, in the same
order, whatever else is in the batch, how the batch is padded and how many key slots the attention sees.

Why: the generator decodes one token over a KV cache in batches of any composition, the trainer scores whole
sequences; with these ops both sides produce bit-identical logprobs (row-scaled 4/6 quantization is per row
already). The rules, each provable from IEEE-754 semantics:
- only correctly rounded elementwise ops (+ - * / sqrt, exact max/round/frexp/bit casts); exp and log are
  built from them (the library exp/log may differ between a SIMD body and a scalar tail on the CPU, so an
  element's result could depend on its position);
- sums over a fixed-size axis (hidden, head dim, vocabulary, experts) use a fixed pairwise tree over the axis
  zero-padded to a power of two; sums over attention key slots run left to right, masked slots add exact
  zeros, so extra (padded or cache) slots change nothing;
- GEMMs: on the CPU, exact products and the same tree over K (provable); on CUDA, every product is a
  torch.mm (dense) or torch.bmm (grouped experts) of one fixed shape (rows padded to ROWS, chunks to
  CHUNKS, fresh buffers), so the library picks one kernel and each row's K-order depends on nothing else
  in the batch (checked by the mismatch the H200 run logs, not provable like the CPU path).
Everything computes in FP32. The GEMM's backward is a plain FP32 GEMM (training needs no invariance there).
"""

import math

import torch
from torch import Tensor

ROWS = 128
"""CUDA GEMM chunk: every invariant GEMM call multiplies exactly this many rows."""
_CPU_CHUNK = 1 << 22
"""CPU GEMM: at most this many products materialized at once (rows are independent, so chunking is free)."""

_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # Cody-Waite split: n * _LN2_HI is exact for |n| < 2^11
_LN2 = math.log(2.0)


def tree_sum(x: Tensor, dim: int = -1) -> Tensor:
    """Sum over `dim` by halving a power-of-two zero-padded copy (trailing zeros never change the result)."""
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _pow2(n: Tensor) -> Tensor:
    """2.0 ** n (FP32) for integer-valued n in [-126, 127], built from its exponent bits."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def exp(x: Tensor) -> Tensor:
    """exp(x) in FP32 (rel. error ~1e-7) from correctly rounded ops only: Cody-Waite reduction, degree-7 Taylor."""
    x = x.float().clamp(-87.0, 88.0)
    n = torch.round(x * (1.0 / _LN2))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = r * (1.0 / 5040) + (1.0 / 720)
    for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * r + c
    return p * _pow2(n)


def log(x: Tensor) -> Tensor:
    """log(x) for x > 0 in FP32 from correctly rounded ops: x = m 2^e, log m by the atanh series."""
    m, e = torch.frexp(x.float())
    small = m < 0.7071067811865476
    m = torch.where(small, m * 2.0, m)
    e = (e - small.to(e.dtype)).float()
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = s2 * (1.0 / 11) + (1.0 / 9)
    for c in (1.0 / 7, 1.0 / 5, 1.0 / 3, 1.0):
        p = p * s2 + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * p)


def silu(x: Tensor) -> Tensor:
    x = x.float()
    return x / (1.0 + exp(-x))


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last (fixed-size) axis."""
    e = exp(x - x.amax(dim=-1, keepdim=True))
    return e / tree_sum(e)[..., None]


def log_softmax(x: Tensor) -> Tensor:
    """log_softmax over the last (fixed-size) axis."""
    shifted = x.float() - x.float().amax(dim=-1, keepdim=True)
    return shifted - log(tree_sum(exp(shifted)))[..., None]


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    x = x.float()
    inv = 1.0 / torch.sqrt(tree_sum(x * x) / x.shape[-1] + eps)
    out = x * inv[..., None]
    return out if weight is None else out * weight.float()


def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """q (B, H, T, D), k/v (B, H, S, D), allowed (B, 1|H, T, S) bool -> (B, H, T, D) FP32.

    Scores reduce over D by the tree; the softmax denominator and the value sum run over key slots left to
    right, masked slots contributing exact zeros: a query's output depends only on its allowed keys, in order."""
    q, k, v = q.float(), k.float(), v.float()
    scores = tree_sum(q[:, :, :, None, :] * k[:, :, None, :, :]) * scale
    scores = torch.where(allowed, scores, -torch.inf)
    top = scores.amax(dim=-1, keepdim=True)
    weights = torch.where(allowed, exp(torch.where(allowed, scores - top, 0.0)), 0.0)
    denom = torch.zeros_like(weights[..., 0])
    out = torch.zeros_like(q)
    for slot in range(k.shape[2]):
        w = weights[..., slot]
        denom = denom + w
        out = out + torch.where(allowed[..., slot, None], w[..., None] * v[:, :, None, slot, :], 0.0)
    return out / denom[..., None]


def product(x: Tensor, w: Tensor) -> Tensor:
    """x (M, K) @ w (N, K)^T in FP32, each row's arithmetic independent of M (see the module docstring)."""
    x, w = x.float(), w.float()
    m, n = x.shape[0], w.shape[0]
    if x.is_cuda:
        pad = -m % ROWS
        xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
        wt = w.t()
        chunks = [torch.mm(xp[i:i + ROWS].clone(), wt) for i in range(0, m + pad, ROWS)]
        return torch.cat(chunks)[:m] if chunks else x.new_zeros(0, n)
    step = max(1, _CPU_CHUNK // max(1, n * x.shape[1]))
    chunks = [tree_sum(x[i:i + step, None, :] * w[None]) for i in range(0, m, step)]
    return torch.cat(chunks) if chunks else x.new_zeros(0, n)


class _InvariantMM(torch.autograd.Function):
    """Forward: the invariant GEMM of `prepare(x)`, `prepare(w)` operands (quantized or not) times `factor`;
    backward: FP32 GEMMs on the original x and w (the high-precision backward)."""

    @staticmethod
    def forward(ctx, x, w, forward_fn):
        ctx.save_for_backward(x, w)
        return forward_fn(x, w)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad = grad.float()
        dx = (grad @ w.float()).to(x.dtype) if ctx.needs_input_grad[0] else None
        dw = (grad.t() @ x.float()).to(w.dtype) if ctx.needs_input_grad[1] else None
        return dx, dw, None


CHUNKS = 64
"""CUDA grouped GEMM: every batched call multiplies exactly this many ROWS-row chunks."""


def grouped_product(x: Tensor, w: Tensor, counts: list[int]) -> Tensor:
    """Expert-sorted rows x (R, K) times their expert's w[e] (E, N, K)^T -> (R, N) FP32, row-invariant.

    CPU: each expert's rows through `product`. CUDA: rows cut into ROWS-row chunks inside each expert
    (zero-padded), chunks multiplied CHUNKS at a time by one torch.bmm of fixed shape (padding chunks too)."""
    x, w = x.float(), w.float()
    out = x.new_zeros(x.shape[0], w.shape[1])
    if not x.is_cuda:
        start = 0
        for e, count in enumerate(counts):
            if count:
                out[start:start + count] = product(x[start:start + count], w[e])
            start += count
        return out
    firsts, experts, start = [], [], 0
    for e, count in enumerate(counts):
        firsts += range(start, start + count, ROWS)
        experts += [e] * len(range(start, start + count, ROWS))
        start += count
    if not firsts:
        return out
    pad = -len(firsts) % CHUNKS
    # (C, ROWS) row indices; rows past an expert's count (and the padding chunks) are masked below
    index = torch.tensor(firsts + [0] * pad, device=x.device)[:, None] + torch.arange(ROWS, device=x.device)
    owner = torch.tensor(experts + [0] * pad, device=x.device)
    bounds = torch.tensor([0, *counts], device=x.device).cumsum(0)
    real = torch.arange(index.shape[0], device=x.device) < len(firsts)
    valid = (index < bounds[owner + 1][:, None]) & real[:, None]
    chunks = torch.where(valid[..., None], x[index.clamp(max=x.shape[0] - 1)], 0.0)
    for b in range(0, index.shape[0], CHUNKS):
        sel = slice(b, b + CHUNKS)
        prod = torch.bmm(chunks[sel].clone(), w[owner[sel]].transpose(1, 2))
        keep = valid[sel]
        out[index[sel][keep]] = prod[keep]
    return out


class _InvariantGroupedMM(torch.autograd.Function):
    """Grouped counterpart of _InvariantMM: forward_fn(x, w, counts) invariant, FP32 GEMMs per expert backward."""

    @staticmethod
    def forward(ctx, x, w, counts, forward_fn):
        ctx.save_for_backward(x, w)
        ctx.counts = counts
        return forward_fn(x, w, counts)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grad = grad.float()
        dx = torch.zeros_like(x, dtype=torch.float32)
        dw = torch.zeros_like(w, dtype=torch.float32)
        start = 0
        for e, count in enumerate(ctx.counts):
            if count:
                g, xe = grad[start:start + count], x[start:start + count].float()
                dx[start:start + count] = g @ w[e].float()
                dw[e] = g.t() @ xe
            start += count
        return dx.to(x.dtype), dw.to(w.dtype), None, None


def grouped_mm(x: Tensor, w: Tensor, counts: list[int], forward_fn=None) -> Tensor:
    """Batch-invariant grouped x (R, K) @ w[e] (E, N, K)^T per expert group -> (R, N) FP32, differentiable."""
    return _InvariantGroupedMM.apply(x, w, counts, forward_fn or grouped_product)


def mm(x: Tensor, w: Tensor, forward_fn=None) -> Tensor:
    """Batch-invariant x (M, K) @ w (N, K)^T -> (M, N) FP32, differentiable (high-precision backward).

    forward_fn(x, w) replaces the plain invariant product (the quantized experts pass theirs)."""
    return _InvariantMM.apply(x, w, forward_fn or product)
