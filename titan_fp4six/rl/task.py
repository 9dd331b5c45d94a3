"""A verifiable task built from the embedded tokenizer's vocabulary: copy a short sequence of symbols.

Prompt: <bos> s_1 ... s_n "=" with each s_i drawn from a small alphabet of single-character tokens; the
correct response is s_1 ... s_n then <eos>. Reward in [0, 1]: the fraction of the n positions that hold the
right symbol. No partial credit for emitting "any symbol": that shaping term drives a fresh policy to put all
its mass on one symbol for every prompt (its softmax gradient favours the likelier symbol and copying then
never gets sampled); see docs/rl.md.
"""

import random
from dataclasses import dataclass
from pathlib import Path

from ..integration.hf_config import tokenizer_ids


@dataclass(frozen=True)
class Vocabulary:
    """Token ids the task needs, read from a tokenizer.json (Hugging Face tokenizers format)."""

    symbols: tuple[int, ...]
    separator: int
    bos: int
    eos: int

    @classmethod
    def from_tokenizer(cls, directory: str | Path, alphabet: str) -> "Vocabulary":
        vocab, bos, eos = tokenizer_ids(directory)
        missing = [c for c in alphabet + "=" if c not in vocab]
        if missing or len(set(alphabet)) != len(alphabet) or "=" in alphabet:
            raise ValueError(f"rl.alphabet={alphabet!r}: needs distinct single-character tokens of "
                             f"{Path(directory) / 'tokenizer.json'} other than '='; missing: {missing}")
        return cls(tuple(vocab[c] for c in alphabet), vocab["="], bos, eos)


@dataclass(frozen=True)
class CopyTask:
    vocab: Vocabulary
    length: int

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"rl.task_length={self.length}; it must be >= 1")

    def prompts(self, count: int, rng: random.Random) -> list[list[int]]:
        return [[self.vocab.bos, *(rng.choice(self.vocab.symbols) for _ in range(self.length)), self.vocab.separator]
                for _ in range(count)]

    def max_new_tokens(self) -> int:
        return self.length + 1  # the copy and <eos>

    def max_positions(self) -> int:
        """RoPE positions a rollout and its re-scoring use: the prompt (<bos>, symbols, "=") and the response."""
        return self.length + 2 + self.max_new_tokens()

    def reward(self, prompt: list[int], response: list[int]) -> float:
        target = prompt[1:1 + self.length]
        got = response[:self.length]
        score = sum(tok == want for tok, want in zip(got, target))
        return score / self.length
