"""Under pytest-xdist, each worker gets an equal share of the CPU cores for torch's intra-op threads, and so do the
processes the tests start (OMP_NUM_THREADS is inherited): N workers of all-core torch would oversubscribe the
machine. A share is set before any test runs, so a test's in-process and subprocess runs use the same count."""

import os

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _threads = str(max(1, len(os.sched_getaffinity(0)) // _workers))
    os.environ["OMP_NUM_THREADS"] = _threads
    import torch

    torch.set_num_threads(int(_threads))
