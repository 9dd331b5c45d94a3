"""Map-to-4 statistics: which fraction of 1x16 blocks the forward quantizations stored as map-to-4.

The GEMM ops' forward quantizers add their counts to the process-wide MAP4_STATS from inside their op bodies
(compile-opaque custom ops under torch.compile), on the device and without a host sync, while `enabled` (the
integration turns it on for the steps torchtitan logs): the Triton quantizer adds (map-to-4 blocks, blocks) to
a running count per device (numerics.formats.map4_count_buffer) in the same pass that quantizes (no mask, no
reduction launch; the reference adds map4_counts of its mask). The training loop calls `read_and_reset()` when
it logs (one sync).
Blocks of rows that are not tokens (past offs[-1] in grouped GEMMs) are not counted. A forward that runs
twice (activation checkpointing recomputes it) counts twice, in numerator and denominator alike.
"""

import contextlib

import torch

from ..numerics.formats import map4_count_buffer, map4_total


class Map4Stats:
    """Running map-to-4 block counts: one count buffer per device."""

    def __init__(self):
        self.enabled = True
        self._counts: dict[torch.device, torch.Tensor] = {}

    def counts(self, device: torch.device) -> torch.Tensor | bool:
        """The quantizers' `map4` argument: the device's count buffer while enabled, else False (no counting)."""
        if not self.enabled:
            return False
        counts = self._counts.get(device)
        if counts is None:
            counts = self._counts[device] = map4_count_buffer(device)
        return counts

    @contextlib.contextmanager
    def paused(self):
        """No counting inside: for GEMMs run beside training (fidelity metrics) that must not enter its fraction."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def read_and_reset(self) -> float | None:
        """Fraction of counted blocks that chose map-to-4 since the last call (None if nothing was counted)."""
        hits = total = 0
        for counts in self._counts.values():
            device_hits, device_total = map4_total(counts).tolist()
            hits, total = hits + device_hits, total + device_total
        self._counts.clear()
        return hits / total if total else None


MAP4_STATS = Map4Stats()
