"""NVFP4 GEMM operands: quantize a matrix along the GEMM's contraction dimension (its rows' 16-blocks).

An operand is rows x K with 1x16 blocks along K, as every NVFP4 GEMM consumes it; its global decode factor
amax/(6B) travels separately because grouped GEMMs apply it per token group / expert.
"""

from dataclasses import dataclass

import torch

from ..numerics import decode_block_scaled, four_over_six_quantize, four_over_six_quantize_decode, nvfp4_quantize
from ..numerics.formats import BLOCK_SIZE, pack_codes, unpack_codes


@dataclass
class Operand:
    """codes uint8 (R, K/2), E4M3 block scales (R, K/16), and optionally the exact bf16 e2m1*scale decode."""

    codes: torch.Tensor
    scales: torch.Tensor
    decoded: torch.Tensor | None = None

    def block_scaled(self) -> torch.Tensor:
        """e2m1 value * block scale in bf16 (exact), the emulated GEMM's input."""
        if self.decoded is None:
            self.decoded = decode_block_scaled(self.codes, self.scales)
        return self.decoded


def quantize_46(x: torch.Tensor, amax: torch.Tensor, *, block: str, err_mode: str, scale_bound: int,
                decode: bool) -> tuple[Operand, torch.Tensor]:
    """Four-over-six quantize (fused with the bf16 decode when the emulated GEMM will need it); returns the
    operand and the map-to-4 mask. amax comes from the ops' own amax of x (or the forward's, for x^T), so
    the public API's check of amax against x (an extra read of x) is skipped."""
    x = x.contiguous()
    if decode:
        decoded, blocks = four_over_six_quantize_decode(x, amax, block=block, err_mode=err_mode,
                                                        scale_bound=scale_bound, validate_amax=False)
        return Operand(blocks.codes, blocks.scales, decoded), blocks.map4
    blocks = four_over_six_quantize(x, amax, block=block, err_mode=err_mode, scale_bound=scale_bound,
                                    validate_amax=False)
    return Operand(blocks.codes, blocks.scales), blocks.map4


def quantize_standard(x: torch.Tensor, amax: torch.Tensor) -> Operand:
    """Standard NVFP4 (B=448, 1x16): the gradient operand of the quantized backward."""
    blocks = nvfp4_quantize(x.contiguous(), amax, validate_amax=False)
    return Operand(blocks.codes, blocks.scales)


def pad_rows(x: torch.Tensor, multiple: int = BLOCK_SIZE) -> torch.Tensor:
    """Zero rows appended up to a multiple of 16, so a transpose can be blocked along them.

    Transparent to the quantizers and the GEMM: zeros never raise a block amax, encode exactly (adding +0 to
    both candidates' errors) and contribute nothing to a dot product.
    """
    extra = -x.shape[0] % multiple
    return torch.nn.functional.pad(x, (0, 0, 0, extra)) if extra else x


def transpose_tiles(op: Operand) -> Operand:
    """The transpose of a 16x16-tile-quantized (R, C) matrix as a (C, R) operand: the forward's own codes and
    tile scales, transposed (spec: a 16x16 tile is its own transpose; re-quantizing could flip a near-tie)."""
    codes = unpack_codes(op.codes)
    codes_t = pack_codes(codes.t().contiguous())
    tiles = op.scales.view(torch.uint8)[::BLOCK_SIZE]  # one row of scales per 16-row tile: (R/16, C/16)
    scales_t = tiles.t().repeat_interleave(BLOCK_SIZE, dim=0).contiguous().view(torch.float8_e4m3fn)
    return Operand(codes_t, scales_t)
