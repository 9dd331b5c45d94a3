"""Functions run on N spawned processes joined in one gloo world, for tests of code that takes a process group."""

import socket

import torch.multiprocessing as mp


def run_ranks(target, world: int, *args, timeout: float = 240) -> list:
    """target(rank, port, *args, queue) in `world` spawned processes (each puts (rank, result) on the queue and
    joins the gloo world at tcp://127.0.0.1:port); returns the results by rank, after every process exited 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, port, *args, queue)) for rank in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, p.exitcode
    return [results[rank] for rank in range(world)]
