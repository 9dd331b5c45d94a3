"""`python -m scripts.runs ... --docs`: the tables its subcommands measure, built from made-up numbers, and written
into their sections of a copy of the results page (CPU; the measurements themselves need GPUs)."""

import json
import re

import pytest

from scripts import results_page, runs
from scripts.results_page import RESULTS, sections


def _profile(wall, busy, kernels, kernel_ms, kinds, by_op=None, host_ops=None, top=()):
    return {"step": "ProfilerStep#10", "wall_ms": wall, "gpu_busy": busy, "kernels": kernels, "kernel_ms": kernel_ms,
            "kinds": {k: {"count": c, "ms": ms} for k, (c, ms) in kinds.items()}, "kernel_ms_by_op": by_op or {},
            "host_ops": host_ops or {}, "top": [{"name": n, "count": c, "ms": ms} for n, c, ms in top]}


TWIN = _profile(169.7, 0.95, 1769, 161.8, {"GEMM": (151, 44.0), "attention": (24, 4.6)},
                {"outside the plugin's ops": {"GEMM": 44.0, "attention": 4.6}})
RECIPE = _profile(222.6, 0.88, 2692, 195.1, {"GEMM": (151, 40.5), "quantize": (140, 23.6), "attention": (24, 4.6)},
                  {"outside the plugin's ops": {"GEMM": 21.9, "attention": 4.6},
                   "titan_fp4six::grouped_bwd": {"quantize": 11.8, "GEMM": 9.9}},
                  {"titan_fp4six::grouped_bwd": {"calls": 12, "mean_ms": 0.26}},
                  top=[("_quantize_kernel", 240, 12.26), ("nvjet_sm90", 15, 2.31)])


def _rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()[2:]]


def test_kinds_table_puts_the_twin_and_the_recipe_side_by_side():
    rows = _rows(runs.kinds_table(TWIN, RECIPE, ("bf16 twin", "full 4/6 recipe")))
    assert rows[:3] == [["GEMM", "44.0 (151)", "40.5 (151)", "-3.5"], ["quantize", "", "23.6 (140)", "+23.6"],
                        ["attention", "4.6 (24)", "4.6 (24)", "0"]]  # largest first, blank where a kind is absent
    assert rows[3] == ["**step**", "**169.7 ms wall, 161.8 ms kernels, 95% GPU busy, 1,769 kernels**",
                       "**222.6 ms wall, 195.1 ms kernels, 88% GPU busy, 2,692 kernels**", "**+33.3 ms kernels**"]


def test_launched_by_table_names_the_plugin_ops_and_their_calls():
    assert _rows(runs.launched_by_table(RECIPE)) == [
        ["outside the plugin's ops", "GEMM 21.9, attention 4.6 (26.5 ms)"],
        ["`titan_fp4six::grouped_bwd` (12 calls)", "quantize 11.8, GEMM 9.9 (21.7 ms)"]]


def test_speed_sections_from_a_perf_output_directory(tmp_path):
    assert list(runs.speed_sections(tmp_path)) == ["targets"]  # no part run: every row "not measured"
    (tmp_path / "profiles").mkdir()
    stem = "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears"
    (tmp_path / "profiles" / f"{stem}.profile.json").write_text(json.dumps(RECIPE))
    (tmp_path / "profiles" / "deepseek_v3_debugmodel_bf16.profile.json").write_text(json.dumps(TWIN))
    got = runs.speed_sections(tmp_path)
    assert list(got) == ["targets", "debug-profiles", "debug-top-kernels"]
    assert "| GPU busy, DeepSeek-V3 4/6 step (profiler) | 88% (2,692 kernels, wall 222.6 ms) | >= 0.85 | yes |" in (
        got["targets"])
    assert _rows(got["debug-profiles"]) == [
        ["deepseek_v3_debugmodel_bf16", "169.7 ms", "95%", "1,769", "161.8 ms", ""],
        [stem, "222.6 ms", "88%", "2,692", "195.1 ms", "23.6 ms (140)"]]
    assert _rows(got["debug-top-kernels"]) == [["`_quantize_kernel`", "240", "12.26"], ["`nvjet_sm90`", "15", "2.31"]]


def test_compile_parity_table_per_step_and_largest():
    loss = {"nvfp4_eager": [10.1, 9.5, 9.0], "nvfp4_eager_repeat": [10.1, 9.5, 9.0],
            "nvfp4_compile": [10.10004, 9.501, 9.0034], "bf16_eager": [10.2, 9.6, 9.1],
            "bf16_compile": [10.20008, 9.6001]}  # the compiled bf16 run stopped after step 2
    rows = _rows(runs.compile_parity_table(loss))
    assert rows[0] == ["1", "10.10000", "10.10004", "4.0e-05", "0", "10.20000", "10.20008", "8.0e-05"]
    assert rows[2] == ["3", "9.00000", "9.00340", "3.4e-03", "0", "9.10000", "", ""]
    assert rows[3] == ["**largest**", "", "", "3.4e-03", "0", "", "", "1.0e-04"]


def test_parity_rows_and_table():
    rows = runs.parity_rows({1: 10.0, 2: 9.0, 12: 8.0}, {1: 10.0001, 12: 8.004}, nproc=2)
    assert [r["step"] for r in rows] == [1, 2, 12] and rows[0]["loss_2"] == 10.0001
    assert rows[0]["rel_diff"] == pytest.approx(1e-5) and rows[1]["loss_2"] != rows[1]["loss_2"]  # NaN: no step 2
    rows[1].update(loss_2=9.0, abs_diff=0.0, rel_diff=0.0)
    md = runs.parity_table([{"label": "Qwen3 MoE debug, EP 2", "steps": rows, "weight_drift": 0.04},
                            {"steps": rows[:2], "weight_drift": 5e-8}])
    assert _rows(md) == [["Qwen3 MoE debug, EP 2", "3", "1.0e-05", "5.0e-04 (12)", "0.04"],
                         ["-", "2", "1.0e-05", "1.0e-05 (1)", "5e-08"]]


