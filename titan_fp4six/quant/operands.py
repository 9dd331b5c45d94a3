"""NVFP4 GEMM operands and the role quantizers that make them, one per operand role of a GEMM plan on a device.

An operand is rows x K with 1x16 blocks along K, as every NVFP4 GEMM consumes it; its global decode factor
amax/(6B) travels separately because grouped GEMMs apply it per token group / expert. A GEMM op's body asks
gemm_quantizers(key, grouped, device) once for its plan's role quantizers (x, w and the quantized backward's dy,
x_t, w_t, dy_t), each carrying its spec, the resolved backends, its seed source and whether it counts map-to-4
blocks, and calls rows / columns / token_blocks / transposed_tiles on them.
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..numerics.formats import BLOCK_SIZE, pack_codes, unpack_codes
from ..numerics.groups import RowGroups, TokenBlocks
from ..numerics.spec import OperandSpec
from .amax import run_column_amax, run_group_column_amax
from .backends import Backends, backends_for
from .library import in_profiler_range
from .process_state import GRADIENT_ROUNDING, MAP4_STATS
from .primitives import pick
from .quantize import (DECODE, QUANTIZE, QUANTIZE_COLUMNWISE, padded_transpose, run_quantize_token_blocks,
                       run_rht16_columns, run_rht16_columns_amax, run_rht16_token_blocks_amax)
from .recipe import GemmPlan, plan_of_key


@dataclass
class Operand:
    """codes uint8 (R, K/2), E4M3 block scales (R, K/16), and optionally the exact bf16 e2m1*scale decode (an
    operand only the emulated GEMM reads may carry the decode alone)."""

    codes: Tensor | None
    scales: Tensor | None
    decoded: Tensor | None = None

    def block_scaled(self, quantizer: str) -> Tensor:
        """e2m1 value * block scale in bf16 (exact), the emulated GEMM's input; decoded here (by the resolved
        `quantizer`) unless the quantizer wrote it already."""
        if self.decoded is None:
            self.decoded = pick(DECODE, quantizer, self.codes, self.scales)(self.codes, self.scales)
        return self.decoded


class Transformed(NamedTuple):
    """An operand transformed ('rht16') in the layout its quantizer reads, with the amaxes the transform's pass
    took: max |transformed| (per tensor, or per group for token blocks) and max |input| (the same), both None for
    a row-scaled spec (its per-column amaxes come after). tokens: token_blocks' layout over the transformed x
    (TokenBlocks.laid_out), None for columns."""

    x: Tensor
    amax: Tensor | None
    source_amax: Tensor | None
    tokens: TokenBlocks | None = None


class RoleQuantizer:
    """One operand role of a plan on a device: its spec, the backends, and whether its quantizations add their
    map-to-4 counts to MAP4_STATS (the forward's x and W). A stochastically rounded spec takes each
    quantization's Philox seed from GRADIENT_ROUNDING, in call order. The decode the emulated GEMMs read is
    written in the quantizer's pass unless real FP4 GEMMs run. What the calls need is resolved here, once.
    `role` (x, w, dy, x_t, w_t, dy_t) names its quantizations in a profiler trace ("titan_fp4six quantize x_t"),
    so that a profile attributes each quantize launch to its operand."""

    def __init__(self, spec: OperandSpec, backends: Backends, counted: bool = False, role: str = "operand"):
        self.spec, self.backends, self.counted = spec, backends, counted
        self.label = f"titan_fp4six quantize {role}"
        self.quantizer, self.decode, self.bound = backends.quantizer, not backends.fp4, spec.scale_bound
        self.base = spec if spec.transform == "none" else spec.untransformed  # what quantizes after the transform
        self.stochastic = spec.rounding == "stochastic"

    def __repr__(self) -> str:
        return f"RoleQuantizer({self.spec}, {self.backends}, counted={self.counted})"

    def rows(self, x: Tensor, amax: Tensor, groups: RowGroups | None = None) -> Operand:
        """x quantized along its rows; each row's amax by reference.amax_per_row(amax, rows, groups)."""
        x = x.contiguous()
        map4 = MAP4_STATS.counts(x.device) if self.counted else False
        seed = GRADIENT_ROUNDING.next() if self.stochastic else None
        codes, scales, _, decoded = in_profiler_range(self.label, pick(QUANTIZE, self.quantizer, x), x, amax,
                                                      self.spec, self.decode, False, groups, map4, seed)
        return Operand(codes, scales, decoded)

    def transform_columns(self, x: Tensor) -> Transformed | None:
        """x's 16-row blocks transformed for columns() (None without a transform); one pass over x also takes
        max |x|, which a caller quantizing x's rows too need not read again."""
        if self.spec.transform == "none":
            return None
        if self.spec.scaling == "row":
            return Transformed(run_rht16_columns(x, self.quantizer), None, None)
        t, amaxes = run_rht16_columns_amax(x, self.quantizer)
        return Transformed(t, amaxes[0], amaxes[1])

    def columns(self, x: Tensor, amax: Tensor | None = None,
                transformed: Transformed | None = None) -> tuple[Operand, Tensor]:
        """(operand of x^T (K, ceil16(M)), its amax) for a 2-D x (M, K), 1x16 blocks along M, zero rows up to
        ceil16(M): with the given per-tensor amax, read from x in place on CUDA; for a row-scaled spec one amax per
        row of x^T, x's column amax, computed here (per-token amaxes do not transpose); with a transform
        ('rht16') every 16-row block transformed first (`transformed`: transform_columns(x) if the caller ran it)
        and the amax the transformed tensor's (`amax` unused)."""
        row_scaled = self.spec.scaling == "row"
        if self.spec.transform != "none":
            x, amax = (transformed or self.transform_columns(x))[:2]
        if row_scaled:
            amax = run_column_amax(x)
        seed = GRADIENT_ROUNDING.next() if self.stochastic else None
        if amax.dim() == 0:  # the kernel reads x in place (the reference quantizes the zero-padded transpose)
            quantize = pick(QUANTIZE_COLUMNWISE, self.quantizer, x)
            codes, scales, _, decoded = in_profiler_range(self.label, quantize, x, amax, self.base, self.decode,
                                                          False, seed)
        else:  # one amax per row of x^T: the zero-padded transpose, quantized along its rows
            xt = padded_transpose(x)
            quantize = pick(QUANTIZE, self.quantizer, xt)
            codes, scales, _, decoded = in_profiler_range(self.label, quantize, xt, amax, self.base, self.decode,
                                                          False, None, False, seed)
        return Operand(codes, scales, decoded), amax

    def transform_token_blocks(self, x: Tensor, tb: TokenBlocks) -> Transformed | None:
        """x's token rows laid out by `tb`, every 16-token block transformed, for token_blocks() (None without a
        transform; a group's zero padding transforms with its tokens, blocks past the last group stay zeros); one
        pass over x also takes its per-group amax, which a caller quantizing x's rows too need not read again."""
        if self.spec.transform == "none":
            return None
        t, amaxes = run_rht16_token_blocks_amax(x, tb, self.quantizer)
        if self.spec.scaling == "row":
            return Transformed(t, None, None, tb.laid_out())
        return Transformed(t, amaxes[0], amaxes[1], tb.laid_out())

    def token_blocks(self, x: Tensor, tb: TokenBlocks, amax: Tensor, group_of_row: Tensor,
                     transformed: Transformed | None = None) -> tuple[Operand, Tensor]:
        """(operand of x^T by 16-token blocks, its amaxes) for the grouped wgrad: x's token rows laid out by `tb`
        and quantized block by block (read in place on CUDA) with `amax` per group (E,), or for a row-scaled
        spec per group and column (E, C), computed here from x and group_of_row. With a transform ('rht16')
        every 16-token block of the layout is transformed first (`transformed`: transform_token_blocks(x, tb) if
        the caller ran it) and the amaxes are the transformed layout's (`amax` unused)."""
        experts = tb.ends.numel()
        if self.spec.transform != "none":
            x, amax, _, tb = transformed or self.transform_token_blocks(x, tb)
            if self.spec.scaling == "row":
                amax = run_group_column_amax(x, tb.block_group.repeat_interleave(BLOCK_SIZE), experts)
        elif self.spec.scaling == "row":
            amax = run_group_column_amax(x, group_of_row, experts)
        seed = GRADIENT_ROUNDING.next() if self.stochastic else None
        codes, scales, decoded = in_profiler_range(self.label, run_quantize_token_blocks, x, tb, amax, self.base,
                                                   self.quantizer, self.decode, seed)
        return Operand(codes, scales, decoded), amax

    def transposed_tiles(self, op: Operand, experts: int = 0) -> Operand:
        """The transpose of an operand quantized in 16x16 tiles (a tile is its own transpose: the forward's
        codes and scales, not quantized again): for the emulated GEMM its decode, transposed (a view); for the
        real FP4 GEMM its codes and scales transposed. experts: the operand is E experts' (N, C) weights
        stacked, each transposed (the decode as an (E, C, N) view)."""
        if self.backends.fp4:
            return transpose_tile_codes(op, max(experts, 1))
        decoded = op.block_scaled(self.quantizer)
        if experts:
            return Operand(None, None, decoded.view(experts, -1, decoded.shape[-1]).transpose(-2, -1))
        return Operand(None, None, decoded.t())


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


class GemmQuantizers(NamedTuple):
    """A GemmPlan on one device: the backends and a role quantizer per operand role (None where the plan has
    none: the quantized backward's roles in the other backward modes)."""

    plan: GemmPlan
    backends: Backends
    x: RoleQuantizer
    w: RoleQuantizer
    dy: RoleQuantizer | None
    x_t: RoleQuantizer | None
    w_t: RoleQuantizer | None
    dy_t: RoleQuantizer | None
    row_scaled: bool


@functools.cache
def gemm_quantizers(key: str, grouped: bool, device: torch.device) -> GemmQuantizers:
    """The role quantizers of the plan `key` names (recipe.plan_of_key), on `device`:
    built once per (key, grouped, device), what every op call after the first reads."""
    plan = plan_of_key(key, grouped)
    b = backends_for(plan.quantizer, plan.gemm, device)
    x = RoleQuantizer(plan.x, b, counted=True, role="x")  # the forward's operands count map-to-4 blocks
    w = RoleQuantizer(plan.w, b, counted=True, role="w")
    if plan.backward != "quantized":
        return GemmQuantizers(plan, b, x, w, None, None, None, None, plan.row_scaled)
    backward = (RoleQuantizer(getattr(plan, role), b, role=role) for role in ("dy", "x_t", "w_t", "dy_t"))
    return GemmQuantizers(plan, b, x, w, *backward, plan.row_scaled)
