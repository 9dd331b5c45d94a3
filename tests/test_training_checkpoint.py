"""Checkpoints of converted models through torchtitan's checkpointer, on CPU: a resumed four-over-six run continues
the uninterrupted run's losses exactly, and bf16 and four-over-six checkpoints load into each other (identical
state_dict keys and shapes, so model, optimizer, data loader and schedule all resume); a run resumed from a corrupted
optimizer state stops at its first NaN step (training.allow_nonfinite lets it go on)."""

import math
import shutil

import pytest

from tests.helpers.training_harness import launch, train

FOUR_SIX = "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"
BF16 = "deepseek_v3_debugmodel_bf16.toml"
STEPS = 5
ARGS = ["--training.steps", str(STEPS), "--optimizer.lr", "1e-2", "--checkpoint.enable", "--checkpoint.interval", "2"]


def _resume(src, step: int, dst):
    """A dump folder whose checkpoint folder holds only `src`'s checkpoint at `step` (so the run resumes there)."""
    shutil.copytree(src / "checkpoint" / f"step-{step}", dst / "checkpoint" / f"step-{step}")
    return dst


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("four_six")
    return folder, train(FOUR_SIX, folder, *ARGS)


def test_resume_continues_losses_exactly(uninterrupted, tmp_path):
    folder, losses = uninterrupted
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(map(math.isfinite, losses.values()))
    resumed = train(FOUR_SIX, _resume(folder, 2, tmp_path), *ARGS)
    assert sorted(resumed) == [3, 4, 5]
    assert resumed == {s: losses[s] for s in (3, 4, 5)}  # bit-exact floats


def test_bf16_and_four_over_six_checkpoints_load_into_each_other(uninterrupted, tmp_path):
    folder, losses = uninterrupted
    init = losses[1]
    # four-over-six step-2 checkpoint -> bf16 model: it continues close to the quantized run, far from init
    bf16 = train(BF16, _resume(folder, 2, tmp_path / "bf16"), *ARGS)
    assert sorted(bf16) == [3, 4, 5]
    for s in (3, 4, 5):
        assert abs(bf16[s] - losses[s]) < 0.05 < init - losses[s], (s, bf16[s], losses[s], init)
    assert bf16 != {s: losses[s] for s in (3, 4, 5)}  # the bf16 model really ran unquantized
    # and back: the bf16 step-4 checkpoint -> four-over-six model
    back = train(FOUR_SIX, _resume(tmp_path / "bf16", 4, tmp_path / "back"), *ARGS)
    assert sorted(back) == [5]
    assert abs(back[5] - bf16[5]) < 0.05 < init - back[5], (back[5], bf16[5], init)


def _corrupt_optimizer(src, step: int, dst):
    """`src`'s checkpoint at `step` with every AdamW second moment set to -1 (its square root is NaN), in dst."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    dst.mkdir(parents=True)
    dcp_to_torch_save(src / "checkpoint" / f"step-{step}", dst / "state.pt")
    state = torch.load(dst / "state.pt", weights_only=False)
    moments = [k for k in state["optimizer"] if k.endswith(".exp_avg_sq")]
    assert moments
    for key in moments:
        state["optimizer"][key] = -torch.ones_like(state["optimizer"][key])
    torch.save(state, dst / "state.pt")
    torch_save_to_dcp(dst / "state.pt", dst / "checkpoint" / f"step-{step}")
    return dst


def test_a_non_finite_step_stops_the_run_before_its_checkpoint(uninterrupted, tmp_path):
    """Resumed at step 2, step 3's update turns the weights NaN: step 4 used to log nan and exit 0, saving them."""
    folder, _ = uninterrupted
    stopped = launch(FOUR_SIX, _corrupt_optimizer(folder, 2, tmp_path / "stop"), *ARGS)
    assert stopped.returncode != 0
    assert "FloatingPointError: step 4: non-finite loss (nan)" in stopped.stderr, stopped.stderr[-3000:]
    assert "training.allow_nonfinite = true" in stopped.stderr
    assert sorted(p.name for p in (tmp_path / "stop" / "checkpoint").iterdir()) == ["step-2"]
    allowed = train(FOUR_SIX, _corrupt_optimizer(folder, 2, tmp_path / "go_on"), *ARGS, "--training.allow_nonfinite")
    assert sorted(allowed) == [3, 4, 5] and math.isfinite(allowed[3]) and math.isnan(allowed[5])
