"""The token groups of a grouped (MoE) GEMM as the quantizers read them: each row's group (RowGroups) and the
grouped weight gradient's layout of the groups in 16-token blocks (TokenBlocks, docs/numerics.md section 9)."""

from typing import NamedTuple

import torch

from .formats import BLOCK_SIZE


class RowGroups(NamedTuple):
    """The token groups of a grouped GEMM operand's rows: each row's group (int64 (R,), group_index) and the
    number of groups; rows of group n_groups (past offs[-1]) are not data: amax 0, not counted. amax_by_group:
    the operand's amax holds one value per group (else one per row)."""

    group_of_row: torch.Tensor
    n_groups: int
    amax_by_group: bool


class TokenBlocks(NamedTuple):
    """A grouped GEMM's token rows laid out for the columnwise operands of its weight gradient
    (docs/numerics.md section 9): each token group padded with zero rows to a multiple of 16 tokens, so that every
    16-token block lies in one group. P = ceil16(M) + 16 E positions (a bound, no host sync); positions past the
    last group's padded end hold zeros and no group."""

    src: torch.Tensor  # (P,) int64: the row of A at each position (0 where padding)
    valid: torch.Tensor  # (P,) bool: the position holds a token
    block_group: torch.Tensor  # (P/16,) int64: each 16-token block's group, E past the last group
    ends: torch.Tensor  # (E,) int32: the groups' padded inclusive ends (the wgrad GEMM's offs)
    table: torch.Tensor  # (3, P/16) int32: each block's first row of A, its tokens (a prefix), its group

    @staticmethod
    def of(offs: torch.Tensor, rows: int) -> "TokenBlocks":
        """The layout of the token groups with inclusive ends offs (E,) over `rows` rows."""
        experts = offs.numel()
        offs64 = offs.long()
        counts = torch.diff(offs64, prepend=offs64.new_zeros(1))
        padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
        ends = torch.cumsum(padded, 0)
        pos = torch.arange(-(-rows // BLOCK_SIZE) * BLOCK_SIZE + BLOCK_SIZE * experts, device=offs.device)
        group = torch.searchsorted(ends, pos, right=True)
        g = group.clamp(max=experts - 1)
        t = pos - (ends[g] - padded[g])
        valid = (group < experts) & (t < counts[g])
        src = torch.where(valid, offs64[g] - counts[g] + t, 0)
        return TokenBlocks._with_table(src, valid, group[::BLOCK_SIZE], ends.to(torch.int32))

    @staticmethod
    def _with_table(src, valid, block_group, ends) -> "TokenBlocks":
        table = torch.stack((src[::BLOCK_SIZE], valid.view(-1, BLOCK_SIZE).sum(1), block_group)).to(torch.int32)
        return TokenBlocks(src, valid, block_group, ends, table)

    def laid_out(self) -> "TokenBlocks":
        """The same blocks and groups over a tensor already in this layout ((P, C), e.g. transformed): position p
        reads row p, every position of a block."""
        pos = torch.arange(self.src.numel(), device=self.src.device)
        return TokenBlocks._with_table(pos, torch.ones_like(self.valid), self.block_group, self.ends)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x's token rows at their positions (P, C), zeros elsewhere (rows past offs[-1] are never read)."""
        if not x.shape[0]:
            return x.new_zeros(self.src.shape[0], x.shape[1])
        return torch.where(self.valid[:, None], x.index_select(0, self.src), 0)

    def block_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """Per-group amaxes (E,) or per group and column (E, C) -> each 16-token block's, (P/16,) or (P/16, C); 0
        for blocks of no group."""
        return torch.cat((amax, amax.new_zeros(1, *amax.shape[1:]))).index_select(0, self.block_group)
