"""Rebuild the embedded corpus and tokenizer shipped in titan_fp4six/integration/embedded/.

Why: the recipes must train with no download, so the package ships a small English corpus and a byte-level
BPE tokenizer trained on it. The text is prose taken from the CPython standard library (module, class and
function docstrings) and the Python language reference topics in ``pydoc_data.topics``, both under the PSF
License. A second, larger corpus (``code.jsonl.gz``: the standard library's Python source files whole, about 4.4M
tokens) serves the training-quality study (docs/fidelity.md), whose runs must stay within one epoch: the prose
corpus (377k tokens) repeats every ~90 steps of 8 x 512 tokens, and memorizing it makes runs of different
seeds drift apart. Output is deterministic for a given CPython version; the shipped files were built with the
version named in embedded/PROVENANCE.md. Run: ``python scripts/build_embedded_data.py``.
"""

import argparse
import ast
import gzip
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parents[1] / "titan_fp4six" / "integration" / "embedded"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VOCAB_SIZE = 2048  # the DeepSeek-V3 and Qwen3 debug models' vocabulary
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}


def _prose(docstring: str) -> list[str]:
    """Paragraphs of a docstring that read as sentences (mostly letters, ending in punctuation)."""
    out = []
    for para in re.split(r"\n\s*\n", docstring):
        text = " ".join(para.split())
        if len(text) >= 80 and text[-1] in ".?!" and sum(c.isalpha() or c == " " for c in text) >= 0.9 * len(text):
            out.append(text)
    return out


def _stdlib_sources() -> list[str]:
    """The text of every standard-library Python file outside SKIP_DIRS that reads as UTF-8, in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts


def stdlib_documents() -> list[str]:
    """One document per stdlib module: its docstring prose paragraphs in source order."""
    docs = []
    for text in _stdlib_sources():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        paras = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                paras += _prose(ast.get_docstring(node) or "")
        if sum(map(len, paras)) >= 300:
            docs.append("\n\n".join(dict.fromkeys(paras)))
    return docs


def code_documents() -> list[str]:
    """The standard library's Python source files, whole, in a fixed shuffled order (same skipped folders)."""
    docs = _stdlib_sources()
    random.Random(0).shuffle(docs)
    return docs


def _write_jsonl(path: Path, docs: list[str]) -> None:
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())


def reference_documents() -> list[str]:
    """The Python language reference topics that ``help()`` shows, one document each."""
    from pydoc_data.topics import topics

    return ["\n".join(line.rstrip() for line in topics[k].strip().splitlines()) for k in sorted(topics)]


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    docs = reference_documents() + stdlib_documents()
    random.Random(0).shuffle(docs)
    val = docs[::50]
    train = [d for i, d in enumerate(docs) if i % 50]
    args.out.mkdir(parents=True, exist_ok=True)
    code = code_documents()
    for name, split in (("train", train), ("validation", val), ("code", code)):
        _write_jsonl(args.out / f"{name}.jsonl.gz", split)
    tok = train_tokenizer(train)
    tok.save(str(args.out / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True,
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"python {sys.version.split()[0]}: {len(train)} train / {len(val)} validation documents, "
          f"{sum(map(len, train))} / {sum(map(len, val))} characters, vocab {tok.get_vocab_size()}; "
          f"code: {len(code)} files, {sum(map(len, code))} characters")


if __name__ == "__main__":
    main()
