"""``python -m titan_fp4six.rl --job.config_file configs/rl_grpo_....toml``: GRPO on torchtitan (CPU without a GPU)."""


def main() -> None:
    from ..integration.version import require

    require("0.2", "python -m titan_fp4six.rl", "torchtitan 0.2.x, or under 0.3 torchtitan's RL experiment with "
            "--module titan_fp4six.integration.tt03.rl (docs/rl.md)")
    from ..train import prepare_process

    prepare_process()
    from torchtitan.train import main as torchtitan_main

    from .trainer import RLTrainer

    torchtitan_main(RLTrainer)


if __name__ == "__main__":
    main()
