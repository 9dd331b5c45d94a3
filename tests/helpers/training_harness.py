"""Runs torchtitan's trainer through `python -m titan_fp4six.train` in a subprocess and returns its losses.

Why a subprocess: the trainer initializes torch.distributed and the CPU launcher patches torchtitan module state;
neither should leak into the pytest process. Tiny flavors keep the CPU reference quantizers fast: they are
registered by `--experimental.custom_import tests.helpers.training_harness` (this module) in the child.
As a module (`python -m tests.helpers.training_harness OUT.json ARGS...`, from the repository root) it runs the launcher with ARGS and writes
{step: loss} (exact floats) to OUT.json.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny"
CPU_ARGS = ["--model.flavor", TINY, "--experimental.custom_import", "tests.helpers.training_harness",
            "--training.mixed_precision_param", "float32", "--training.seq_len", "64",
            "--training.local_batch_size", "2", "--lr_scheduler.warmup_steps", "2", "--metrics.log_freq", "1",
            "--metrics.disable_color_printing"]


def register_tiny_flavors() -> None:
    """Add the "tiny" DeepSeek-V3 and Qwen3 MoE flavors (all GEMM dims multiples of 16) to torchtitan."""
    from torchtitan.models.deepseek_v3 import DeepSeekV3ModelArgs, deepseekv3_args
    from torchtitan.models.moe import MoEArgs
    from torchtitan.models.qwen3 import Qwen3ModelArgs, qwen3_args

    deepseekv3_args[TINY] = DeepSeekV3ModelArgs(
        vocab_size=2048, dim=64, inter_dim=128, moe_inter_dim=64, n_layers=3, n_dense_layers=1, n_heads=4,
        moe_args=MoEArgs(num_experts=4, num_shared_experts=1, top_k=2, score_func="softmax", route_norm=False,
                         score_before_experts=False),
        q_lora_rank=0, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, mscale=0.70)
    qwen3_args[TINY] = Qwen3ModelArgs(
        vocab_size=2048, max_seq_len=256, head_dim=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm=True,
        hidden_dim=128, rope_theta=1000000, moe_enabled=True, moe_inter_dim=64,
        moe_args=MoEArgs(num_experts=8, num_shared_experts=0, top_k=2, score_func="softmax", route_norm=True,
                         route_scale=1.0, score_before_experts=False))


def train(config: str, dump_folder: Path, *args: str, timeout: float = 300) -> dict[int, float]:
    """Train recipe `config` (a path under configs/) on the tiny flavor; returns {step: loss}."""
    out = dump_folder / "losses.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "tests.helpers.training_harness", str(out), "--job.config_file", str(REPO / "configs" / config),
           "--job.dump_folder", str(dump_folder), *CPU_ARGS, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


def _record_losses(out: Path) -> None:
    from torchtitan.components.metrics import MetricsProcessor

    original, losses = MetricsProcessor.log, {}

    def log(self, step, global_avg_loss, *args, **kwargs):
        losses[step] = float(global_avg_loss)
        out.write_text(json.dumps(losses))
        return original(self, step, global_avg_loss, *args, **kwargs)

    MetricsProcessor.log = log


if __name__ != "__main__":
    register_tiny_flavors()  # imported by the trainer via --experimental.custom_import
else:  # torchtitan binds sys.argv when its config module is first imported: fix argv before any import of it
    out_file, sys.argv = Path(sys.argv[1]), [sys.argv[0], *sys.argv[2:]]
    _record_losses(out_file)
    from titan_fp4six.train import main

    main()
