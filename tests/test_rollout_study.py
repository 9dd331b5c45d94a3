"""The rollout-distance study over training runs: scripts/rollout_distance.py's intervals across checkpoints (on
synthetic per-window numbers of three fake checkpoints) and scripts/rollout_study.py's argument handling (its
dry run lists the training, scoring and report commands and runs nothing). The chain itself (training, scoring)
is proved at toy scale by hand: docs/fidelity.md, "Rollouts against the bf16 policy"."""

import json
import random
import shlex

import pytest

from scripts.rollout_distance import (DATA, METRICS, SCORE_FORMAT, VARIANTS, over_runs, page, pick_vllm, pooled,
                                      regime_summary, resolve_checkpoints, summarize_means)
from scripts.rollout_distance import main as distance_main
from scripts.rollout_study import REGIMES, main, needs_scoring, parse, parse_regime, plan, write_record
from titan_fp4six.compare.stats import fieller_ratio, mean_interval

WINDOWS = 20


def fake_units(shifts: list[float], noise: float = 0.002, seed: int = 0) -> list[dict[str, list[float]]]:
    """Per checkpoint, per variant, WINDOWS window means: NVFP4 around 0.3 (the checkpoint's own level), 4/6 the
    same windows moved by the checkpoint's shift, plus small per-window noise."""
    rng = random.Random(seed)
    units = []
    for i, shift in enumerate(shifts):
        base = [0.3 + 0.01 * i + 0.05 * rng.random() for _ in range(WINDOWS)]
        unit = {}
        for name in VARIANTS:
            move = shift if name.startswith("4/6") else 0.0
            unit[name] = [b + move + noise * rng.gauss(0, 1) for b in base]
        units.append(unit)
    return units


def test_over_runs_takes_each_checkpoint_as_one_unit():
    units = fake_units([-0.02, -0.03, -0.025])
    s = over_runs(units)
    runs = {v: [sum(u[v]) / len(u[v]) for u in units] for v in VARIANTS}
    for v in VARIANTS:
        assert s["variants"][v]["n"] == 3
        assert s["variants"][v]["low"] == pytest.approx(vars(mean_interval(runs[v]))["low"])
    pair = s["pairs"]["row"]
    diffs = [a - b for a, b in zip(runs["4/6, row"], runs["NVFP4, row"])]
    assert pair["difference"]["n"] == 3 and pair["difference"]["mean"] == pytest.approx(sum(diffs) / 3)
    ratio = fieller_ratio(runs["4/6, row"], runs["NVFP4, row"])
    assert pair["ratio"]["low"] == pytest.approx(ratio.low) and pair["ratio"]["high"] == pytest.approx(ratio.high)
    fraction = pair["fraction_removed"]  # 1 - ratio, its interval mirrored
    assert fraction["value"] == pytest.approx(1 - ratio.value)
    assert (fraction["low"], fraction["high"]) == pytest.approx((1 - ratio.high, 1 - ratio.low))
    assert pair["difference"]["high"] < 0 and fraction["low"] > 0  # a consistent shift: 4/6 closer over runs


def test_per_window_intervals_exclude_zero_where_the_runs_do_not():
    """Each checkpoint's 4/6 is clearly closer window by window, but by amounts that differ between training runs
    (-0.05, -0.03, -0.01): every per-window interval excludes 0, the interval over the 3 runs does not."""
    units = fake_units([-0.05, -0.03, -0.01])
    for unit in units:
        per_window = summarize_means(unit)["pairs"]["tensor"]["difference"]
        assert per_window["n"] == WINDOWS and per_window["high"] < 0
    assert pooled(units)["pairs"]["tensor"]["difference"]["high"] < 0
    runs = over_runs(units)["pairs"]["tensor"]
    assert runs["difference"]["n"] == 3 and runs["difference"]["low"] < 0 < runs["difference"]["high"]
    assert runs["ratio"]["low"] is None or runs["ratio"]["low"] < 1 < runs["ratio"]["high"]


def _score(label: str, regime: str, unit: dict[str, list[float]], seed: int) -> dict:
    means = {d: {m: unit for m in METRICS} for d in DATA}
    return {"label": label, "regime": regime, "windows": WINDOWS, "window_means": means, "held_out_loss": 5.0 + seed,
            "seconds": 10.0, "command": "python -m scripts.rollout_distance ...",
            "pooled_dlogp": {v: 0.1 for v in VARIANTS},
            "run": {"regime": regime, "seed": seed, "steps": 8, "batch": 2, "seq_len": 64, "tail": 1,
                    "train_loss": 4.0 + seed, "seconds": 3.0}}


