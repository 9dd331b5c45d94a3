"""Map-to-4 statistics: which fraction of 1x16 blocks the forward quantizations stored as map-to-4.

The GEMM ops feed the process-wide MAP4_STATS from inside their (compile-opaque) custom ops, on the device
and without a host sync; the training loop calls `read_and_reset()` once per step (one sync) to log it.
Blocks of rows that are not tokens (past offs[-1] in grouped GEMMs) are not counted. A forward that runs
twice (activation checkpointing recomputes it) counts twice, in numerator and denominator alike.
"""

import torch


class Map4Stats:
    """Running map-to-4 block count (an int64 device tensor) and total block count (a host int where every count
    was known on the host, else a device tensor), per device."""

    def __init__(self):
        self.enabled = True
        self._counts: dict[torch.device, list] = {}  # device -> [hits (device tensor), total (tensor or int)]

    def add(self, map4: torch.Tensor, valid_rows: torch.Tensor | None = None) -> None:
        """Count a (R, C/16) bool map-to-4 mask; `valid_rows` (R,) bool drops rows that are not data."""
        if not self.enabled or map4 is None:
            return
        if valid_rows is None:  # the total is known on the host: only the hits need a device reduction
            hits, total = map4.sum(), map4.numel()
        else:
            hits = (map4 & valid_rows[:, None]).sum()
            total = valid_rows.sum() * map4.shape[1]
        count = self._counts.get(map4.device)
        if count is None:
            self._counts[map4.device] = [hits, total]
        else:  # device tensors accumulate on the device (no sync); Python ints on the host
            count[0] = count[0] + hits
            count[1] = count[1] + total

    def read_and_reset(self) -> float | None:
        """Fraction of counted blocks that chose map-to-4 since the last call (None if nothing was counted)."""
        hits = total = 0
        for h, t in self._counts.values():
            hits += int(h)
            total += int(t)
        self._counts.clear()
        return hits / total if total else None


MAP4_STATS = Map4Stats()
