"""Philox4x32-10 in PyTorch integer arithmetic: the random bits of stochastic rounding (docs/numerics.md,
section 12), equal bit for bit to Triton's `tl.randint4x(seed, counter)`, so the reference and the Triton
quantizer round with the same bits.

The generator, as Triton 3.x defines it (triton/language/random.py): the key is the 64-bit seed split into
(k0, k1) = (low 32 bits, high 32 bits); the counter is (c0, c1, c2, c3) = (the counter's low 32 bits, its high
32 bits, 0, 0); ten rounds of

    c0, c1, c2, c3 = hi(B * c2) ^ c1 ^ k0, lo(B * c2), hi(A * c0) ^ c3 ^ k1, lo(A * c0)
    k0, k1 = k0 + KEY_A, k1 + KEY_B                                   (mod 2^32)

with A = 0xD2511F53, B = 0xCD9E8D57, KEY_A = 0x9E3779B9, KEY_B = 0xBB67AE85, hi/lo the upper/lower 32 bits of
the 64-bit product; randint4x returns the final (c0, c1, c2, c3). uint32 values live in int64 tensors, masked
to 32 bits; the 32 x 32-bit products are formed from 16-bit halves so no intermediate leaves int64's range.
Only integer operations: the same bits on every device.
"""

import math

import torch

from .formats import PHILOX_KEYS, PHILOX_MULTIPLIERS, PHILOX_ROUNDS
from .validation import check_seed

MASK32 = 0xFFFFFFFF
KEY_A, KEY_B = PHILOX_KEYS
ROUND_A, ROUND_B = PHILOX_MULTIPLIERS
ROUNDS = PHILOX_ROUNDS
PER_COUNTER = 8
"""Elements served by one Philox evaluation: four 32-bit words, 16 bits per element."""


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper, lower) 32 bits of the 64-bit product a * b, for a constant a < 2^32 and b in [0, 2^32)."""
    p_low = (b & 0xFFFF) * a  # < 2^48
    p_high = (b >> 16) * a  # < 2^48; a * b = p_high * 2^16 + p_low
    hi = (p_high + (p_low >> 16)) >> 16
    lo = (((p_high & 0xFFFF) << 16) + p_low) & MASK32
    return hi, lo


def philox4x32(seed: int, counter: torch.Tensor) -> torch.Tensor:
    """The four words tl.randint4x(seed, counter) gives for each counter (integer tensor, values in [0, 2^63)),
    stacked on a new last dimension: an int64 tensor (*counter.shape, 4) with values in [0, 2^32), on
    counter's device."""
    check_seed(seed)
    counter = counter.to(torch.int64)
    c0, c1 = counter & MASK32, (counter >> 32) & MASK32
    c2 = c3 = torch.zeros_like(counter)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(ROUNDS):
        hi_b, lo_b = _mul_hi_lo(ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return torch.stack((c0, c1, c2, c3), dim=-1)


def stochastic_bits(seed: int, shape, device=None) -> torch.Tensor:
    """The 16 random bits of each element of a matrix of the given shape, by its flat (row-major) index n:
    r16(n) = (W[(n mod 8) div 2] >> (16 * (n mod 2))) & 0xFFFF with (W0, W1, W2, W3) = philox4x32(seed, n div 8).
    An int64 tensor of that shape with values in [0, 2^16): one Philox evaluation per 8 elements."""
    numel = math.prod(shape)
    words = philox4x32(seed, torch.arange(-(-numel // PER_COUNTER), dtype=torch.int64, device=device))
    halves = torch.stack((words & 0xFFFF, words >> 16), dim=-1)  # (counters, word, half): element 8k + 2w + h
    return halves.reshape(-1)[:numel].reshape(shape)
