"""Run autograd's backward on the training loop's own thread instead of the engine's per-GPU worker thread.

By default a CUDA backward is handed to a worker thread of the autograd engine. The four-over-six ops'
backward bodies are Python (autograd.Function), and on the H200 host they ran 1.8-2.7x slower on that
thread than on the calling one (1024^3 dense backward: 182 vs 66 us high_precision, 767 vs 416 us
quantized), plus ~100 us of thread hand-off per backward call. torchtitan drives one GPU per process, so the
worker thread buys no parallelism; the bytes computed are the same either way (docs/performance.md).
"""

import torch


def run_backward_on_calling_thread() -> None:
    """torch.autograd.set_multithreading_enabled(False) for the calling thread (the setting is thread-local:
    call it from the thread that runs the training loop; `torch.autograd.set_multithreading_enabled(True)`
    undoes it)."""
    torch.autograd.set_multithreading_enabled(False)
