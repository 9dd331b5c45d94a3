"""scripts/launches.py without a GPU: its layout names, the twin spec, and both tables from given timings."""

import pytest
import torch

from scripts import launches
from titan_fp4six import FourOverSixRecipe
from titan_fp4six.numerics.groups import RowGroups
from titan_fp4six.quant.recipe import plain_nvfp4


def test_twin_is_the_plain_recipes_spec_of_every_operand():
    full = FourOverSixRecipe(backward="quantized", wgrad_rht=True, gradient_rounding="stochastic",
                             weight_block="16x16")
    for grouped in (False, True):
        plan, twin = full.plan(grouped), plain_nvfp4(full).plan(grouped)
        for role in ("x", "w", "x_t"):
            assert launches.twin_of(getattr(plan, role)) == getattr(twin, role), (grouped, role)


def test_layout_names_read_how_a_launch_reads_its_operand():
    plan = FourOverSixRecipe(backward="quantized", weight_block="16x16").plan(True)
    x = torch.zeros(32, 64)
    groups = RowGroups(torch.zeros(32, dtype=torch.int64), 1, True)
    counts = torch.zeros(64, 16, dtype=torch.int64)
    assert launches.layout_of(x, plan.x, False, groups, counts, None) == "rows, per-group amax, counted"
    assert launches.layout_of(x, plan.w, False, None, counts, None) == "16x16 tiles, counted"
    assert launches.layout_of(x, plan.x, False, None, False, None) == "rows"
    assert launches.layout_of(x, plan.x_t, True, None, False, None) == "columns"
    assert launches.layout_of(x, plan.x_t, True, None, False, torch.zeros(3, 2)) == "token blocks"


def test_in_place_table_leaves_out_compiling_pairs_and_sorts_by_extra_time():
    rows = [("rows, counted", 768, True, 9.0, 1.0),  # a pair that compiled: left out
            ("rows, counted", 768, False, 0.15, 0.10), ("rows, counted", 768, False, 0.12, 0.10),
            ("rows, counted", 768, False, 0.13, 0.10),
            ("token blocks", 2048, False, 0.40, 0.36), ("token blocks", 2048, False, 0.37, 0.36)]
    lines = launches.in_place_table(rows).splitlines()
    assert lines[2] == "| rows, counted | 768 | 3 | 0.40 | 0.30 | 1.33x | 1.20-1.50x |"
    assert lines[3] == "| token blocks | 2048 | 2 | 0.77 | 0.72 | 1.07x | 1.03-1.11x |"
    assert lines[4] == "| **all** | | 5 | 1.17 | 1.02 | 1.15x | |"
    assert len(lines) == 5


def test_replay_table_gives_both_ratios():
    lines = launches.replay_table([("16x16 tiles, counted", (98304, 2048), 0.466, 0.406, 0.396)]).splitlines()
    assert lines[2] == "| 16x16 tiles, counted | 98304x2048 | 0.466 | 0.406 | 0.396 | 1.18x | 1.03x |"


def test_training_flags_follow_the_separator():
    args, flags = launches.parse(["out", "r.toml", "--steps", "3", "--docs", "--", "--model.flavor", "X", "--", "y"])
    assert (str(args.out), args.recipe, args.steps, args.rounds, args.docs) == ("out", "r.toml", 3, 2, True)
    assert flags == ["--model.flavor", "X", "--", "y"]
    assert launches.parse(["out", "r.toml"])[1] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        launches.main([str(tmp_path), "configs/qwen3_moe_debug_nvfp4_four_over_six_full.toml"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recorder_times_every_launch_and_changes_no_byte():
    """A quantized-backward linear under the recorder: the same output and gradients as without it, every 4/6
    launch timed beside its twin, and each layout's largest input replayed."""
    from titan_fp4six import four_over_six_linear
    from titan_fp4six.kernels import quantize as kq

    recipe = FourOverSixRecipe(backward="quantized", wgrad_rht=True, gradient_rounding="stochastic")
    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(256, 512, device="cuda", generator=g).bfloat16()
    w = (torch.randn(384, 512, device="cuda", generator=g) / 16).bfloat16()

    def run():
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = four_over_six_linear(xg, wg, recipe=recipe)
        y.backward(torch.ones_like(y))
        return y, xg.grad, wg.grad

    want = run()
    kq._QUANTIZE._compiled.clear()  # every kernel meets FastLaunch anew: the first pairs count as compiling
    with launches.Recorder(kq) as recorder:
        got = run()
        run()  # each layout's second launch: what the replay captures
    assert kq._launch == recorder.launch  # unwrapped again
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    torch.cuda.synchronize()
    layouts = {t.layout for t in recorder.timed}  # x and W counted (MAP4_STATS on), x^T after the RHT not
    assert {"rows, counted", "16x16 tiles, counted"} < layouts, layouts
    assert all(f > 0 and t > 0 for f, t in (t.ms() for t in recorder.timed))
    assert recorder.timed[0].compiled
    with launches.Recorder(kq) as again:
        run()
    assert again.timed and not any(t.compiled for t in again.timed)
    replayed = recorder.replay(1)
    assert replayed and len(replayed) == len(recorder.captured) and all(min(r[2:]) > 0 for r in replayed)
