"""Oracle of the quantized backward (dense and grouped, per-tensor and row-scaled activations), composed from
the pure-PyTorch reference quantizers (numerics.reference) one GEMM and one token group at a time, with FP32
GEMMs that are checked to be exact (exact_mm): the ops' emulated backward must equal it bit for bit.

It follows docs/numerics.md, section 9, written out per group instead of through the ops' layouts: dy in
standard NVFP4 with its amax (per tensor, or the group's real rows), W^T per expert (16x16: the forward's tiles,
whose decode is the transpose's decode; 1x16: W_e^T quantized along N with the expert's amax), x^T along the
tokens (the forward's amax, or row-scaled x: its column amax), each group's tokens zero-padded to 16; the grouped
products rounded to bf16 (torch._grouped_mm's output) before the global factors, the dense ones not. With
wgrad_rht (section 11) the wgrad operands are first transformed by the reference rht16 (numerics.hadamard), the
whole tensor (dense) or each group's tokens on their own (grouped, zero-padded to 16 first), and every x^T / dy^T
amax is then the transformed tensor's (group's; row-scaled: its column amax).
"""

import torch

from titan_fp4six.numerics import reference as ref
from titan_fp4six.numerics.hadamard import rht16_columns_reference

NVFP4_BOUND = 448


def _lsb(t: torch.Tensor) -> float:
    """The largest power of two dividing every non-zero entry of t (1.0 if none)."""
    t = t[t != 0].double()
    if not t.numel():
        return 1.0
    mantissa, exponent = torch.frexp(t)
    ints = (mantissa.abs() * 2.0 ** 53).long()
    return ((ints & -ints).double() * torch.exp2((exponent - 53).double())).min().item()


def exact_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as an FP32 tensor, asserting first that FP32 accumulation is exact in any order: every product is
    a multiple of lsb(a) * lsb(b) and every partial sum is bounded by (|a| @ |b|), so all of them fit in 24 bits
    when that bound is below 2^24 * lsb(a) * lsb(b). The GEMMs' summation order then cannot change a bit."""
    a64, b64 = a.double(), b.double()
    if a64.numel() and b64.numel():
        bound = (a64.abs() @ b64.abs()).max().item()
        assert bound < 2.0 ** 24 * _lsb(a64) * _lsb(b64), "test data too wide for an order-independent FP32 GEMM"
    return (a64 @ b64).float()


def _inv_six_b(bound: int) -> torch.Tensor:
    return torch.tensor(1.0) / torch.tensor(6.0 * bound)  # fl(1/(6B)), an FP32 division


def factor(amax: torch.Tensor, bound: int) -> torch.Tensor:
    """The global decode factor amax * fl(1/(6B))."""
    return amax.float() * _inv_six_b(bound)


def decode(x: torch.Tensor, amax: torch.Tensor, candidates: str, block: str = "1x16", err_mode: str = "mse",
           bound: int = NVFP4_BOUND, seed: int | None = None) -> torch.Tensor:
    """The block-scaled decode (FP32, exact) of x quantized by the reference: candidates 'nvfp4', '4/6' or '6';
    amax () or one per row; seed: 'nvfp4' rounded stochastically with it (docs/numerics.md section 12)."""
    x = x.contiguous()
    if candidates == "nvfp4":
        codes, scales = ref.nvfp4_reference(x, amax, seed)
    else:
        codes, scales, _ = ref.four_over_six_reference(x, amax, block, err_mode, bound, candidates == "4/6")
    return ref.decode_block_scaled_reference(codes, scales, torch.float32)


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16))


def _pad_cols(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, -x.shape[1] % 16))


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.abs().amax().float() if x.numel() else torch.zeros(())


def _specs(recipe):
    """(x's candidates, W's candidates) by the recipe's scope."""
    x = "4/6" if recipe.scope in ("all", "activations") else "6"
    w = "4/6" if recipe.scope in ("all", "weights") else "6"
    return x, w


def _w_t(w: torch.Tensor, recipe, w_cand: str) -> torch.Tensor:
    """W^T's decode as the (N', K) matrix the dgrad multiplies by (N' = N padded to 16 for 1x16 weights)."""
    amax = _amax(w)
    if recipe.weight_block == "16x16":  # the forward's tiles: their decode is W's, transposed and back
        return decode(w, amax, w_cand, "16x16", recipe.err_mode, recipe.scale_bound)
    return decode(_pad_cols(w.t()), amax, w_cand, "1x16", recipe.err_mode, recipe.scale_bound).t()


