"""Embedded training data: a small English corpus and a 2048-token BPE tokenizer shipped with the package.

Why: every recipe must train out of the box, with no download and no path outside the package. ``register()``
(called by the plugin's config module and launcher) adds the corpus to torchtitan's dataset registry under
``DATASET`` (``VALIDATION_DATASET`` for the held-out split, ``CODE_DATASET`` for the larger corpus of Python
source that the training-quality study trains on within one epoch); the tokenizer directory ``EMBEDDED_DIR`` is what the recipes pass as
``[model] hf_assets_path``. Provenance and license: ``embedded/PROVENANCE.md``; rebuild with
``scripts/build_embedded_data.py``.
"""

import gzip
import json
from pathlib import Path

from datasets import Dataset
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
DATASET = "titan_fp4six_text"
VALIDATION_DATASET = "titan_fp4six_text_validation"
CODE_DATASET = "titan_fp4six_code"


def load_documents(path: str | Path, split: str) -> Dataset:
    """The split's documents as a map-style dataset (so torchtitan's checkpointer resumes it by sample index)."""
    file = Path(path) / f"{split}.jsonl.gz"
    if not file.is_file():
        raise ValueError(f"training.dataset_path={str(path)!r} holds no {file.name}; leave dataset_path unset "
                         f"to use the embedded corpus in {EMBEDDED_DIR}")
    with gzip.open(file, "rt", encoding="utf-8") as f:
        return Dataset.from_dict({"text": [json.loads(line)["text"] for line in f]})


def _text(sample: dict) -> str:
    return sample["text"]


def register() -> None:
    """Add the embedded splits to torchtitan's registry (idempotent)."""
    for name, split in ((DATASET, "train"), (VALIDATION_DATASET, "validation"), (CODE_DATASET, "code")):
        DATASETS[name] = DatasetConfig(path=str(EMBEDDED_DIR), loader=lambda path, split=split: load_documents(path, split),
                                       sample_processor=_text)
