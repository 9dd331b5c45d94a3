"""The quantized backward's operands (docs/numerics.md section 9), built in one place: the dense and grouped
backward multiply them, the fidelity metrics dequantize them, so both see the same specs, amaxes, layouts,
transforms and stochastic seeds by construction.

Four operands besides the forward's x and W: dy (dgrad's left side, blocked along N), W^T (dgrad's right side:
the forward's 16x16 tiles transposed, or W re-quantized columnwise), dy^T and x^T (the wgrad's, blocked along the
tokens; transformed with wgrad_rht). A stochastically rounded dy takes one seed from GRADIENT_ROUNDING per
quantization, dgrad's dy first, then wgrad's dy^T.
"""

from typing import NamedTuple

import torch
from torch import Tensor

from ..dispatch.amax import run_group_column_amax, run_tensor_amax, run_token_groups
from ..dispatch.backend import Backends
from ..dispatch.quantize import run_quantize_token_blocks, run_rht16_token_blocks
from ..numerics.formats import BLOCK_SIZE
from ..numerics.groups import RowGroups, TokenBlocks
from ..numerics.spec import OperandSpec
from .operands import (Operand, quantize_columnwise, quantize_columnwise_operand, quantize_columnwise_row_scaled,
                       quantize_operand, transposed_tiles)
from .recipe import GemmPlan
from .rounding import GRADIENT_ROUNDING


class GradOperands(NamedTuple):
    """The quantized backward's operands and their amaxes; None where the gradient they serve is not needed.

    dy (M, N'), dy_amax () per tensor or (E,) per token group; w_t: W^T (K, N') (grouped: E experts' (K, N')
    stacked, or an (E, K, N) decode view), with the forward's w_amax; dy_t (N, P) and x_t (K, P) blocked along the
    tokens, with dy_t_amax and x_t_amax (per tensor, per group, or x_t's per row of x^T / per group and row).
    N' = N zero-padded to a multiple of 16 for grouped 1x16 weights. tokens: the grouped layout (TokenBlocks)."""

    dy: Operand | None
    dy_amax: Tensor
    w_t: Operand | None
    dy_t: Operand | None
    dy_t_amax: Tensor | None
    x_t: Operand | None
    x_t_amax: Tensor | None
    tokens: TokenBlocks | None = None


def dense_grad_operands(dy: Tensor, x: Tensor, weight: Tensor | None, w_tiles: Operand | None, x_amax: Tensor,
                        w_amax: Tensor, p: GemmPlan, b: Backends, need_dx: bool, need_dw: bool) -> GradOperands:
    """A dense GEMM's: dy by p.dy with its own per-tensor amax; W^T by p.w_t with the forward's amax (w_tiles:
    the forward's 16x16 tiles, transposed; else `weight` quantized columnwise); dy^T by p.dy_t and x^T by p.x_t,
    columnwise along M read in place (zero rows up to ceil16(M)), x^T with the forward's amax or, row-scaled,
    one amax per row of x^T (x's column amax: per-token amaxes do not transpose); with wgrad_rht both transformed
    first and quantized with their own amaxes."""
    dy_amax = run_tensor_amax(dy, b.quantizer)
    dyq = w_t = dy_t = dy_t_amax = x_t = x_t_amax = None
    if need_dx:
        w_t = transposed_tiles(w_tiles, b) if p.w_t.block == "16x16" else quantize_columnwise(weight, w_amax, p.w_t, b)
        dyq = quantize_operand(dy, dy_amax, p.dy, b, seed=GRADIENT_ROUNDING.seed_for(p.dy))
    if need_dw:
        dy_t, dy_t_amax = quantize_columnwise_operand(dy, dy_amax, p.dy_t, b, seed=GRADIENT_ROUNDING.seed_for(p.dy_t))
        if p.x_t.scaling == "row":
            x_t, x_t_amax = quantize_columnwise_row_scaled(x, p.x_t, b)
        else:
            x_t, x_t_amax = quantize_columnwise_operand(x, x_amax, p.x_t, b)
    return GradOperands(dyq, dy_amax, w_t, dy_t, dy_t_amax, x_t, x_t_amax)


