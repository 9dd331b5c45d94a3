"""Map-to-4 statistics: which fraction of 1x16 blocks the forward quantizations stored as map-to-4.

The GEMM ops feed the process-wide MAP4_STATS from inside their op bodies (compile-opaque custom ops under
torch.compile), on the device and without a host sync, while `enabled` (the integration turns it on for the
steps torchtitan logs); the training loop calls `read_and_reset()` when it logs (one sync).
Blocks of rows that are not tokens (past offs[-1] in grouped GEMMs) are not counted. A forward that runs
twice (activation checkpointing recomputes it) counts twice, in numerator and denominator alike.
"""

from dataclasses import dataclass, field

import torch

_FOLD_AT = 64  # pending device counts per device before they are summed into one (bounded memory without reads)


@dataclass
class _Counts:
    hits: list = field(default_factory=list)  # device tensors, summed when read (or folded)
    device_totals: list = field(default_factory=list)  # block totals known only on the device
    host_total: int = 0


def _fold(values: list) -> list:
    return [torch.stack(values).sum()] if len(values) >= _FOLD_AT else values


class Map4Stats:
    """Running map-to-4 block counts per device: hits as device tensors (no sync; one reduction kernel per
    counted mask, the running sum formed when read), totals on the host where the mask's size says them."""

    def __init__(self):
        self.enabled = True
        self._counts: dict[torch.device, _Counts] = {}

    def add(self, map4: torch.Tensor, group_of_row: torch.Tensor | None = None, groups: int = 0) -> None:
        """Count a (R, C/16) bool map-to-4 mask; with `group_of_row` (R,), rows of group >= `groups` (past the
        last token group) are not data and are dropped (the mask for it is formed only while counting)."""
        if not self.enabled or map4 is None:
            return
        counts = self._counts.setdefault(map4.device, _Counts())
        if group_of_row is None:
            counts.hits.append(map4.sum())
            counts.host_total += map4.numel()
        else:
            valid_rows = group_of_row < groups
            counts.hits.append((map4 & valid_rows[:, None]).sum())
            counts.device_totals.append(valid_rows.sum() * map4.shape[1])
            counts.device_totals = _fold(counts.device_totals)
        counts.hits = _fold(counts.hits)

    def read_and_reset(self) -> float | None:
        """Fraction of counted blocks that chose map-to-4 since the last call (None if nothing was counted)."""
        hits = total = 0
        for counts in self._counts.values():
            hits += int(torch.stack(counts.hits).sum()) if counts.hits else 0
            total += counts.host_total + (int(torch.stack(counts.device_totals).sum()) if counts.device_totals else 0)
        self._counts.clear()
        return hits / total if total else None


MAP4_STATS = Map4Stats()
