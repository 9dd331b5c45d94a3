"""NVFP4 GEMM operands: quantize a matrix along the GEMM's contraction dimension (its rows' 16-blocks).

An operand is rows x K with 1x16 blocks along K, as every NVFP4 GEMM consumes it; its global decode factor
amax/(6B) travels separately because grouped GEMMs apply it per token group / expert.
"""

from dataclasses import dataclass

import torch

from ..dispatch.backend import Backends
from ..dispatch.quantize import (run_decode_block_scaled, run_quantize, run_quantize_columnwise,
                                 run_transformed_columnwise)
from ..numerics.formats import BLOCK_SIZE, pack_codes, unpack_codes
from ..numerics.reference import RowGroups
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
                     groups: RowGroups | None = None, counted: bool = False) -> Operand:
    """x quantized by `spec`, fused with the bf16 decode when the emulated GEMM will need it; each row's amax by
    reference.amax_per_row(amax, rows, groups). counted (the forward's operands): while MAP4_STATS is enabled the
    quantizer adds its map-to-4 counts to it."""
    map4 = MAP4_STATS.counts(x.device) if counted else False
    codes, scales, _, decoded = run_quantize(x.contiguous(), amax, spec, backends.quantizer, not backends.fp4,
                                             groups=groups, map4=map4)
    return Operand(codes, scales, decoded)


def quantize_columnwise(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec, backends: Backends) -> Operand:
    """The operand of x^T (K, ceil16(M)) for a 2-D x (M, K) and a per-tensor amax, 1x16 blocks along M (the
    quantized backward's columnwise operands), read from x in place on CUDA."""
    codes, scales, _, decoded = run_quantize_columnwise(x, amax, spec, backends.quantizer, not backends.fp4,
                                                        map4=False)
    return Operand(codes, scales, decoded)


def quantize_columnwise_operand(x: torch.Tensor, amax: torch.Tensor, spec: OperandSpec,
                                backends: Backends) -> tuple[Operand, torch.Tensor]:
    """(operand of x^T, its amax) as quantize_columnwise for a spec without a transform (amax is x's); with
    spec.transform ('rht16') x^T's blocks are transformed first and the amax is the transformed tensor's, computed
    here (the forward's amax is not used)."""
    if spec.transform == "none":
        return quantize_columnwise(x, amax, spec, backends), amax
    codes, scales, t_amax, decoded = run_transformed_columnwise(x, spec, backends.quantizer, not backends.fp4)
    return Operand(codes, scales, decoded), t_amax


def transpose_tiles(op: Operand) -> Operand:
    """The transpose of a 16x16-tile-quantized (R, C) matrix as a (C, R) operand: the forward's own codes and
    tile scales, transposed (spec: a 16x16 tile is its own transpose; re-quantizing could flip a near-tie)."""
    codes = unpack_codes(op.codes)
    codes_t = pack_codes(codes.t().contiguous())
    tiles = op.scales.view(torch.uint8)[::BLOCK_SIZE]  # one row of scales per 16-row tile: (R/16, C/16)
    scales_t = tiles.t().repeat_interleave(BLOCK_SIZE, dim=0).contiguous().view(torch.float8_e4m3fn)
    return Operand(codes_t, scales_t)


def transposed_tiles(op: Operand, backends: Backends) -> Operand:
    """The transpose of a 16x16-tile-quantized operand: for the emulated GEMM its decode, transposed (a view: a
    tile's decode transposes with it); for the real FP4 GEMM its codes and scales transposed."""
    return transpose_tiles(op) if backends.fp4 else Operand(None, None, op.block_scaled(backends.quantizer).t())