def _x_t(x: torch.Tensor, recipe, x_cand: str, row_scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x^T's decode (K, T16), its amax: x's, or per row of x^T (x's column amax) when row-scaled)."""
    amax = x.abs().amax(dim=0).float() if row_scaled else _amax(x)
    if row_scaled and not x.shape[0]:
        amax = torch.zeros(x.shape[1])
    return decode(_pad_rows(x).t(), amax, x_cand, "1x16", recipe.err_mode, recipe.scale_bound), amax


def _wgrad_inputs(x: torch.Tensor, dy: torch.Tensor, recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, dy) as the wgrad quantizes them: unchanged, or with wgrad_rht each zero-padded to 16 tokens and every
    16-token block of every column transformed."""
    if not recipe.wgrad_rht:
        return x, dy
    return rht16_columns_reference(x), rht16_columns_reference(dy)


def dense_backward(x, w, dy, recipe, seeds=(None, None)):
    """(dx, dw) of the dense quantized backward (recipe: backward 'quantized'; x (M, K), w (N, K), dy (M, N));
    seeds: dy's and dy^T's stochastic rounding seeds (gradient_rounding='stochastic')."""
    x_cand, w_cand = _specs(recipe)
    row = recipe.activation_scaling == "row"
    dy_amax, w_amax = _amax(dy), _amax(w)
    dx = exact_mm(decode(dy, dy_amax, "nvfp4", seed=seeds[0]), _w_t(w, recipe, w_cand))
    dx = (dx * (factor(dy_amax, NVFP4_BOUND) * factor(w_amax, recipe.scale_bound))).to(x.dtype)
    x_w, dy_w = _wgrad_inputs(x, dy, recipe)
    dy_t_amax = _amax(dy_w)  # dy's own, or the transformed dy's
    dy_t = decode(_pad_rows(dy_w).t(), dy_t_amax, "nvfp4", seed=seeds[1])
    x_t, x_amax = _x_t(x_w, recipe, x_cand, row)
    f = factor(dy_t_amax, NVFP4_BOUND) * factor(x_amax, recipe.scale_bound)  # () or per column of dW
    return dx, (exact_mm(dy_t, x_t.t()) * f).to(w.dtype)


def grouped_backward(A, W, offs, dy, recipe):
    """(dA (M, K), dW (E, N, K)) of the grouped quantized backward, one token group at a time (A (M, K), W
    (E, N, K) the untransposed expert weights, offs inclusive group ends, dy (M, N)); rows past offs[-1] and empty
    groups get zeros."""
    x_cand, w_cand = _specs(recipe)
    row = recipe.activation_scaling == "row"
    (m, k), (experts, n, _) = A.shape, W.shape
    dA = torch.zeros(m, k, dtype=A.dtype)
    dW = torch.zeros(experts, n, k, dtype=W.dtype)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end == start:
            continue
        a, g = A[start:end], dy[start:end]
        g_amax, w_amax = _amax(g), _amax(W[e])
        # dgrad: the grouped GEMM's bf16 product, then the factors
        prod = exact_mm(decode(_pad_cols(g), g_amax, "nvfp4"), _w_t(W[e], recipe, w_cand)).to(torch.bfloat16)
        f = factor(g_amax, NVFP4_BOUND) * factor(w_amax, recipe.scale_bound)
        dA[start:end] = (prod.float() * f).to(A.dtype)
        # wgrad: over the group's tokens, padded to 16
        a_w, g_w = _wgrad_inputs(a, g, recipe)  # with wgrad_rht: the group's own blocks transformed
        g_t_amax = _amax(g_w)
        x_t, x_amax = _x_t(a_w, recipe, x_cand, row)
        prod = exact_mm(decode(_pad_rows(g_w).t(), g_t_amax, "nvfp4"), x_t.t()).to(torch.bfloat16)
        f = factor(g_t_amax, NVFP4_BOUND) * factor(x_amax, recipe.scale_bound)
        dW[e] = (prod.float() * f).to(W.dtype)
        start = end
    return dA, dW


def narrow_data(shape, seed: int, scale=1.0, dtype=torch.bfloat16) -> torch.Tensor:
    """Random signs times magnitudes in [0.5, 1) times `scale` (a number or a tensor broadcasting over rows):
    every 16-block's amax is within a factor 2 of its tensor's (group's), so the block scales span two binades
    and the quantized GEMMs accumulate exactly in FP32 (exact_mm checks it)."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (sign * (0.5 + 0.5 * torch.rand(shape, generator=g)) * scale).to(dtype)
