"""Capture GEMM operands (activations, weights, output gradients) from a short training run of a debug model.

Why: the quantization-error report must see the distributions four-over-six meets in training, not only
synthetic ones. The model comes from torchtitan's registry and trains unquantized (so the captured tensors are
what a quantizer would receive; bf16 autocast on CUDA like torchtitan's single-GPU AMP, FP32 on CPU) with
AdamW on the embedded corpus. Hooks copy the operands of the quantizable GEMMs at the chosen steps: inputs,
weights and output gradients of the decoder layers' Linears (router gates excluded: the recipes keep them in
bf16) and of the routed experts (their input tokens, w1/w2/w3 with one amax per expert, and the gradient of
their output). The experts' inner w2 input is not reachable by a module hook and is not captured.
"""

import contextlib
import copy
import sys
import time
from dataclasses import dataclass
from itertools import islice

import torch
from torch import nn

BLOCK = 16


@dataclass
class Sample:
    """A 2-D tensor to quantize. `group_rows` > 0: rows come in groups (experts) with one amax each."""

    source: str  # e.g. "gaussian", "activation", "weight", "gradient"
    name: str
    step: int
    x: torch.Tensor
    group_rows: int = 0


def _rows(x: torch.Tensor, max_rows: int) -> torch.Tensor | None:
    """(rows, cols) FP32 copy of the first max_rows rows (a multiple of 16), or None if not quantizable."""
    x = x.detach().reshape(-1, x.shape[-1])
    rows = min(x.shape[0], max_rows) // BLOCK * BLOCK
    if rows == 0 or x.shape[1] % BLOCK:
        return None
    return x[:rows].float().clone().cpu()


def build_model(name: str, flavor: str, seq_len: int, device: torch.device) -> nn.Module:
    """torchtitan model `name`/`flavor` with its own init; grouped GEMMs only on CUDA (CPU takes the loop)."""
    from torchtitan.config import JobConfig
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(name)
    args = copy.deepcopy(spec.model_args[flavor])
    job = JobConfig()
    job.training.seq_len = seq_len
    args.update_from_config(job)
    if getattr(args, "moe_enabled", True) and hasattr(args, "moe_args"):
        args.moe_args.use_grouped_mm = device.type == "cuda"
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def corpus_batches(batch: int, seq_len: int, vocab: int):
    """Endless (inputs, labels) batches of consecutive windows of the embedded training corpus."""
    from tokenizers import Tokenizer

    from titan_fp4six.integration.data import EMBEDDED_DIR, load_documents

    tokenizer = Tokenizer.from_file(str(EMBEDDED_DIR / "tokenizer.json"))
    need = batch * (seq_len + 1)
    buf: list[int] = []
    while True:
        for text in load_documents(EMBEDDED_DIR, "train")["text"]:
            buf.extend(i for i in tokenizer.encode(text).ids if i < vocab)
            while len(buf) >= need:
                chunk = torch.tensor(buf[:need]).view(batch, seq_len + 1)
                del buf[:need]
                yield chunk[:, :-1], chunk[:, 1:]


class _Recorder:
    """Forward hooks that copy operands (and hook the output's gradient) while `active` is set."""

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.active = False
        self.step = 0
        self.samples: list[Sample] = []

    def _add(self, source: str, name: str, x: torch.Tensor, group_rows: int = 0) -> None:
        x = _rows(x, self.max_rows) if not group_rows else x.detach().float().clone().cpu()
        if x is not None:
            self.samples.append(Sample(source, name, self.step, x, group_rows))

    def _grad_hook(self, name: str):
        def hook(grad):
            if self.active:
                self._add("gradient", name, grad)
        return hook

    def linear(self, name: str):
        def hook(module, args, output):
            if self.active:
                self._add("activation", name, args[0])
                self._add("weight", name, module.weight)
                output.register_hook(self._grad_hook(name))
        return hook

    def experts(self, name: str):
        def hook(module, args, output):
            if not self.active:
                return
            self._add("activation", name, args[0])
            for w in ("w1", "w2", "w3"):
                weight = getattr(module, w).detach()
                kept = max(2, self.max_rows // weight.shape[1])  # whole experts, each with its own amax
                self._add("weight", f"{name}.{w}", weight[:kept].reshape(-1, weight.shape[2]), weight.shape[1])
            output.register_hook(self._grad_hook(name))
        return hook


def attach(model: nn.Module, layers: list[str], recorder: _Recorder) -> None:
    """Hook the quantizable GEMM modules of the given decoder layers."""
    for layer in layers:
        block = model.layers[layer]
        for name, module in block.named_modules():
            fqn = f"layers.{layer}.{name}"
            if isinstance(module, nn.Linear) and "router" not in name.split("."):
                module.register_forward_hook(recorder.linear(fqn))
            elif name.endswith("experts") and not name.endswith("shared_experts") and hasattr(module, "w1"):
                module.register_forward_hook(recorder.experts(fqn))


def capture_training_tensors(name: str, flavor: str, *, steps: int, capture_steps: list[int], batch: int,
                             seq_len: int, max_rows: int, lr: float = 8e-4, seed: int = 0,
                             device: torch.device | None = None) -> tuple[list[Sample], list[float]]:
    """Train `steps` steps and return (captured samples, loss per step). Hooks the second and the last
    decoder layer (the first of DeepSeek-V3's debugmodel is dense)."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        from titan_fp4six.integration import cpu

        cpu.apply()  # torchtitan's router counts tokens with an integer histc, which has no CPU kernel
    torch.manual_seed(seed)
    model = build_model(name, flavor, seq_len, device)
    layer_ids = list(model.layers.keys())
    recorder = _Recorder(max_rows)
    attach(model, [layer_ids[1], layer_ids[-1]], recorder)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8, weight_decay=0.1)
    losses = []
    vocab = model.tok_embeddings.num_embeddings
    # on CUDA the operands are what torchtitan's single-GPU AMP feeds the GEMMs (bf16); the CPU run stays FP32
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    start = time.perf_counter()
    for step, (inputs, labels) in enumerate(islice(corpus_batches(batch, seq_len, vocab), steps), start=1):
        recorder.step, recorder.active = step, step in capture_steps
        with amp():
            logits = model(inputs.to(device))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.to(device).flatten())
        loss.backward()
        recorder.active = False
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"{name} step {step} loss {losses[-1]:.4f} ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return recorder.samples, losses
