"""``python -m titan_fp4six.train``: torchtitan.train with the titan_fp4six plugin, on the CPU when there is no GPU.

Same CLI as ``torchtitan.train`` (``--job.config_file recipe.toml --section.key value``), runnable under torchrun
or as a single process (the rendezvous variables torchrun would set are filled in for one rank).
"""

import os
import socket

import torch


def _single_process_env() -> None:
    """Let a plain ``python -m`` run act as rank 0 of 1, as ``torchrun --nproc_per_node=1`` would."""
    if "LOCAL_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def main() -> None:
    if not torch.cuda.is_available():
        from titan_fp4six.integration import cpu

        cpu.apply()
    _single_process_env()
    from titan_fp4six.integration import data

    data.register()  # the embedded corpus, also for recipes without the plugin's config module
    from torchtitan.train import Trainer
    from torchtitan.train import main as torchtitan_main

    torchtitan_main(Trainer)


if __name__ == "__main__":
    main()
