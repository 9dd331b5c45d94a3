"""scripts.parity_batches: every DP rank trains on its rows of the one-rank global batch."""

import torch
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from torchtitan.config.manager import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec

from scripts import parity_batches
from titan_fp4six.integration.data import DATASET, EMBEDDED_DIR, register


class _Numbers:
    """A stand-in stream: sample i is ({"input": [i]}, [i]) with a resumable position."""

    def __init__(self, n):
        self.n, self.pos = n, 0

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            yield {"input": torch.tensor([self.pos - 1])}, torch.tensor([self.pos - 1])

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def _ids(rows):
    return [int(x["input"]) for x, _ in rows]


def test_ranks_get_their_rows_of_each_global_batch():
    local, world = 3, 2
    per_rank = [_ids(parity_batches.GlobalBatchRows(_Numbers(24), local, r, world)) for r in range(world)]
    assert per_rank[0] == [0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20]
    for step in range(4):  # global batch `step` = rank 0's rows then rank 1's = what one rank with 6 rows reads
        together = sum((ids[step * local:(step + 1) * local] for ids in per_rank), [])
        assert together == list(range(step * 6, step * 6 + 6))


def test_state_after_a_batch_is_the_next_global_batch():
    rows = parity_batches.GlobalBatchRows(_Numbers(24), 2, 1, 2)
    it = iter(rows)
    assert [int(next(it)[0]["input"]) for _ in range(2)] == [2, 3]
    state = rows.state_dict()
    resumed = parity_batches.GlobalBatchRows(_Numbers(24), 2, 1, 2)
    resumed.load_state_dict(state)
    assert _ids(resumed)[:2] == [6, 7]


def _job(local_batch):
    return ConfigManager().parse_args(["--training.dataset", DATASET, "--training.local_batch_size",
                                       str(local_batch), "--training.seq_len", "32"])


def test_registered_for_the_moe_models_and_batches_the_embedded_corpus():
    for name in ("deepseek_v3", "qwen3"):
        assert get_train_spec(name).build_dataloader_fn is parity_batches.build_global_batch_dataloader
    register()  # the embedded corpus, as the plugin's config module and launcher register it
    tokenizer = HuggingFaceTokenizer(str(EMBEDDED_DIR))
    one = next(iter(parity_batches.build_global_batch_dataloader(1, 0, tokenizer, _job(4))))[0]["input"]
    halves = [next(iter(parity_batches.build_global_batch_dataloader(2, r, tokenizer, _job(2))))[0]["input"]
              for r in (0, 1)]
    assert one.shape == (4, 32) and torch.equal(torch.cat(halves), one)
