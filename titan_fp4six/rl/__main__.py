"""``python -m titan_fp4six.rl --job.config_file configs/rl_grpo_....toml``: GRPO on torchtitan (CPU without a GPU)."""


def main(argv: list[str] | None = None) -> int:
    """GRPO training; `argv` the trainer's arguments (default the command line's). 0 when training ends."""
    from ..train import use_argv

    use_argv(argv)
    from ..integration.version import require

    require("0.2", "python -m titan_fp4six.rl", "torchtitan 0.2.x, or under 0.3 torchtitan's RL experiment with "
            "--module titan_fp4six.integration.tt03.rl (docs/rl.md)")
    from ..train import prepare_process

    prepare_process()
    from torchtitan.train import main as torchtitan_main

    from .trainer import RLTrainer

    torchtitan_main(RLTrainer)
    return 0


if __name__ == "__main__":
    from ..train import exit_after_run

    exit_after_run(main())
