"""Runs torchtitan's trainer through `python -m titan_fp4six.train` in a subprocess and returns its losses.

Why a subprocess: the trainer initializes torch.distributed and the CPU launcher patches torchtitan module state;
neither should leak into the pytest process. The subprocess is a fork of a process that has imported torchtitan
and the package already (tests/helpers/zygote.py): the same run, without paying the imports each time. The package's "tiny" flavors (titan_fp4six/integration/flavors.py,
registered by the launchers) keep the CPU reference quantizers fast.
As a module (`python -m tests.helpers.training_harness OUT.json ARGS...`, from the repository root) it runs the launcher with ARGS and writes
{step: loss} (exact floats) to OUT.json.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import zygote

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny"
"""titan_fp4six.integration.flavors.TINY_FLAVOR, spelled out: importing torchtitan here would bind sys.argv early."""
CPU_ARGS = ["--model.flavor", TINY, "--training.mixed_precision_param", "float32", "--training.seq_len", "64",
            "--training.local_batch_size", "2", "--lr_scheduler.warmup_steps", "2", "--metrics.log_freq", "1",
            "--metrics.disable_color_printing"]


def launch(config: str, dump_folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run recipe `config` (a path under configs/) on the tiny flavor; its losses go to dump_folder/losses.json."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "tests.helpers.training_harness", str(dump_folder / "losses.json"),
           "--job.config_file", str(REPO / "configs" / config), "--job.dump_folder", str(dump_folder), *CPU_ARGS, *args]
    return zygote.run(cmd[2], cmd[3:], env, str(REPO), timeout)


def train(config: str, dump_folder: Path, *args: str, timeout: float = 300) -> dict[int, float]:
    """Train recipe `config` on the tiny flavor; returns {step: loss}."""
    out = dump_folder / "losses.json"
    proc = launch(config, dump_folder, *args, timeout=timeout)
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


if __name__ == "__main__":  # torchtitan binds sys.argv when its config module is first imported: fix argv first
    out_file, sys.argv = Path(sys.argv[1]), [sys.argv[0], *sys.argv[2:]]
    _record_losses(out_file)
    from titan_fp4six.train import main

    main()
