"""An independent TransformerEngine-style oracle of the 16-point randomized Hadamard transform: the formula of TE's
reference quantizer (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py): a Sylvester Hadamard matrix
built in FP32, its rows multiplied by the wgrad sign vector, cast to the input dtype and scaled by 1/sqrt(16), then
x.view(-1, 16) @ that matrix in the input dtype (the matmul's own accumulation, output in the input dtype).
Written from the formula, not from the project's code, so it checks numerics/hadamard.py, not itself."""

import torch

TE_SIGNS = [1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0]


def te_rht_matrix(dtype, device="cpu") -> torch.Tensor:
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = torch.diag(torch.tensor(TE_SIGNS, device=device)) @ h
    return h.to(dtype) * (1.0 / 16 ** 0.5)


def te_rht_last_dim(x: torch.Tensor) -> torch.Tensor:
    """TE's _apply_rht: blocks of 16 along the last dim, x_blocks @ (diag(s) H / 4) in x's dtype."""
    return (x.contiguous().view(-1, 16) @ te_rht_matrix(x.dtype, x.device)).view(x.shape)


def te_rht_columns(x: torch.Tensor) -> torch.Tensor:
    """TE's columnwise input: the transform of x^T (x (M, K), M a multiple of 16 as TE requires), transposed
    back to (M, K) for comparison with rht16_columns."""
    return te_rht_last_dim(x.t().contiguous()).t()


def exact_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """Per 16-element block (last dim) of bf16 or fp16 values: whether every FP32 sum of any of its terms
    +-x_i/4 is exact, by the sufficient condition e_max - e_min <= 24 - (p + 4) and e_max <= 125 over the
    block's non-zero elements (p = 8 significant bits for bf16, 11 for fp16; e = floor(log2 |x|), at least the
    format's smallest normal exponent, whose quantum subnormals share): the terms are multiples of
    2^(e_min - p - 1) below 2^(e_max - 1) in magnitude, so every partial sum is a multiple below 2^(e_max + 3).
    Blocks of zeros count as exact; blocks with a NaN or an Inf are left to the edge tests."""
    p, emin = (8, -126) if blocks.dtype == torch.bfloat16 else (11, -14)
    a = blocks.float().abs()
    nz = (a > 0) & torch.isfinite(a)
    e = torch.where(nz, torch.floor(torch.log2(torch.where(nz, a, 1.0))).clamp(min=emin), 0.0)
    e_max = torch.where(nz, e, -1e9).amax(-1)
    e_min = torch.where(nz, e, 1e9).amin(-1)
    return ~nz.any(-1) | ((e_max - e_min <= 24 - (p + 4)) & (e_max <= 125))
