"""The quantized backward's operands (docs/numerics.md section 9), built in one place: the dense and grouped
backward multiply them, the fidelity metrics dequantize them, so both see the same specs, amaxes, layouts,
transforms and stochastic seeds by construction.

Four operands besides the forward's x and W: dy (dgrad's left side, blocked along N), W^T (dgrad's right side:
the forward's 16x16 tiles transposed, or W re-quantized columnwise), dy^T and x^T (the wgrad's, blocked along the
tokens; transformed with wgrad_rht). A stochastically rounded dy takes one seed from GRADIENT_ROUNDING per
quantization, dgrad's dy first, then wgrad's dy^T. With a transformed dy^T the transform runs first: its pass
over dy also takes dy's own amax, which dgrad's dy then needs no second read for.
"""

from typing import NamedTuple

import torch
from torch import Tensor

from ..numerics.formats import BLOCK_SIZE
from ..numerics.groups import RowGroups, TokenBlocks
from .amax import run_tensor_amax, run_token_groups
from .operands import GemmQuantizers, Operand


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
                        w_amax: Tensor, q: GemmQuantizers, need_dx: bool, need_dw: bool) -> GradOperands:
    """A dense GEMM's: dy by q.dy with its own per-tensor amax; W^T by q.w_t with the forward's amax (w_tiles:
    the forward's 16x16 tiles, transposed; else `weight` quantized columnwise); dy^T by q.dy_t and x^T by q.x_t,
    columnwise along M (RoleQuantizer.columns: the forward's amax, or x's column amax when row-scaled, or the
    transformed tensors' with wgrad_rht)."""
    dy_rht = q.dy_t.transform_columns(dy) if need_dw else None
    dy_amax = dy_rht.source_amax if dy_rht and dy_rht.source_amax is not None else run_tensor_amax(
        dy, q.backends.quantizer)
    dyq = w_t = dy_t = dy_t_amax = x_t = x_t_amax = None
    if need_dx:
        w_t = q.w_t.transposed_tiles(w_tiles) if q.w_t.spec.block == "16x16" else q.w_t.columns(weight, w_amax)[0]
        dyq = q.dy.rows(dy, dy_amax)
    if need_dw:
        dy_t, dy_t_amax = q.dy_t.columns(dy, dy_amax, dy_rht)
        x_t, x_t_amax = q.x_t.columns(x, x_amax)
    return GradOperands(dyq, dy_amax, w_t, dy_t, dy_t_amax, x_t, x_t_amax)


def grouped_token_operand(A: Tensor, offs: Tensor, group_of_row: Tensor, a_amax: Tensor,
                          q: GemmQuantizers) -> tuple[TokenBlocks, Operand, Tensor]:
    """(the token-block layout, A^T's wgrad operand, its amaxes): A^T blocked along each group's tokens by q.x_t
    (see grouped_grad_operands). It depends on A alone, so the grouped GEMMs of one A (ops.grouped) build it once
    for all their wgrads: its quantization rounds to nearest (no seed), so sharing it changes no byte."""
    tokens = TokenBlocks.of(offs, A.shape[0])
    x_t, x_t_amax = q.x_t.token_blocks(A, tokens, a_amax, group_of_row)
    return tokens, x_t, x_t_amax


def grouped_grad_operands(dy: Tensor, A: Tensor, B_t: Tensor | None, offs: Tensor, group_of_row: Tensor,
                          a_amax: Tensor, w_tiles: Operand | None, w_amax: Tensor, q: GemmQuantizers,
                          need_da: bool, need_dw: bool,
                          token_operand: tuple[TokenBlocks, Operand, Tensor] | None = None) -> GradOperands:
    """A grouped GEMM's, per expert: dy by rows (blocks along N) by q.dy with one amax per token group; W_e^T
    blocked along N by q.w_t with the forward's expert amax (w_tiles: the forward's 16x16 tiles, transposed per
    expert; else B_t's rows re-quantized, N zero-padded to a multiple of 16); dy^T and A^T blocked along each
    group's tokens, each group zero-padded to 16-token blocks (RoleQuantizer.token_blocks), dy^T with dy's group
    amax, A^T by q.x_t with the forward's group amax or, row-scaled, the group's column amax; with wgrad_rht
    both transformed block by block first. Rows past offs[-1] are read by no amax. token_operand:
    grouped_token_operand's result where the caller built it (the GEMMs of one A share it), else built here."""
    experts, n = offs.numel(), dy.shape[1]
    if need_dw and token_operand is None:
        token_operand = grouped_token_operand(A, offs, group_of_row, a_amax, q)
    tokens = token_operand[0] if need_dw else None
    dy_rht = q.dy_t.transform_token_blocks(dy, tokens) if need_dw else None
    dy_amax = dy_rht.source_amax if dy_rht and dy_rht.source_amax is not None else run_token_groups(
        dy, offs, False, q.backends.quantizer)[0]
    dyq = w_t = dy_t = dy_t_amax = x_t = x_t_amax = None
    if need_da:
        pad_n = -n % BLOCK_SIZE  # 1x16 weights take any N: zero columns change no amax, code or product
        if q.w_t.spec.block == "16x16":
            w_t = q.w_t.transposed_tiles(w_tiles, experts)
        else:
            w_rows = torch.nn.functional.pad(B_t.reshape(-1, n), (0, pad_n))  # W_e^T (K, N) of each expert
            w_t = q.w_t.rows(w_rows, w_amax)  # each expert's amax covers its K rows
        dy_rows = torch.nn.functional.pad(dy, (0, pad_n)) if pad_n else dy
        dyq = q.dy.rows(dy_rows, dy_amax, RowGroups(group_of_row, experts, amax_by_group=True))
    if need_dw:
        dy_t, dy_t_amax = q.dy_t.token_blocks(dy, tokens, dy_amax, group_of_row, dy_rht)
        _, x_t, x_t_amax = token_operand
    return GradOperands(dyq, dy_amax, w_t, dy_t, dy_t_amax, x_t, x_t_amax, tokens)
