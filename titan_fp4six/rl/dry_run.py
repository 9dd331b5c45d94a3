"""Dry run of a GRPO recipe on N ranks without its hardware: `python -m titan_fp4six.dry_run --rl --nproc N
[--gpu-memory-gib 141] [--fp4-gemms] --job.config_file RECIPE [--section.key value ...]` (titan_fp4six/dry_run.py).

It parses the recipe, refuses a layout the trainer cannot run on N ranks (check_layout: FSDP2 and EP degrees,
experts against EP, whole prompt groups per rank), builds and converts the model on the meta device, and prints
the memory each rank needs: the trainer's shard (integration/dry_run.py's estimate, re-scoring this rank's
rollouts), the KL reference's shard, and the whole-model rollout engine every rank holds (dense weights in the
forward's dtype; the converted experts packed as the weight sync sends them, plus their bf16 decode where the
GEMMs are emulated; the KV cache: [rl] engine_kv_cache_gib, or this rank's rollouts whole). Fails (exit 1) when
a rank needs more than 90% of --gpu-memory-gib. An estimate for planning, not a measurement.
"""

from titan_fp4six.integration.version import require

# before the torchtitan 0.2 imports below
require("0.2", "python -m titan_fp4six.dry_run --rl", "torchtitan 0.2.x for this dry run")

import os
import sys

from ..integration.dry_run import GIB, estimate_memory, summarize
from .trainer import check_rl_job, engine_dtype
from .vllm_generator import kv_cache_bytes

PACKED_BYTES = 0.5 + 1 / 16
"""Bytes per expert weight element the engine holds packed: a 4-bit code and an E4M3 scale per 16."""


def engine_memory(s, config, model_args, nproc: int, fp4_gemms: bool, positions: int) -> dict[str, float]:
    """The rollout engine's bytes on one rank: whole dense weights, packed experts (+ decode), KV cache."""
    dtype = engine_dtype(config, nproc)
    experts = sum(n for fqn, (n, _) in s.quantized.items() if fqn.endswith("experts"))
    cfg = config.rl
    seqs = cfg.prompts_per_step * cfg.group_size // nproc
    kv = cfg.engine_kv_cache_gib * GIB or kv_cache_bytes(model_args, seqs, positions, dtype)
    parts = {"engine dense weights": (s.total_params - experts) * dtype.itemsize,
             "engine packed experts": experts * PACKED_BYTES}
    if not fp4_gemms:
        parts["engine experts' bf16 decode (emulated GEMMs)"] = experts * 2
    parts["engine KV cache"] = kv
    return parts


def report(config, model_args, model, nproc: int, gpu_memory_gib: float, fp4_gemms: bool) -> int:
    """The layout checks and per-rank memory of a built and converted GRPO recipe (integration/dry_run.py's
    build_and_convert) on `nproc` ranks; 1 (the reason on stderr) when a rank needs more than 90% of the memory."""
    os.environ["WORLD_SIZE"] = str(nproc)  # what torchrun would set: check_rl_job checks the layout on it
    task = check_rl_job(config, engine=False)
    positions = task.max_positions()
    s = summarize(model, model_args, config.training.seq_len)
    cfg = config.rl
    seqs = cfg.prompts_per_step * cfg.group_size // nproc
    trainer = estimate_memory(s, config, model_args, nproc, tokens=seqs * positions)
    if cfg.kl_coef > 0:
        trainer["KL reference (fp32, sharded)"] = 4 * s.total_params / nproc
    engine = engine_memory(s, config, model_args, nproc, fp4_gemms, positions)
    print(f"recipe {config.job.config_file}: {config.model.name} {config.model.flavor} on {nproc} ranks "
          f"(FSDP2 {config.parallelism.data_parallel_shard_degree}, EP {config.parallelism.expert_parallel_degree}); "
          f"{cfg.generator} engine per rank; {seqs} rollouts of <= {positions} positions per rank")
    for title, parts in (("trainer", trainer), ("engine", engine)):
        print(f"{title}: {sum(parts.values()) / GIB:.1f} GiB")
        for key, value in parts.items():
            print(f"  {key}: {value / GIB:.2f} GiB")
    total = (sum(trainer.values()) + sum(engine.values())) / GIB
    print(f"per rank: {total:.1f} GiB of {gpu_memory_gib:g} GiB")
    if total > 0.9 * gpu_memory_gib:
        print(f"rl dry run: {nproc} ranks need {total:.1f} GiB each, more than 90% of --gpu-memory-gib "
              f"{gpu_memory_gib:g}: use more ranks (torchrun --nproc_per_node / nodes), Blackwell's FP4 "
              "GEMMs (no engine decode), or fewer rollouts per step", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit("python -m titan_fp4six.rl.dry_run is now python -m titan_fp4six.dry_run --rl (the same arguments)")