def test_page_gives_the_verdict_over_runs_and_labels_the_per_window_intervals():
    units = fake_units([-0.05, -0.03, -0.01])
    scores = [_score(f"r-seed{i}", "r", u, i) for i, u in enumerate(units)]
    result = {"date": "today", "commit": "abc", "machine": "here", "command": "python -m scripts.rollout_distance",
              "phases": [{"phase": "train r-seed0", "command": "python3 -m titan_fp4six.train", "seconds": 3.0}],
              "windows": WINDOWS, "window": 128, "prompt": 32, "response": 64, "report_seconds": 1.0,
              "regimes": {"r": regime_summary(scores)}, "scores": scores}
    text = page(result)
    assert "Over 3 training runs" in text and "not distinguishable" in text
    assert "**Pooled windows**" in text and text.count("**Per window, r-seed") == 3
    assert "the pooled windows exclude 0 where the runs do not" in text
    assert "# train r-seed0: 3 s" in text and "Not run through vLLM" in text
    assert "| r-seed1 | 1 | 8 | 2 x 64 | 5.0000 (last 1 steps) | 6.0000 |" in text
    json.dumps(result)  # the JSON the script writes


def test_checkpoints_resolve_globs_regimes_and_run_records(tmp_path):
    for regime in ("a", "b"):
        for seed in (0, 1):
            step = tmp_path / regime / f"seed{seed}" / "checkpoint" / "step-8"
            step.mkdir(parents=True)
            (step.parent.parent / "run.json").write_text(json.dumps({"regime": regime, "seed": seed}))
    found = resolve_checkpoints([str(tmp_path / "a" / "seed*" / "checkpoint" / "step-*"),
                                 str(tmp_path / "b" / "seed1" / "checkpoint" / "step-8"),
                                 str(tmp_path / "a" / "seed0" / "checkpoint" / "step-8")])  # a duplicate: dropped
    assert [(c.regime, c.label) for c in found] == [("a", "a-seed0"), ("a", "a-seed1"), ("b", "b-seed1")]
    assert pick_vllm(found, "first") == {"a-seed0", "b-seed1"} and pick_vllm(found, "none") == set()
    named = resolve_checkpoints([f"x={tmp_path / 'b' / 'seed0' / 'checkpoint' / 'step-8'}"])
    assert named[0].regime == "x" and named[0].run == {"regime": "b", "seed": 0}
    with pytest.raises(ValueError, match="matches nothing"):
        resolve_checkpoints([str(tmp_path / "c" / "*")])


