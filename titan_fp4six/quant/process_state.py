"""The process-wide state of the quantized GEMMs: the stochastic rounding's seeds and the map-to-4 counts.

GRADIENT_ROUNDING: every stochastically rounded quantization (the gradient dy for dgrad, and its columnwise form
for wgrad, gradient_rounding='stochastic', docs/ops.md) takes its own Philox seed from it: a hash of (base seed,
step, rank, call index), where the call index counts the stochastic quantizations since the last `set`. The
training loop calls `set_rounding_seed(seed, step, rank)` once per step (the torchtitan integration does, from
debug.seed and the step), so a step's seeds depend only on those values and on the order of the backward's
quantizations, which is fixed by the model: runs with the same seed and call order round identically, whatever
torch's RNG does. The op bodies read it at run time (they run eagerly, also inside a compiled graph, where they
are opaque custom ops), so torch.compile needs no seed argument. Single-threaded: one backward at a time per
process.

MAP4_STATS: which fraction of 1x16 blocks the forward quantizations stored as map-to-4. The forward's role
quantizers add their counts from inside the op bodies, on the device and without a host sync, while `enabled`
(the integration turns it on for the steps torchtitan logs): the Triton quantizer adds (map-to-4 blocks,
blocks) to a running count per device (map4_count_buffer) in the same pass that quantizes (no mask, no
reduction launch; the reference adds map4_counts of its mask). The training loop calls `read_and_reset()` when
it logs (one sync). Blocks of rows that are not tokens (past offs[-1] in grouped GEMMs) are not counted. A
forward that runs twice (activation checkpointing recomputes it) counts twice, in numerator and denominator
alike.
"""

import contextlib

import torch

from ..numerics.formats import MAP4_COUNT_ROWS, MAP4_COUNT_WIDTH, SEED_LIMIT


_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """The splitmix64 finalizer of z + golden-ratio increment (a bijection of 64-bit integers)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def derive_seed(seed: int, step: int, rank: int, call: int) -> int:
    """The Philox seed (in [0, 2^63)) of call `call` of step `step` on rank `rank` for base seed `seed`."""
    h = _mix(seed & _M64)
    for value in (step, rank, call):
        h = _mix(h ^ (value & _M64))
    return h % SEED_LIMIT


class GradientRoundingSeed:
    """(base seed, step, rank) and the count of seeds handed out since they were set."""

    def __init__(self):
        self.set(0, 0)

    def set(self, seed: int, step: int, rank: int = 0) -> None:
        """Start a step: its seeds come from (seed, step, rank) and the call index, which restarts at 0. Each is
        an int in [0, 2^64): the hash reads 64 bits, so anything else (a float, a string, a bigger int) would
        silently alias another seed."""
        for name, value in (("seed", seed), ("step", step), ("rank", rank)):
            if type(value) is not int or not 0 <= value <= _M64:
                raise ValueError(f"set_rounding_seed: {name}={value!r} ({type(value).__name__}); it must be an int "
                                 f"in [0, 2**64)")
        self.seed, self.step, self.rank, self.calls = seed, step, rank, 0

    def next(self) -> int:
        """The seed of the next stochastically rounded quantization."""
        seed = derive_seed(self.seed, self.step, self.rank, self.calls)
        self.calls += 1
        return seed


GRADIENT_ROUNDING = GradientRoundingSeed()


def set_rounding_seed(seed: int, step: int, rank: int = 0) -> None:
    """GRADIENT_ROUNDING.set: the seeds of the stochastic gradient rounding for the step about to run."""
    GRADIENT_ROUNDING.set(seed, step, rank)



def map4_count_buffer(device) -> torch.Tensor:
    """A running map-to-4 count, zeros: int64 (MAP4_COUNT_ROWS, MAP4_COUNT_WIDTH), each row (map-to-4 blocks,
    blocks) padded to one 128-byte line. A quantizer adds its counts to any row's first two columns (the
    kernel's programs spread their atomic adds over the rows, so they do not queue on one address; the
    reference adds to row 0); map4_total sums the rows."""
    return torch.zeros(MAP4_COUNT_ROWS, MAP4_COUNT_WIDTH, dtype=torch.int64, device=device)


def map4_total(buffer: torch.Tensor) -> torch.Tensor:
    """(map-to-4 blocks, blocks) int64 (2,) counted into a map4_count_buffer."""
    return buffer[:, :2].sum(dim=0)




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
