"""``python -m titan_fp4six.dry_run``: a recipe too large for this hardware, checked and sized without it.

    python -m titan_fp4six.dry_run --job.config_file RECIPE [--gpu-memory-gib 141] [--section.key value ...]
    python -m titan_fp4six.dry_run --rl --nproc N [--fp4-gemms] --job.config_file RL_RECIPE [...]

Both parse the recipe (the torchtitan CLI after the dry-run flags), build its model on the meta device and convert
it. Training (titan_fp4six/integration/dry_run.py): what is quantized, FLOPs per token, and the memory per GPU for
FSDP over 1 to 64 GPUs, with the fewest that fit. GRPO with --rl (titan_fp4six/rl/dry_run.py): the layout checks
on N ranks and the memory of each rank's trainer shard and rollout engine; exit 1 when a rank does not fit.
Estimates for planning, not measurements. Needs torchtitan 0.2.x.
"""

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m titan_fp4six.dry_run", description=__doc__.split("\n\n")[2],
                                usage="%(prog)s [--rl --nproc N [--fp4-gemms]] [--gpu-memory-gib GIB] "
                                      "--job.config_file RECIPE [--section.key value ...]")
    p.add_argument("--rl", action="store_true", help="a GRPO recipe on --nproc ranks: trainer and engine per rank")
    p.add_argument("--nproc", type=int, help="with --rl: ranks of the torchrun world (GPUs)")
    p.add_argument("--fp4-gemms", action="store_true",
                   help="with --rl: Blackwell's FP4 GEMMs, so the engine keeps no bf16 decode of its experts")
    p.add_argument("--gpu-memory-gib", type=float, default=141.0,
                   help="memory per GPU (H200: 141, H100/B200: 80/180)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ours, rest = parser.parse_known_args(argv)
    if not ours.gpu_memory_gib > 0:  # NaN too
        parser.error(f"--gpu-memory-gib {ours.gpu_memory_gib:g}: the memory per GPU must be > 0 GiB (H200: 141)")
    if not any(arg.split("=")[0] in ("--job.config_file", "--job.config-file") for arg in rest):
        parser.error("--job.config_file RECIPE.toml is required (without it torchtitan's default llama3 job would be "
                     "summarized), e.g. --job.config_file configs/qwen3_30b_a3b_nvfp4_four_over_six.toml")
    if ours.rl and (ours.nproc is None or ours.nproc < 1):
        parser.error(f"--rl needs --nproc N >= 1, the ranks of the torchrun world (got {ours.nproc})")
    if not ours.rl and (ours.nproc is not None or ours.fp4_gemms):
        parser.error("--nproc and --fp4-gemms size a GRPO layout: add --rl (a training recipe's dry run sizes "
                     "FSDP over 1 to 64 GPUs)")
    from titan_fp4six.integration.version import require

    require("0.2", f"python -m titan_fp4six.dry_run{' --rl' if ours.rl else ''}", "torchtitan 0.2.x for the dry runs")
    from titan_fp4six.integration import dry_run

    if not ours.rl:
        return dry_run.report(rest, ours.gpu_memory_gib)
    config, model_args, model = dry_run.build_and_convert(rest)
    if getattr(config, "rl", None) is None:
        parser.error('--rl: the recipe has no [rl] section: [job] custom_config_module = "titan_fp4six.rl.job_config"')
    from titan_fp4six.rl import dry_run as rl_dry_run

    return rl_dry_run.report(config, model_args, model, ours.nproc, ours.gpu_memory_gib, ours.fp4_gemms)


if __name__ == "__main__":
    sys.exit(main())
