"""``python -m titan_fp4six.rl --job.config_file configs/rl_grpo_....toml``: GRPO on torchtitan (CPU without a GPU)."""

import torch


def main() -> None:
    from ..integration.allocator import expandable_segments_by_default

    expandable_segments_by_default()  # as titan_fp4six.train
    if not torch.cuda.is_available():
        from ..integration import cpu

        cpu.apply()
    from ..train import _single_process_env

    _single_process_env()
    from ..integration.backward_thread import run_backward_on_calling_thread

    run_backward_on_calling_thread()  # as titan_fp4six.train: the bf16 twin shares the setting
    from torchtitan.train import main as torchtitan_main

    from .trainer import RLTrainer

    torchtitan_main(RLTrainer)


if __name__ == "__main__":
    main()
