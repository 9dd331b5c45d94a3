"""GRPO on 2 CPU ranks (torchrun, gloo): time per step and the weight sync's bytes and seconds, packed against bf16;
writes docs/results/rl_sync.md with the 30B-A3B recipe's arithmetic on 8 GPUs.

    python -m scripts.rl_sync [--steps 8] [--flavor tiny] [--out outputs/rl_sync]

Each configuration runs once as a whole torchrun job (steps after the first are measured: the first includes
start-up work); figures are medians over those steps, per rank maxima as the trainer logs them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from scripts.results_page import provenance, write_page

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml"


def run(nproc: int, sync: str, flavor: str, steps: int, out: Path, generator: str) -> list[dict]:
    dump = out / f"{flavor}_{generator}_{sync}_n{nproc}"
    python = str(ROOT / ".venv-vllm" / "bin" / "python") if generator == "vllm" else sys.executable
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           "titan_fp4six.rl", "--job.config_file", RECIPE, "--model.flavor", flavor, "--training.steps", str(steps),
           "--training.mixed_precision_param", "float32", "--rl.prompts_per_step", "8", "--rl.group_size", "4",
           "--rl.weight_sync", sync, "--rl.generator", generator, "--metrics.log_freq", "1",
           "--parallelism.data_parallel_shard_degree", str(nproc), "--job.dump_folder", str(dump)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(max(1, os.cpu_count() // nproc))}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (dump / "rl_metrics.jsonl").read_text().splitlines()][1:]


def thirty_b() -> str:
    """The 30B-A3B recipe's sync on 8 GPUs, from its model built on the meta device."""
    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    import titan_fp4six.integration.job_config  # noqa: F401  (the flavors)
    from titan_fp4six.rl.dry_run import PACKED_BYTES as PACKED

    spec = get_train_spec("qwen3")
    a = spec.model_args["30B-A3B"]
    with torch.device("meta"):
        model = spec.model_cls(a)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    dense = total - experts
    gib = 1024 ** 3
    packed, bf16 = (dense * 2 + experts * PACKED) / gib, total * 2 / gib
    return (f"Qwen3-30B-A3B: {total / 1e9:.2f}B parameters, {experts / 1e9:.2f}B of them routed experts "
            f"({a.n_layers} layers x {a.moe_args.num_experts} experts x 3 x {a.dim} x {a.moe_inter_dim}). Each of "
            f"the 8 ranks assembles the whole model after every step: bf16 sync {bf16:.1f} GiB; packed sync "
            f"{dense * 2 / gib:.1f} GiB dense bf16 + {experts * PACKED / gib:.1f} GiB packed experts = {packed:.1f} "
            "GiB "
            f"({packed / bf16:.2f}x). A rank receives 7/8 of it from the others (an all-gather): {bf16 * 7 / 8:.1f} "
            f"against {packed * 7 / 8:.1f} GiB. At an all-gather bus bandwidth of B GB/s that takes "
            f"{bf16 * 7 / 8 * gib / 1e9:.0f}/B against {packed * 7 / 8 * gib / 1e9:.0f}/B seconds (an assumption, not "
            "measured here: no multi-GPU machine is lent), plus the shard-wise quantization, one read of each rank's "
            "experts.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--flavor", default="tiny")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "rl_sync")
    parser.add_argument("--generators", default="native", help="comma-separated: native, vllm (needs .venv-vllm)")
    args = parser.parse_args()
    rows = []
    for generator in args.generators.split(","):
        for nproc, sync in ((1, "packed"), (2, "packed"), (2, "bf16")):
            m = run(nproc, sync, args.flavor, args.steps, args.out, generator)
            med = {k: statistics.median(s.get(k, 0.0) for s in m)
                   for k in ("gen_s", "train_s", "sync_s", "sync_packed_bytes", "sync_packed_bf16_bytes",
                             "sync_whole_bytes")}
            step = med["gen_s"] + med["train_s"] + med["sync_s"]
            sent = med["sync_packed_bytes"] + med["sync_whole_bytes"]
            ratio = med["sync_packed_bytes"] / max(med["sync_packed_bf16_bytes"], 1)
            experts = (f"{med['sync_packed_bytes'] / 1e6:.2f} MB ({ratio:.3f}x bf16)" if med["sync_packed_bytes"]
                       else "-")
            rows.append(f"| {generator} | {nproc} | {sync if nproc > 1 or generator == 'vllm' else 'none (own model)'} "
                        f"| {step:.3f} | {med['gen_s']:.3f} | {med['train_s']:.3f} | {med['sync_s'] * 1e3:.1f} | "
                        f"{sent / 1e6:.2f} | {experts} |")
            print(rows[-1], flush=True)
    command = f"python -m scripts.rl_sync --steps {args.steps} --flavor {args.flavor} --generators {args.generators}"
    write_page("rl_sync.md", "scripts.rl_sync", f"""# GRPO on 2 CPU ranks: step time and the weight sync

{provenance(command)}

The RL recipe (`{RECIPE}`), flavor `{args.flavor}`, FP32 parameters, 8 prompts x 4 samples a step, FSDP2 over
the ranks; medians over steps 2-{args.steps} (per-rank maxima). "sync MB": what each rank assembles into its
engine per step (dense tensors whole, the converted experts as codes + scales + amaxes where packed); "experts":
the packed experts' share and its ratio to the same weights in bf16. One process with the native generator has no
engine (it samples from the trainer's own model).

| generator | ranks | weight sync | step s | rollout s | train s | sync ms | sync MB | experts |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

## The 30B-A3B recipe on 8 GPUs (arithmetic)

{thirty_b()}
""")


if __name__ == "__main__":
    main()