@pytest.fixture
def pages(tmp_path, monkeypatch):
    """Copies of the results pages in a folder results_page writes to."""
    for name in (runs.SPEED, runs.PARITY_PAGE, runs.COMPILE):
        (tmp_path / name).write_text((RESULTS / name).read_text())
    monkeypatch.setattr(results_page, "RESULTS", tmp_path)
    monkeypatch.setattr(results_page, "command_line", lambda: "python -m scripts.runs (under pytest)")
    return tmp_path


def _written(page, name):
    writer, body = sections(page.read_text())[name]
    assert writer == "scripts.runs" and body.startswith("Written by `python -m scripts.runs ")
    return body


def test_every_section_named_in_the_code_is_marked_on_its_page():
    """The section names runs.py writes are the ones its pages mark as scripts.runs's (and no other)."""
    source = (RESULTS.parents[1] / "scripts" / "runs.py").read_text()
    expected = {runs.SPEED: {"targets", "debug-profiles", "debug-top-kernels", *runs.THROUGHPUT_SECTIONS,
                             *(n for names in runs.PROFILE_SECTIONS.values() for n in names), "b200-projection"},
                runs.PARITY_PAGE: set(runs.PARITY_SECTIONS), runs.COMPILE: {"compile-vs-eager"}}
    for page, names in expected.items():
        marked = {n for n, (writer, _) in sections((RESULTS / page).read_text()).items() if writer == "scripts.runs"}
        assert marked == names, page
        assert all(re.search(rf"[\"']{re.escape(n)}[\"']", source) for n in names)


def test_docs_write_their_sections(pages, tmp_path, monkeypatch):
    out = tmp_path / "perf"
    (out / "profiles").mkdir(parents=True)
    (out / "profiles" / "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.profile.json").write_text(
        json.dumps(RECIPE))
    runs.main(["table", str(out), "--docs"])
    speed = pages / runs.SPEED
    assert "| qwen3_moe_debug 4/6 / bf16 | not measured | >= 0.9 | - |" in _written(speed, "targets")
    assert "| `_quantize_kernel` | 240 | 12.26 |" in _written(speed, "debug-top-kernels")
    assert (out / "table.md").is_file()

    twin, recipe = tmp_path / "bf16.profile.json", tmp_path / "full.profile.json"
    twin.write_text(json.dumps(TWIN))
    recipe.write_text(json.dumps(RECIPE))
    runs.main(["compare-profiles", str(twin), str(recipe), "--docs", "full"])
    assert "| kernel kind | bf16: ms (kernels) | full: ms (kernels) | extra ms |" in _written(speed, "full-kinds")
    assert "(12 calls)" in _written(speed, "full-by-op")
    runs.main(["project", str(twin), str(recipe), "--docs"])
    assert "B200 ms (projected)" in _written(speed, "b200-projection")
    assert "Copied by hand" in sections(speed.read_text())["compiled-kinds"][1]  # the others stay as they were

    for name, drift in (("a", 0.04), ("b", 0.13)):
        (tmp_path / name).mkdir()
        steps = runs.parity_rows({1: 8.0, 2: 7.9}, {1: 8.0, 2: 7.9001}, nproc=2)
        (tmp_path / name / "losses.json").write_text(json.dumps({"label": name, "steps": steps,
                                                                 "weight_drift": drift}))
    runs.main(["parity-table", str(tmp_path / "a"), str(tmp_path / "b"), "--docs", "cpu-gloo"])
    body = _written(pages / runs.PARITY_PAGE, "cpu-gloo")
    assert body.endswith("| a | 2 | 1.3e-05 | 1.3e-05 (2) | 0.04 |\n| b | 2 | 1.3e-05 | 1.3e-05 (2) | 0.13 |")
    with pytest.raises(SystemExit):
        runs.main(["parity-table", str(tmp_path / "c"), "--docs", "two-h200"])  # no losses.json there

    # throughput and compile-parity measure before they write: their measurements made up here
    monkeypatch.setattr(runs, "start", lambda run, common, log: log.write_text(
        "[titan] - root - INFO - step:  1  loss: 10.00000\n[titan] - root - INFO - step:  2  loss:  9.50000\n") or run)
    monkeypatch.setattr(runs, "wait", lambda proc, timeout: 0)
    runs.main(["compile-parity", str(tmp_path / "compile"), "--docs"])
    assert "| **largest** | | | 0 | 0 | | | 0 |" in _written(pages / runs.COMPILE, "compile-vs-eager")


def test_rl_signal_table_shows_accuracy_at_its_steps_and_over_the_last_quarter():
    from scripts.runs import rl_signal_table

    trace = [(s, 0.5, s / 100) for s in range(0, 100, 5)] + [(99, 0.5, 0.99)]
    lines = rl_signal_table([("grpo", "0123", 0.01, 100, trace)]).splitlines()
    assert lines[0].startswith("| mode | alphabet (chance) | entropy bonus | step 10 | step 25 |")
    # step 10 and 25: the prints at those steps; 100: the last print (step 99); 150, 200: past the run
    assert lines[2] == "| grpo | `0123` (1/4) | 0.01 | 0.10 | 0.25 | 0.50 | 0.99 |  |  | 0.87 |"