def _token_block_operand(x: Tensor, tb: TokenBlocks, amax: Tensor, spec: OperandSpec, b: Backends,
                         group_of_row: Tensor, seed: int | None = None) -> tuple[Operand, Tensor]:
    """(operand of x^T by 16-token blocks, its amaxes) for the grouped wgrad: x's token rows laid out by `tb` and
    quantized block by block (run_quantize_token_blocks, reading x in place on CUDA) with `amax`, per group (E,)
    or, for a row-scaled spec, per group and column (E, C) (computed here from x and group_of_row). With
    spec.transform ('rht16') every 16-token block of the layout is transformed first (each block lies in one
    group; a group's zero padding is transformed with its tokens, and blocks past the last group stay zeros) and
    the amaxes are the transformed layout's, per group (and column): `amax` is not used. seed: a stochastically
    rounded spec's."""
    experts = tb.ends.numel()
    if spec.transform != "none":
        x = run_rht16_token_blocks(x, tb, b.quantizer)  # (P, C), already in the layout
        tb = tb.laid_out()
        if spec.scaling == "row":
            amax = run_group_column_amax(x, tb.block_group.repeat_interleave(BLOCK_SIZE), experts)
        else:  # the groups' padded ends delimit their blocks; positions past the last end belong to no group
            amax = run_token_groups(x, tb.ends, False, b.quantizer)[0]
    elif spec.scaling == "row":
        amax = run_group_column_amax(x, group_of_row, experts)
    codes, scales, decoded = run_quantize_token_blocks(x, tb, amax, spec.untransformed, b.quantizer, not b.fp4, seed)
    return Operand(codes, scales, decoded), amax


def grouped_grad_operands(dy: Tensor, A: Tensor, B_t: Tensor | None, offs: Tensor, group_of_row: Tensor,
                          a_amax: Tensor, w_tiles: Operand | None, w_amax: Tensor, p: GemmPlan, b: Backends,
                          need_da: bool, need_dw: bool) -> GradOperands:
    """A grouped GEMM's, per expert: dy by rows (blocks along N) by p.dy with one amax per token group; W_e^T
    blocked along N by p.w_t with the forward's expert amax (w_tiles: the forward's 16x16 tiles, transposed per
    expert; else B_t's rows re-quantized, N zero-padded to a multiple of 16); dy^T and A^T blocked along each
    group's tokens, each group zero-padded to 16-token blocks (TokenBlocks), dy^T with dy's group amax, A^T by
    p.x_t with the forward's group amax or, row-scaled, the group's column amax; with wgrad_rht both transformed
    block by block first, with the transformed blocks' amaxes (_token_block_operand). Rows past offs[-1] are read
    by no amax."""
    experts, (rows, n) = offs.numel(), dy.shape
    dy_amax = run_token_groups(dy, offs, False, b.quantizer)[0]
    dyq = w_t = dy_t = dy_t_amax = x_t = x_t_amax = tokens = None
    if need_da:
        pad_n = -n % BLOCK_SIZE  # 1x16 weights take any N: zero columns change no amax, code or product
        if p.w_t.block == "16x16":
            w_t = transposed_tiles(w_tiles, b, experts)
        else:
            w_rows = torch.nn.functional.pad(B_t.reshape(-1, n), (0, pad_n))  # W_e^T (K, N) of each expert
            w_t = quantize_operand(w_rows, w_amax, p.w_t, b)  # each expert's amax covers its K rows
        dy_rows = torch.nn.functional.pad(dy, (0, pad_n)) if pad_n else dy
        dyq = quantize_operand(dy_rows, dy_amax, p.dy, b, RowGroups(group_of_row, experts, amax_by_group=True),
                               seed=GRADIENT_ROUNDING.seed_for(p.dy))
    if need_dw:
        tokens = TokenBlocks.of(offs, rows)
        dy_t, dy_t_amax = _token_block_operand(dy, tokens, dy_amax, p.dy_t, b, group_of_row,
                                               GRADIENT_ROUNDING.seed_for(p.dy_t))
        x_t, x_t_amax = _token_block_operand(A, tokens, a_amax, p.x_t, b, group_of_row)
    return GradOperands(dyq, dy_amax, w_t, dy_t, dy_t_amax, x_t, x_t_amax, tokens)
