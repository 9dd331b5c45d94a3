"""Seeds of the quantized backward's stochastic rounding (gradient_rounding='stochastic', docs/ops.md).

Every stochastically rounded quantization (the gradient dy for dgrad, and its columnwise form for wgrad) takes
its own Philox seed from the process-wide GRADIENT_ROUNDING: a hash of (base seed, step, rank, call index),
where the call index counts the stochastic quantizations since the last `set`. The training loop calls
`set_rounding_seed(seed, step, rank)` once per step (the torchtitan integration does, from debug.seed and the
step), so a step's seeds depend only on those values and on the order of the backward's quantizations, which is
fixed by the model: runs with the same seed and call order round identically, whatever torch's RNG does. The op
bodies read it at run time (they run eagerly, also inside a compiled graph, where they are opaque custom ops),
so torch.compile needs no seed argument. Single-threaded: one backward at a time per process.
"""

from ..numerics.formats import SEED_LIMIT

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

    def seed_for(self, spec) -> int | None:
        """The quantization seed an operand spec needs: the next one when it rounds stochastically, else None
        (no seed drawn)."""
        return self.next() if spec.rounding == "stochastic" else None


GRADIENT_ROUNDING = GradientRoundingSeed()


def set_rounding_seed(seed: int, step: int, rank: int = 0) -> None:
    """GRADIENT_ROUNDING.set: the seeds of the stochastic gradient rounding for the step about to run."""
    GRADIENT_ROUNDING.set(seed, step, rank)
