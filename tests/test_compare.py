"""titan_fp4six.compare: interval arithmetic against hand computations, twins derived from a recipe equal to the
shipped twin recipes, runs that crash or diverge reported (never dropped), and a tiny comparison end to end on
the CPU through the real launcher."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import tomli

from titan_fp4six.compare import report, stats, variants
from titan_fp4six.compare.runs import Job, Scheduler, command
from tests.helpers.training_harness import CPU_ARGS, REPO

CONFIGS = REPO / "configs"


def test_mean_interval_by_hand():
    e = stats.mean_interval([0.01, 0.03, 0.02, 0.04, 0.00])
    # mean 0.02; sd = sqrt(0.001 / 4) = 0.0158114; half-width = t(0.975, 4) * sd / sqrt(5) = 2.776 * 0.0070711
    assert e.mean == pytest.approx(0.02) and e.sd == pytest.approx(0.0158114, rel=1e-5)
    assert e.half_width == pytest.approx(0.0196293, rel=1e-5)
    assert (e.low, e.high) == pytest.approx((0.02 - 0.0196293, 0.02 + 0.0196293), abs=1e-7)
    assert e.excludes_zero() and not stats.mean_interval([0.1, -0.1, 0.05]).excludes_zero()  # low = 0.00037
    assert stats.mean_interval([3.0]).low is None


def test_t_quantiles_table_and_expansion():
    assert stats.t975(1) == 12.706 and stats.t975(4) == 2.776 and stats.t975(30) == 2.042
    assert stats.t975(40) == pytest.approx(2.021, abs=1e-3) and stats.t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError, match="at least 2 samples"):
        stats.t975(0)


def test_fieller_ratio_by_hand():
    # b constant: the interval is mean(a)'s t interval divided by b: (2 +- 4.303 / sqrt(3)) / 2
    r = stats.fieller_ratio([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    half = 4.303 / math.sqrt(3) / 2
    assert r.bounded and r.value == pytest.approx(1.0)
    assert (r.low, r.high) == pytest.approx((1 - half, 1 + half), rel=1e-9)
    # a denominator not distinguishable from 0 leaves every ratio possible
    loose = stats.fieller_ratio([0.01, 0.02, 0.015], [0.03, -0.035, 0.01])
    assert not loose.bounded and loose.low is None


def test_t_p_values_and_holm_by_hand():
    # t_{0.975, df} leaves 5% in the two tails (the table's 3 decimals move p by < 2e-4); df = 1 is Cauchy:
    # p = 2 atan(1 / |t|) / pi, inside the integrated range and on the power-law tail past |t| = 60
    assert all(stats.t_two_sided_p(stats.t975(df), df) == pytest.approx(0.05, abs=2e-4) for df in range(1, 31))
    for t in (0.3, -2.0, 12.706, 59.0, 61.0, 1e4):
        assert stats.t_two_sided_p(t, 1) == pytest.approx(2 / math.pi * math.atan(1 / abs(t)), rel=2e-4)
    assert stats.t_two_sided_p(0.0, 7) == pytest.approx(1.0)
    # mean 0.02, sd 0.0158114, n 5: t = 2.8284 with df 4, just past t_{0.975, 4} = 2.776
    assert stats.paired_p(stats.mean_interval([0.01, 0.03, 0.02, 0.04, 0.00])) == pytest.approx(0.0474, abs=5e-4)
    # sorted 0.005 <= 0.05/4, 0.01 <= 0.05/3, then 0.03 > 0.05/2 stops the step-down (0.04 is not reached)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert stats.holm([0.2, 0.001]) == [False, True] and stats.holm([0.02, 0.04]) == [True, True]
    assert stats.holm([0.03, 0.04]) == [False, False]  # 0.03 > 0.05 / 2


def test_final_loss_and_spikes():
    losses = {s: float(s) for s in range(1, 11)}
    assert stats.final_loss(losses, 10, 4) == pytest.approx(8.5)
    with pytest.raises(ValueError, match="not logged"):
        stats.final_loss({1: 1.0, 3: 1.0}, 3, 3)
    norms = {s: 1.0 for s in range(1, 60)} | {30: 7.0, 45: 4.0}
    assert stats.spikes(norms, factor=5.0) == [30]


def _without_job_text(recipe: dict) -> dict:
    out = json.loads(json.dumps(recipe))
    for key in ("description", "dump_folder"):
        out["job"].pop(key, None)
    return out


@pytest.mark.parametrize("recipe, bf16, nvfp4", [
    ("qwen3_moe_debug_nvfp4_four_over_six.toml", "qwen3_moe_debug_bf16.toml", "qwen3_moe_debug_nvfp4.toml"),
    ("deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml", "deepseek_v3_debugmodel_bf16.toml",
     "deepseek_v3_debugmodel_nvfp4_all_linears.toml"),
    ("deepseek_v3_debugmodel_nvfp4_four_over_six_full.toml", "deepseek_v3_debugmodel_bf16.toml",
     "deepseek_v3_debugmodel_nvfp4_full.toml"),
    ("qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml", "qwen3_moe_debug_bf16.toml",
     "qwen3_moe_debug_nvfp4_all_linears.toml"),
    ("qwen3_moe_debug_nvfp4_four_over_six_full.toml", "qwen3_moe_debug_bf16.toml",
     "qwen3_moe_debug_nvfp4_full.toml")])
def test_twins_derived_from_a_recipe_equal_the_shipped_twins(recipe, bf16, nvfp4):
    derived = {v.name: v for v in variants.derive(variants.load_recipe(CONFIGS / recipe))}
    assert list(derived) == ["bf16", "nvfp4", "4/6"]
    for name, shipped in (("bf16", bf16), ("nvfp4", nvfp4), ("4/6", recipe)):
        with open(CONFIGS / shipped, "rb") as f:
            assert _without_job_text(derived[name].recipe) == _without_job_text(tomli.load(f)), name
        assert tomli.loads(variants.dumps(derived[name].recipe)) == derived[name].recipe  # written as read


def test_extra_variants_set_knobs_in_every_section_and_pass_overrides():
    base = variants.load_recipe(CONFIGS / "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml")
    vs = {v.name: v for v in variants.derive(base, ["nvfp4 B256=nvfp4 scale_bound=256",
                                                    "slow='nvfp4 B256' backward=dequantized --optimizer.lr 1e-4"])}
    for kind in variants.SECTIONS:
        s = vs["slow"].recipe["quantize"][kind]["four_over_six"]
        assert (s["scope"], s["scale_bound"], s["backward"]) == ("none", 256, "dequantized")
        assert vs["nvfp4 B256"].recipe["quantize"][kind]["four_over_six"]["scale_bound"] == 256
        assert base["quantize"][kind]["four_over_six"]["scale_bound"] == 256 and "scope" not in base["quantize"][kind]["four_over_six"]
    assert vs["slow"].overrides == ["--optimizer.lr", "1e-4"] and vs["nvfp4 B256"].overrides == []
    assert [v.name for v in variants.derive(base, only=["bf16", "4/6"])] == ["bf16", "4/6"]


@pytest.mark.parametrize("spec, match", [("x=fp8 scale_bound=256", "base 'fp8' is not a variant"),
                                         ("nvfp4=4/6", "is taken"), ("x=4/6 scale_bound", "neither knob=value"),
                                         ("noequals", "expected 'NAME=BASE"),
                                         ("4of6=nvfp4", "would be named '4of6', as variant '4/6'"),
                                         ("x=4/6 --debug.seed=7", "'--debug.seed=7' is set by compare"),
                                         ("x=4/6 --training.steps 9", "'--training.steps' is set by compare")])
def test_bad_variant_specs_are_named(spec, match):
    base = variants.load_recipe(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml")
    with pytest.raises(ValueError, match=match):
        variants.derive(base, [spec])


def test_a_recipe_without_four_over_six_is_refused():
    with pytest.raises(ValueError, match="lists no four-over-six converter"):
        variants.load_recipe(CONFIGS / "qwen3_moe_debug_bf16.toml")
    with pytest.raises(ValueError, match="must list 'bf16'"):
        variants.derive(variants.load_recipe(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), only=["4/6"])


def _fake_run(tmp_path: Path, variant: str, seed: int, losses: list[float], code: int | None) -> Job:
    job = Job(variant, seed, command(Path("x.toml"), seed, len(losses), tmp_path, [], []),
              tmp_path / f"{variant.replace('/', 'of')}_{seed}.log")
    return _write_log(job, losses, code)


def _write_log(job: Job, losses: list[float], code: int | None) -> Job:
    """The log (and exit file, unless code is None) a run of `job` leaves, with these losses."""
    job.log.parent.mkdir(parents=True, exist_ok=True)
    lines = [job.header()] + [f"[titan] INFO - step: {i:2}  loss: {v:8.5f}  grad_norm:  1.0000  memory:  3.10GiB(2%)\n"
                              for i, v in enumerate(losses, 1)]
    job.log.write_text("".join(lines))
    if code is not None:
        job.exit_file.write_text(f"{code}\n")
    return job


def test_crashed_diverged_and_missing_runs_are_reported_not_dropped(tmp_path):
    steps, jobs = 4, []
    for seed in (0, 1, 2):
        jobs.append(_fake_run(tmp_path, "bf16", seed, [5.0, 4.0, 3.0, 2.0 + 0.01 * seed], 0))
        jobs.append(_fake_run(tmp_path, "nvfp4", seed, [5.0, 4.0, 3.0, 2.1 + 0.01 * seed], 0))
    jobs.append(_fake_run(tmp_path, "4/6", 0, [5.0, 4.0, 3.0, 2.05], 0))
    jobs.append(_fake_run(tmp_path, "4/6", 1, [5.0, 4.0], 1))                       # crashed at step 3
    jobs.append(_fake_run(tmp_path, "4/6", 2, [5.0, 4.0, float("nan"), float("nan")], 0))  # diverged
    jobs.append(_fake_run(tmp_path, "4/6", 3, [5.0], None))                         # never finished
    outcomes = [report.read_outcome(j, steps, 1, 5.0) for j in jobs]
    status = {(o.variant, o.seed): o.status for o in outcomes}
    assert status[("4/6", 1)] == "failed" and status[("4/6", 2)] == "diverged" and status[("4/6", 3)] == "not run"
    summaries = {s.name: s for s in report.summarize(outcomes, ["bf16", "nvfp4", "4/6"])}
    assert summaries["4/6"].ok == 1 and summaries["4/6"].seeds == 4 and len(summaries["4/6"].problems) == 3
    assert summaries["nvfp4"].gap_to_bf16.mean == pytest.approx(0.1) and summaries["nvfp4"].gap_to_bf16.n == 3
    assert summaries["4/6"].gap_to_bf16.n == 1 and summaries["4/6"].gap_to_bf16.low is None
    text = report.markdown(list(summaries.values()), outcomes, "setup")
    assert "exit 1 after 2 of 4 steps" in text and "non-finite loss or grad norm at step 3" in text
    assert "**failed**" in text and "**diverged**" in text and "**not run**" in text
    assert json.loads(report.to_json(list(summaries.values()), outcomes, {}))["runs"][3]["status"] == "ok"


def test_a_run_whose_tail_is_not_logged_is_failed_with_the_reason(tmp_path):
    """metrics.log_freq 2 leaves odd steps out of the log: reported, not a crash of the whole report."""
    job = _fake_run(tmp_path, "4/6", 0, [5.0, 4.0, 3.0, 2.0], 0)
    lines = job.log.read_text().splitlines(keepends=True)
    job.log.write_text("".join(lines[:3] + lines[4:]))  # step 3 not logged
    outcome = report.read_outcome(job, 4, 2, 5.0)
    assert outcome.status == "failed" and "steps 3..3 of the last 2 are not logged" in outcome.detail
    assert "--metrics.log_freq 1" in outcome.detail


@pytest.mark.parametrize("code, done", [(0, True), (1, False), (143, False), (None, False)])
def test_only_runs_that_finished_are_done_before(tmp_path, code, done):
    """A stopped (--timeout), failed or killed run is trained again by the next invocation."""
    assert _fake_run(tmp_path, "bf16", 0, [5.0, 4.0], code).done_before() is done


def test_a_folder_of_another_comparison_is_refused(tmp_path):
    from titan_fp4six.compare.__main__ import parse_args, plan

    out = ["--out", str(tmp_path / "cmp")]
    plan(*parse_args(["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), *out]))
    plan(*parse_args(["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), *out]))
    with pytest.raises(SystemExit, match=r"holds a comparison whose variant 'bf16' is another recipe"):
        plan(*parse_args(["--job.config_file", str(CONFIGS / "deepseek_v3_debugmodel_nvfp4_four_over_six.toml"),
                          *out]))


def test_two_comparisons_cannot_share_a_folder_at_once(tmp_path):
    from titan_fp4six.compare.__main__ import _lock, main

    held = _lock(tmp_path)
    with pytest.raises(SystemExit, match="another compare is running there"):
        main(["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--out", str(tmp_path),
              "--report-only"])
    held.close()


def test_the_tables_intervals_are_read_together(tmp_path):
    """NVFP4 and 4/6 each ~0.02 above bf16 (p = 0.047 and 0.039 on their own: both intervals exclude 0) and 4/6
    0.0014 above NVFP4 with almost no spread (p < 1e-4): Holm's step-down over the table's three intervals keeps
    the last (< 0.05 / 3) and stops at 0.039 > 0.05 / 2, in the markdown and the JSON."""
    bf16 = [2.0, 2.3, 2.1, 2.2, 2.4]
    d_nv = [0.01, 0.03, 0.02, 0.04, 0.00]
    d_46 = [d + e for d, e in zip(d_nv, [0.002, 0.001, 0.001, 0.002, 0.001])]
    finals = {"bf16": bf16, "nvfp4": [b + d for b, d in zip(bf16, d_nv)], "4/6": [b + d for b, d in zip(bf16, d_46)]}
    outcomes = [report.read_outcome(_fake_run(tmp_path, v, seed, [5.0, loss], 0), 2, 1, 5.0)
                for v, losses in finals.items() for seed, loss in enumerate(losses)]
    summaries = report.summarize(outcomes, list(finals))
    tests = {t["comparison"]: t for t in report.family(summaries)}
    assert set(tests) == {"nvfp4 - bf16", "4/6 - bf16", "4/6 - nvfp4"} and all(t["excludes_zero"] for t in tests.values())
    assert [tests[c]["holm_excludes_zero"] for c in ("nvfp4 - bf16", "4/6 - bf16", "4/6 - nvfp4")] == [False, False, True]
    text = report.markdown(summaries, outcomes, "setup")
    assert "over the table's 3 paired intervals" in text and "4/6 - nvfp4 (p = " in text
    assert "its own interval only: nvfp4 - bf16, 4/6 - bf16." in text
    assert json.loads(report.to_json(summaries, outcomes, {}))["family"] == report.family(summaries)


def test_bf16_runs_are_read_from_the_comparison_that_shares_them(tmp_path):
    """--bf16-from: the all-Linears comparison reads the bf16 runs of the base point's folder (same twin), trains
    its own variants in its own, and refuses a folder whose bf16 runs are another training, before any run."""
    from titan_fp4six.compare.__main__ import main, parse_args, plan

    base, full = tmp_path / "base", tmp_path / "all"
    study = ["--seeds", "2", "--steps", "3", "--tail", "1", "--training.seq_len", "64"]
    args, trainer = parse_args(["--job.config_file", str(CONFIGS / "deepseek_v3_debugmodel_nvfp4_four_over_six.toml"),
                                "--out", str(base), *study])
    for job in plan(args, trainer)[1]:
        _write_log(job, [5.0, 4.0, 3.0 + 0.1 * job.seed], 0)
    shared = ["--job.config_file", str(CONFIGS / "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"),
              "--bf16-from", str(base)]
    args, trainer = parse_args([*shared, "--out", str(full), *study])
    jobs = plan(args, trainer)[1]
    assert {j.log.parent for j in jobs if j.variant == "bf16"} == {base / "runs"}
    assert all(j.done_before() for j in jobs if j.variant == "bf16")
    assert {j.log.parent for j in jobs if j.variant != "bf16"} == {full / "runs"}
    for job in jobs:
        if job.variant != "bf16":
            _write_log(job, [5.0, 4.0, 3.05 + 0.1 * job.seed], 0)
    assert main([*shared, "--out", str(full), *study, "--report-only", "--no-plot"]) == 0
    result = json.loads((full / "compare.json").read_text())
    assert {(r["variant"], r["status"]) for r in result["runs"]} == {(v, "ok") for v in ("bf16", "nvfp4", "4/6")}
    assert {v["name"]: v for v in result["variants"]}["4/6"]["gap_to_bf16"]["mean"] == pytest.approx(0.05)

    with pytest.raises(SystemExit, match="another command's run"):  # other trainer settings: not the same runs
        plan(*parse_args([*shared, "--out", str(full), *study[:-1], "128"]))
    unfinished = [j for j in jobs if j.variant == "bf16"][0]
    unfinished.exit_file.unlink()  # stopped before the end: trained again in its folder, not refused
    assert not [j for j in plan(args, trainer)[1] if j.variant == "bf16" and j.seed == 0][0].done_before()
    with pytest.raises(SystemExit, match="another training than this recipe's bf16 twin"):  # another model
        plan(*parse_args(["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"),
                          "--bf16-from", str(base), "--out", str(tmp_path / "qwen"), *study]))


def test_gpu_concurrency_follows_the_runs_memory():
    s = Scheduler(jobs=8, device_gib=140.0, timeout=10)
    assert s.limit() == 1  # one run alone until its step line reports memory
    s.per_run_gib = 3.1
    assert s.limit() == 8
    s.per_run_gib = 40.0
    assert s.limit() == 2
    assert Scheduler(jobs=8, device_gib=None, timeout=10).limit() == 1  # CPU: one at a time


def test_tiny_comparison_end_to_end_on_the_cpu(tmp_path):
    """Three variants and a broken one (a scale bound the config refuses), 2 seeds, 3 steps on the tiny flavor:
    every run is in the outputs, the broken ones as failed, and the exit code says a run failed."""
    out = tmp_path / "cmp"
    args = [sys.executable, "-m", "titan_fp4six.compare", "--job.config_file",
            str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--seeds", "2", "--steps", "3", "--tail", "2",
            "--out", str(out), "--variant", "broken=4/6 scale_bound=300", *CPU_ARGS, "--training.seq_len", "32",
            "--lr_scheduler.warmup_steps", "1"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "compare.json").read_text())
    status = {(r["variant"], r["seed"]): r["status"] for r in result["runs"]}
    assert status == {(v, s): "failed" if v == "broken" else "ok" for v in ("bf16", "nvfp4", "4/6", "broken")
                      for s in (0, 1)}
    summary = {v["name"]: v for v in result["variants"]}
    assert summary["4/6"]["gap_to_bf16"]["n"] == 2 and summary["broken"]["ok"] == 0
    assert (out / "compare.png").stat().st_size > 0 and "| broken | 0/2 |" in (out / "compare.md").read_text()
    assert proc.stdout.count("[compare]") >= 8  # a progress line per run
    # the same command again trains nothing that finished
    again = subprocess.run([*args, "--only", "bf16,4/6"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.stdout.count("done by an earlier invocation") == 4, again.stdout[-2000:]


@pytest.mark.parametrize("args, match", [
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_bf16.toml")], "lists no four-over-six converter"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--variant", "x=fp8 a=1"],
     "base 'fp8' is not a variant"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--seeds", "1"],
     "at least 2"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--debug.seed", "3"],
     "set by compare"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--debug.seed=7"],
     "--debug.seed=7: --training.steps / --debug.seed are set by compare"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--training.steps=9"],
     "set by compare"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--steps", "0"],
     "--steps 0: give a positive number of steps"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--steps", "-2"],
     "--steps -2: give a positive number of steps"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--tail", "0"],
     "--tail 0: must be between 1 and --steps"),
    (["--job.config_file", str(CONFIGS / "qwen3_moe_debug_nvfp4_four_over_six.toml"), "--timeout", "-5"],
     "--timeout -5.0: seconds before a run is stopped, must be > 0"),
])
def test_cli_refuses_what_it_cannot_compare_before_training(capsys, args, match):
    from titan_fp4six.compare.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and match in capsys.readouterr().err
