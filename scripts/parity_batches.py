"""Same global batch at any data-parallel degree, for 1-GPU vs N-GPU parity runs.

Why: torchtitan's text dataloader gives each data-parallel rank its own contiguous shard of the documents, so a
run on 2 ranks trains on different tokens than a run on 1 rank, and their losses can only be compared loosely.
With `--experimental.custom_import scripts.parity_batches`, every rank instead reads the one-rank token
stream, cuts it into global batches of `local_batch_size * dp_degree` sequences and keeps its own rows: rank r of
N gets rows [r*B, (r+1)*B) of the batch a single rank with local_batch_size = N*B would see. The losses of the
two runs then differ only by what the parallelism itself changes (reduction order, per-rank amaxes).
Opt-in and for parity checks only: importing the module swaps the dataloader of the models in `MODELS`. A lab tool,
not the package's: torchtitan imports it by name (importlib.import_module), so the training runs from the
repository root, where `scripts` is a package (`python -m scripts.runs parity` launches it there).
"""

import dataclasses
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

MODELS = ("llama3", "llama4", "deepseek_v3", "qwen3")


class GlobalBatchRows(IterableDataset, Stateful):
    """Rank `dp_rank`'s rows of each global batch of the single-rank stream `stream`."""

    def __init__(self, stream: HuggingFaceTextDataset, local_batch: int, dp_rank: int, dp_world_size: int):
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_world_size={dp_world_size})")
        self.stream, self.local_batch, self.dp_rank, self.dp_world_size = stream, local_batch, dp_rank, dp_world_size

    def __iter__(self):
        first, last = self.dp_rank * self.local_batch, (self.dp_rank + 1) * self.local_batch
        position = 0
        for sample in self.stream:  # the whole global batch is read before its last row is handed out, so
            if first <= position < last:  # the stream's state after a batch is a global-batch boundary
                yield sample
            position = (position + 1) % (self.local_batch * self.dp_world_size)

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stream.load_state_dict(state_dict)


def build_global_batch_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config,
                                  infinite: bool = True) -> ParallelAwareDataloader:
    """Drop-in for torchtitan's `build_text_dataloader` that slices one global batch across the DP ranks."""
    training = job_config.training
    stream = HuggingFaceTextDataset(dataset_name=training.dataset, dataset_path=training.dataset_path,
                                    tokenizer=tokenizer, seq_len=training.seq_len, dp_rank=0, dp_world_size=1,
                                    infinite=infinite)
    rows = GlobalBatchRows(stream, training.local_batch_size, dp_rank, dp_world_size)
    kwargs = {**dataclasses.asdict(training.dataloader), "batch_size": training.local_batch_size}
    return ParallelAwareDataloader(rows, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)


def register() -> None:
    """Give each model of MODELS the global-batch dataloader (idempotent)."""
    for name in MODELS:
        spec = get_train_spec(name)
        if spec is get_train_spec(name):  # a user-registered spec (built-in ones are rebuilt on every call)
            spec.build_dataloader_fn = build_global_batch_dataloader
        else:
            register_train_spec(name, dataclasses.replace(spec, build_dataloader_fn=build_global_batch_dataloader))


register()