def test_study_dry_run_lists_every_phase_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    assert main([str(out), "--seeds", "2", "--regime", "mem:8:2:64:2", "--regime", "short:4:2:64:1",
                 "--max-windows", "2", "--vllm", "first", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    train = [ln for ln in text.splitlines() if ln.startswith("python3 -m titan_fp4six.train")]
    assert len(train) == 4
    for regime, steps, seed in (("mem", 8, 0), ("mem", 8, 1), ("short", 4, 0), ("short", 4, 1)):
        line = next(ln for ln in train if f"{out}/{regime}/seed{seed}" in ln)
        for flag in (f"--debug.seed {seed}", f"--training.steps {steps}", "--debug.deterministic",
                     "--checkpoint.enable", f"--checkpoint.interval {steps}", "--checkpoint.last_save_model_only",
                     "--model.flavor small", "--job.config_file configs/qwen3_moe_debug_bf16.toml"):
            assert flag in line, (flag, line)
    score = [ln for ln in text.splitlines() if "--score-only" in ln]
    assert len(score) == 4 and all("--max-windows 2" in ln for ln in score)
    vllm = [ln for ln in score if "--vllm all" in ln]  # the first seed of each regime
    assert len(vllm) == 2 and all("seed0/" in ln for ln in vllm)
    report = [ln for ln in text.splitlines() if ln.startswith("python3 -m scripts.rollout_distance")
              and "--score-only" not in ln]
    assert len(report) == 1 and report[0].count("--checkpoint ") == 4 and "--vllm first" in report[0]


def test_study_defaults_and_refusals(monkeypatch):
    a = parse(["out"])
    assert a.seeds == 5 and [parse_regime(r) for r in REGIMES] == a.regimes
    assert parse(["out", "--regime", "short"]).regimes == [a.regimes[1]]  # a default regime by its name
    part = parse(["out", "--regime", "memorizing", "--seeds", "2", "--seed-start", "3"])
    runs = plan(part.out, part.regimes, part.seeds, cuda=True, seed_start=part.seed_start)
    assert [r.seed for r in runs] == [3, 4] and part.tag == "memorizing.seeds3-4"
    assert "--training.mixed_precision_param" not in runs[0].job.command  # the GPU's own precision
    mem, short = a.regimes
    assert (mem.steps, mem.batch, mem.seq_len, mem.warmup) == (1500, 32, 512, 50) and short.steps < mem.steps
    assert a.phases == ["train", "score", "report"] and parse(["out", "--phase", "score"]).phases == ["score"]
    monkeypatch.setenv("SEEDS", "3")
    assert parse(["out"]).seeds == 3
    for bad in (["--regime", "x:1:2:3"], ["--regime", "x:a:2:3:0"], ["--regime", "x:4:2:64:5"],
                ["--regime", "x:4:2:64:1", "--regime", "x:8:2:64:1"], ["--seeds", "0"], ["--seed-start", "-1"]):
        with pytest.raises(SystemExit):
            parse(["out", *bad])


def test_study_scores_only_checkpoints_without_current_scores(tmp_path):
    a = parse([str(tmp_path), "--seeds", "1", "--regime", "mem:8:2:64:2", "--max-windows", "2"])
    run = plan(a.out, a.regimes, a.seeds, cuda=False)[0]
    assert needs_scoring(a, run, with_vllm=False)  # nothing scored yet
    (tmp_path / "scores").mkdir()
    want = {"format": SCORE_FORMAT, "checkpoint": "mem/seed0/checkpoint/step-8", "window": 128, "prompt": 32,
            "response": 64, "seed": 0, "max_windows": 2, "seq_len": 64}  # named inside OUT: the folder can move
    (tmp_path / "scores" / "mem-seed0.json").write_text(json.dumps({"settings": want}))
    assert not needs_scoring(a, run, with_vllm=False)
    assert needs_scoring(a, run, with_vllm=True)  # vLLM's numbers asked for, not there
    assert needs_scoring(parse([str(tmp_path), "--seeds", "1", "--regime", "mem:8:2:64:2"]), run, False)


def test_a_run_trained_elsewhere_keeps_its_record(tmp_path):
    """Scoring on the CPU the runs a GPU trained: the record keeps the GPU's command and training time, though
    the CPU's command for the same run differs (its precision flag)."""
    a = parse([str(tmp_path), "--seeds", "1", "--regime", "mem:8:2:64:2"])
    gpu_run = plan(a.out, a.regimes, a.seeds, cuda=True)[0]
    cpu_run = plan(a.out, a.regimes, a.seeds, cuda=False)[0]
    assert gpu_run.job.command != cpu_run.job.command
    gpu_run.checkpoint.mkdir(parents=True)
    (gpu_run.checkpoint / ".metadata").write_text("")
    gpu_run.job.exit_file.write_text("0\n")
    trained = {"seed": 0, "seconds": 191.5, "command": shlex.join(gpu_run.job.command[1:])}
    gpu_run.record.write_text(json.dumps(trained))
    assert write_record(cpu_run) == trained
    assert json.loads(cpu_run.record.read_text()) == trained
    gpu_run.job.exit_file.write_text("1\n")  # a failed run has no record to report
    assert write_record(cpu_run) is None


def test_report_only_pages_every_stored_score(tmp_path):
    """Score files brought back from other machines (one regime each) make one page, with no checkpoint at hand."""
    (tmp_path / "scores").mkdir()
    knobs = {"format": SCORE_FORMAT, "window": 128, "prompt": 32, "response": 64, "seed": 0, "max_windows": 0}
    for regime, shifts in (("mem", [-0.02, -0.03, -0.025]), ("short", [-0.05, -0.03, -0.01])):
        for i, unit in enumerate(fake_units(shifts)):
            s = _score(f"{regime}-seed{i}", regime, unit, i)
            s["settings"] = dict(knobs, checkpoint=f"{regime}/seed{i}/checkpoint/step-8", seq_len=64)
            (tmp_path / "scores" / f"{regime}-seed{i}.json").write_text(json.dumps(s))
    phases = tmp_path / "phases.mem.json"
    phases.write_text(json.dumps([{"phase": "train mem-seed0", "command": "python3 -m ...", "seconds": 5.0}]))
    docs = tmp_path / "docs" / "rollout_distance.md"  # --docs PATH: the page, marked as the script's, and the
    docs.parent.mkdir()  # summary in fidelity.md's section where that page lies beside it
    (docs.parent / "fidelity.md").write_text("# F\n\n<!-- begin rollout-distance (scripts.rollout_distance) -->\n"
                                             "old\n<!-- end rollout-distance -->\nTail.\n")
    assert distance_main(["--out", str(tmp_path), "--report-only", "--phases", str(tmp_path / "phases.*.json"),
                          "--docs", str(docs)]) == 0
    text = (tmp_path / "rollout_distance.md").read_text()
    assert docs.read_text() == ("<!-- page written by scripts.rollout_distance; edit the script, not this page -->\n"
                                + text)
    summary = (docs.parent / "fidelity.md").read_text()
    assert summary.startswith("# F\n\n<!-- begin rollout-distance (scripts.rollout_distance) -->\nWritten by "
                              "`python -m scripts.rollout_distance --out ") and summary.endswith("Tail.\n")
    assert "**Regime mem**, over 3 training runs" in summary and "**Regime short**, over 3" in summary
    assert "old" not in summary and "[rollout_distance.md](rollout_distance.md)" in summary
    assert "## Regime: mem (3 checkpoints)" in text and "## Regime: short (3 checkpoints)" in text
    assert "# train mem-seed0: 5 s" in text
    result = json.loads((tmp_path / "rollout_distance.json").read_text())
    assert result["regimes"]["mem"]["over_runs"]["held-out text"]["kl"]["pairs"]["row"]["difference"]["high"] < 0
    bad = json.loads((tmp_path / "scores" / "mem-seed0.json").read_text())
    bad["settings"]["window"] = 64
    (tmp_path / "scores" / "mem-seed0.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="different settings"):
        distance_main(["--out", str(tmp_path), "--report-only"])
