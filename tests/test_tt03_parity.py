"""torchtitan 0.2.2 and 0.3.0 train the same step: with 0.2's initial weights and batch loaded into the 0.3 model and
0.2's attention at these lengths (RoPE without YaRN), the 4/6 recipe's step-1 loss and gradient norm are 0.2's to
float tolerance. What else differs between the versions' own runs: the initial weights of the attention's
wq/wkv_a/wkv_b (drawn in another order) and the batches (0.3's loader starts sample r at token r*seq_len, 0.2's at
r*(seq_len+1)). Runs in .venv-tt03; the Python it sits on (torchtitan 0.2.2, named in .venv-tt03/parent-python
by scripts/setup_tt03.sh) gives the reference (scripts/step_dump.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts.step_dump import to_tt03
from titan_fp4six.integration.version import series

PARENT = Path(sys.prefix, "parent-python")
pytestmark = pytest.mark.skipif(series() != "0.3" or not PARENT.exists(),
                                reason="needs torchtitan 0.3.0 in .venv-tt03 over a Python with torchtitan 0.2.2")

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "deepseek_v3_debugmodel_nvfp4_four_over_six"
ARGS = ["--training.steps", "1", "--training.local_batch_size", "2", "--training.seq_len", "64",
        "--training.mixed_precision_param", "float32", "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "1"]


def dump(python, out, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run = subprocess.run([python, "-m", "scripts.step_dump", *out, "--", *args, *ARGS], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    return torch.load(out[0], weights_only=True)


def test_same_weights_batch_and_rope_give_the_same_step1_loss_and_grad_norm_on_0_2_and_0_3(tmp_path):
    ref = dump(PARENT.read_text().strip(), [str(tmp_path / "tt02.pt")], "--job.config_file", f"configs/{RECIPE}.toml",
               "--job.dump_folder", str(tmp_path / "tt02"))
    run = dump(sys.executable, [str(tmp_path / "tt03.pt"), str(tmp_path / "tt02.pt"), "--no-yarn"],
               "--module", "titan_fp4six.integration.tt03", "--config", RECIPE, "--dump_folder", str(tmp_path / "tt03"))
    assert torch.allclose(run["losses"][0], ref["losses"][0], rtol=1e-5, atol=0)
    norm = lambda grads: torch.stack([g.norm() for g in grads.values()]).norm()  # noqa: E731
    assert torch.allclose(norm(run["grads"]), norm(ref["grads"]), rtol=1e-4, atol=0)
    differ = sorted({n.split(".")[-2] for n, v in to_tt03(ref["state"]).items() if not torch.equal(v, run["state"][n])})
    assert differ == ["wkv_a", "wkv_b", "wq"]
    (ref_batch, ref_labels), (own_batch, own_labels) = ref["batches"][0], run["loader_batches"][0]
    assert torch.equal(own_batch["input"][0], ref_batch["input"][0])
    assert torch.equal(own_batch["input"][1, 1:], ref_batch["input"][1, :-1])
    assert torch.equal(own_batch["positions"], torch.arange(64).expand(2, 64))
