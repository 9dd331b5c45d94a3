"""The RL tasks: what a step's prompts are and how a response is rewarded.

A task gives `examples(count, rng)` (prompt token ids and what the reward compares a response with),
`reward(example, response ids)`, `max_new_tokens()` and `max_positions()`. Two implementations:
- `DatasetTask`: prompts from a JSON-lines file the user names (`[rl] dataset`, one {"prompt": ..., "answer": ...}
  object a line), tokenized with the recipe's tokenizer after its <bos>; the reward is a user function named by
  import path (`[rl] reward = "package.module:function"`), called as function(prompt, response, answer) on text.
- `CopyTask` (the default): copy a short sequence of symbols of the embedded tokenizer's vocabulary.

Copy task prompt: <bos> s_1 ... s_n "=" with each s_i drawn from a small alphabet of single-character tokens; the
correct response is s_1 ... s_n then <eos>. Reward in [0, 1]: the fraction of the n positions that hold the
right symbol. No partial credit for emitting "any symbol": that shaping term drives a fresh policy to put all
its mass on one symbol for every prompt (its softmax gradient favours the likelier symbol and copying then
never gets sampled); see docs/rl.md.
"""

import importlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..integration.hf_config import tokenizer_ids


@dataclass(frozen=True)
class Example:
    """A prompt's token ids and what its reward compares a response with."""

    tokens: list[int]
    answer: object


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
        if bos is None:
            raise ValueError(f"the copy task's prompts start with <bos>, but "
                             f"{Path(directory) / 'tokenizer_config.json'} has bos_token null: use a dataset task "
                             "(rl.dataset, rl.reward) with this tokenizer")
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

    def examples(self, count: int, rng: random.Random) -> list[Example]:
        prompts = [[self.vocab.bos, *(rng.choice(self.vocab.symbols) for _ in range(self.length)),
                    self.vocab.separator] for _ in range(count)]
        return [Example(p, p[1:1 + self.length]) for p in prompts]

    @property
    def eos(self) -> int:
        return self.vocab.eos

    def max_new_tokens(self) -> int:
        return self.length + 1  # the copy and <eos>

    def max_positions(self) -> int:
        """RoPE positions a rollout and its re-scoring use: the prompt (<bos>, symbols, "=") and the response."""
        return self.length + 2 + self.max_new_tokens()

    def reward(self, example: Example, response: list[int]) -> float:
        got = response[:self.length]
        score = sum(tok == want for tok, want in zip(got, example.answer))
        return score / self.length


def reward_function(path: str) -> Callable[[str, str, str], float]:
    """The function `path` ("package.module:function") names, or an error naming the part that is missing."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"rl.reward={path!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"rl.reward={path!r}: module {module_name!r} is not importable ({e})") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"rl.reward={path!r}: module {module_name!r} has no function {name!r}")
    return fn


def read_dataset(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, answer) of every line of a JSON-lines file; errors name the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"rl.dataset={str(path)!r}: no such file (JSON lines of {{\"prompt\": ..., \"answer\": ...}})")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"rl.dataset={str(path)!r} line {n}: not JSON ({e})") from e
        for field in ("prompt", "answer"):
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise ValueError(f"rl.dataset={str(path)!r} line {n}: needs a string field {field!r}")
        rows.append((row["prompt"], row["answer"]))
    if not rows:
        raise ValueError(f"rl.dataset={str(path)!r} holds no examples")
    return rows


class DatasetTask:
    """Prompts drawn (with replacement) from a JSON-lines dataset, rewarded by a user function on text."""

    def __init__(self, dataset: str | Path, reward: str, tokenizer_dir: str | Path, max_new_tokens: int):
        from tokenizers import Tokenizer

        self.rows = read_dataset(dataset)
        self.fn = reward_function(reward)
        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        _, bos, eos = tokenizer_ids(tokenizer_dir)
        self.eos, self.new_tokens = eos, max_new_tokens
        first = [] if bos is None else [bos]  # Qwen3's tokenizer has no bos
        self.prompts = [[*first, *self.tokenizer.encode(p, add_special_tokens=False).ids] for p, _ in self.rows]
        empty = next((n for n, p in enumerate(self.prompts, 1) if not p), None)
        if empty is not None:
            raise ValueError(f"rl.dataset={str(dataset)!r}: example {empty}'s prompt is no tokens (empty, and "
                             "the tokenizer adds no <bos>): every prompt needs at least one token")

    def examples(self, count: int, rng: random.Random) -> list[Example]:
        picks = [rng.randrange(len(self.rows)) for _ in range(count)]
        return [Example(self.prompts[i], i) for i in picks]

    def reward(self, example: Example, response: list[int]) -> float:
        prompt, answer = self.rows[example.answer]
        text = self.tokenizer.decode([t for t in response if t != self.eos])
        return float(self.fn(prompt, text, answer))

    def max_new_tokens(self) -> int:
        return self.new_tokens

    def max_positions(self) -> int:
        return max(map(len, self.prompts)) + self.new_tokens
