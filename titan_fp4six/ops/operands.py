"""NVFP4 GEMM operands: quantize a matrix along the GEMM's contraction dimension (its rows' 16-blocks).

An operand is rows x K with 1x16 blocks along K, as every NVFP4 GEMM consumes it; its global decode factor
amax/(6B) travels separately because grouped GEMMs apply it per token group / expert.
"""

from dataclasses import dataclass

import torch

from ..dispatch.amax import run_column_amax
from ..dispatch.backend import Backends
from ..dispatch.quantize import (run_decode_block_scaled, run_quantize, run_quantize_columnwise, run_rht16_columns,
                                 run_transformed_columnwise)
from ..numerics.formats import BLOCK_SIZE, pack_codes, unpack_codes
from ..numerics.groups import RowGroups
from ..numerics.spec import OperandSpec
from .stats import MAP4_STATS


@dataclass
class Operand:
    """codes uint8 (R, K/2), E4M3 block scales (R, K/16), and optionally the exact bf16 e2m1*scale decode (an
    operand only the emulated GEMM reads may carry the decode alone)."""

    codes: torch.Tensor | None
    scales: torch.Tensor | None
    decoded: torch.Tensor | None = None

    def block_scaled(self, quantizer: str) -> torch.Tensor:
        """e2m1 value * block scale in bf16 (exact), the emulated GEMM's input; decoded here (by the resolved
        `quantizer`) unless the quantizer wrote it already."""
        if self.decoded is None:
            self.decoded = run_decode_block_scaled(self.codes, self.scales, quantizer)
        return self.decoded


def quantize_operand(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, backends: Backends,
                     groups: RowGroups | None = None, counted: bool = False, seed: int | None = None) -> Operand:
    """x quantized by `spec`, fused with the bf16 decode when the emulated GEMM will need it; each row's amax by
    reference.amax_per_row(amax, rows, groups). counted (the forward's operands): while MAP4_STATS is enabled the
    quantizer adds its map-to-4 counts to it. seed: the Philox seed of a stochastically rounded spec."""
    map4 = MAP4_STATS.counts(x.device) if counted else False
    codes, scales, _, decoded = run_quantize(x.contiguous(), amax, spec, backends.quantizer, not backends.fp4,
                                             groups=groups, map4=map4, seed=seed)
    return Operand(codes, scales, decoded)


def quantize_columnwise(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, backends: Backends,
                        seed: int | None = None) -> Operand:
    """The operand of x^T (K, ceil16(M)) for a 2-D x (M, K), 1x16 blocks along M (the quantized backward's
    columnwise operands): with a per-tensor amax read from x in place on CUDA; with one amax per row of x^T
    (K,) (row-scaled x) quantized from the zero-padded transpose. seed: a stochastically rounded spec's."""
    codes, scales, _, decoded = run_quantize_columnwise(x, amax, spec, backends.quantizer, not backends.fp4,
                                                        map4=False, seed=seed)
    return Operand(codes, scales, decoded)


def quantize_columnwise_operand(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, backends: Backends,
                                seed: int | None = None) -> tuple[Operand, torch.Tensor]:
    """(operand of x^T, its amax) as quantize_columnwise for a spec without a transform (amax is x's); with
    spec.transform ('rht16') x^T's blocks are transformed first and the amax is the transformed tensor's, computed
    here (the forward's amax is not used). seed: a stochastically rounded spec's."""
    if spec.transform == "none":
        return quantize_columnwise(x, amax, spec, backends, seed), amax
    codes, scales, t_amax, decoded = run_transformed_columnwise(x, spec, backends.quantizer, not backends.fp4, seed)
    return Operand(codes, scales, decoded), t_amax


def quantize_columnwise_row_scaled(x: torch.Tensor, spec: OperandSpec,
                                   backends: Backends) -> tuple[Operand, torch.Tensor]:
    """(operand of x^T, its amax (K,)) for a row-scaled x (M, K): one amax per row of x^T, i.e. x's column amax
    (per-token amaxes do not transpose). With spec.transform ('rht16') x's 16-token blocks are transformed first
    (zero rows appended up to ceil16(M)) and the column amaxes are the transformed tensor's."""
    if spec.transform != "none":
        x = run_rht16_columns(x, backends.quantizer)
    amax = run_column_amax(x)
    return quantize_columnwise(x, amax, spec.untransformed, backends), amax


def transpose_tile_codes(op: Operand, experts: int = 1) -> Operand:
    """The transpose of a 16x16-tile-quantized (R, C) matrix as a (C, R) operand: the forward's own codes and
    tile scales, transposed (spec: a 16x16 tile is its own transpose; re-quantizing could flip a near-tie).
    experts > 1: R = E*N rows of E experts' (N, C) weights, each transposed on its own -> (E*C, N)."""
    rows, cols = op.codes.shape[0], op.codes.shape[1] * 2
    n = rows // experts
    codes = unpack_codes(op.codes).view(experts, n, cols)
    codes_t = pack_codes(codes.transpose(1, 2).reshape(experts * cols, n))
    tiles = op.scales.view(torch.uint8)[::BLOCK_SIZE]  # one row of scales per 16-row tile: (R/16, C/16)
    tiles_t = tiles.view(experts, n // BLOCK_SIZE, cols // BLOCK_SIZE).transpose(1, 2)
    scales_t = tiles_t.repeat_interleave(BLOCK_SIZE, dim=1).reshape(experts * cols, n // BLOCK_SIZE)
    return Operand(codes_t, scales_t.contiguous().view(torch.float8_e4m3fn))


def transposed_tiles(op: Operand, backends: Backends, experts: int = 0) -> Operand:
    """The transpose of a 16x16-tile-quantized operand: for the emulated GEMM its decode, transposed (a view: a
    tile's decode transposes with it); for the real FP4 GEMM its codes and scales transposed. experts: the
    operand is E experts' (N, C) weights stacked, each transposed (the decode as an (E, C, N) view)."""
    if backends.fp4:
        return transpose_tile_codes(op, max(experts, 1))
    decoded = op.block_scaled(backends.quantizer)
    if experts:
        return Operand(None, None, decoded.view(experts, -1, decoded.shape[-1]).transpose(-2, -1))
    return Operand(None, None, decoded.t())
