"""The 16-point randomized Hadamard transform ('rht16', docs/numerics.md section 11), the PyTorch reference.

Per block of 16 elements x_0..x_15 (in the input dtype, converted to FP32 exactly):
  y_i = x_i * (RHT_SIGNS[i] * 0.25)                 (one FP32 multiply by +-0.25; exact for bf16 and fp16 input)
  four butterfly stages, h = 1, 2, 4, 8: for every i with (i & h) == 0,
      (y_i, y_{i+h}) <- (y_i + y_{i+h}, y_i - y_{i+h})   (FP32 adds, each rounded on its own)
  out_j = y_j cast to the input dtype (round to nearest even), a zero as +0
(a -0 comes only from sums of zeros; a matmul's accumulator, which starts at +0, never ends at -0, and the
quantized byte of -0 differs from +0's)
which is x diag(s) H_16 / 4 with H_16 the Sylvester Hadamard matrix in natural order: the terms of
TransformerEngine's matmul, summed in this fixed order. The Triton kernel (kernels/hadamard.py) performs the same
operations in the same order.
"""

import torch

from .formats import BLOCK_SIZE, RHT_SIGNS

RHT_STAGES = (1, 2, 4, 8)


def _factors(device) -> torch.Tensor:
    """+-0.25 per element position: the sign times 1/sqrt(16), exact in FP32."""
    return torch.tensor([0.25 * s for s in RHT_SIGNS], dtype=torch.float32, device=device)


def rht16_blocks(x: torch.Tensor) -> torch.Tensor:
    """The transform of every 16-element block along x's last dim (a multiple of 16), in x's dtype."""
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"rht16_blocks: x of shape {tuple(x.shape)}; its last dim must be a multiple of "
                         f"{BLOCK_SIZE} (blocks never straddle rows)")
    shape = x.shape
    y = x.float().reshape(-1, BLOCK_SIZE) * _factors(x.device)
    for h in RHT_STAGES:
        v = y.view(-1, BLOCK_SIZE // (2 * h), 2, h)
        a, b = v[:, :, 0], v[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).view(-1, BLOCK_SIZE)
    return torch.where(y == 0, 0.0, y).to(x.dtype).view(shape)


def rht16_columns_reference(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) with zero rows appended up to ceil16(M), then every 16-row block of each column transformed:
    (ceil16(M), K) in x's dtype. Its transpose is the transformed operand x^T that the columnwise quantizer
    blocks along M (what the weight-gradient GEMM consumes)."""
    m, k = x.shape
    padded = torch.nn.functional.pad(x, (0, 0, 0, -m % BLOCK_SIZE))
    rows = padded.shape[0]
    blocks = padded.view(rows // BLOCK_SIZE, BLOCK_SIZE, k).transpose(1, 2)  # (M/16, K, 16)
    return rht16_blocks(blocks.contiguous()).transpose(1, 2).reshape(rows, k)
