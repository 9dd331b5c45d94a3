"""`python -m scripts.report fidelity`: the study's paired gaps read back from the compare.json files that
`python -m titan_fp4six.compare` writes, in the verdict table's slice order, drawn as one forest plot, and with
--docs the verdict table and each slice's compare.md written into their sections of docs/results/fidelity.md."""

import pytest

from scripts import report
from scripts.results_page import sections
from tests.helpers.as_module import as_module
from titan_fp4six.compare.report import Outcome, VariantSummary, markdown, summarize, to_json
from titan_fp4six.compare.stats import mean_interval


def _summary(name, gap_bf16=None, gap_nv=None):
    est = lambda d: mean_interval(d) if d else None
    return VariantSummary(name, len(gap_bf16 or [0, 0]), len(gap_bf16 or [0, 0]), None, est(gap_bf16), est(gap_nv),
                          None, 0, None, [])


def _write_slice(study, name, summaries):
    (study / name).mkdir(parents=True)
    (study / name / "compare.json").write_text(to_json(summaries, [], {}))


def test_fidelity_report_reads_every_slice_in_order_and_plots(tmp_path):
    study = tmp_path / "study"
    _write_slice(study, "deepseek_all", [_summary("bf16"), _summary("nvfp4", [0.01, 0.03, 0.02]),
                                         _summary("4/6", [0.0, 0.01, 0.02], [-0.01, -0.02, 0.0])])
    _write_slice(study, "qwen3_base", [_summary("bf16"), _summary("nvfp4", [0.001, 0.002]),
                                       _summary("4/6", [0.003], [0.002])])  # one seed: no interval, left out
    _write_slice(study, "unknown_slice", [_summary("bf16"), _summary("nvfp4", [0.5, 0.6])])  # not a study slice
    rows = report.fidelity_intervals(study)
    assert [(r["slice"], r["gap"]) for r in rows] == [
        ("Qwen3 MoE, RL base point", "NVFP4 - bf16"), ("DeepSeek-V3, all Linears", "4/6 - NVFP4"),
        ("DeepSeek-V3, all Linears", "NVFP4 - bf16"), ("DeepSeek-V3, all Linears", "4/6 - bf16")]
    want = mean_interval([-0.01, -0.02, 0.0])
    assert (rows[1]["mean"], rows[1]["low"], rows[1]["high"], rows[1]["n"]) == (want.mean, want.low, want.high, 3)
    report.main(["fidelity", str(study)])  # without --docs: the figure in the study folder
    assert (study / "verdicts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fidelity_report_without_intervals_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no slice under .* has a compare.json"):
        report.main(["fidelity", str(tmp_path), "--docs"])


BF16 = [3.00, 3.02, 2.98, 3.01, 2.99]
OFFSETS = {"bf16": [0.0] * 5, "nvfp4": [0.001, -0.002, 0.0015, -0.001, 0.0005],
           "4/6": [0.0005, -0.001, 0.0005, -0.0002, 0.0003],  # + nvfp4's: 4/6 - nvfp4 covers 0
           "nvfp4 B256": [0.003, -0.003, 0.0025, -0.002, 0.0015],
           "4/6 B448": [-0.0095, -0.0115, -0.0085, -0.0107, -0.0092]}  # + 4/6's: clearly below 4/6


def _finals(variant):
    total = [b + o for b, o in zip(BF16, OFFSETS[variant])]
    if variant in ("4/6", "4/6 B448"):
        total = [t + o for t, o in zip(total, OFFSETS["nvfp4"])]
    if variant == "4/6 B448":
        total = [t + o for t, o in zip(total, OFFSETS["4/6"])]
    return total


def _study_slice(study, name, variants):
    """A slice folder as compare writes it (compare.json and compare.md) from made-up final losses."""
    outcomes = [Outcome(v, seed, "ok", "", final, {}, {}, []) for v in variants
                for seed, final in enumerate(_finals(v))]
    summaries = summarize(outcomes, variants)
    (study / name).mkdir(parents=True)
    (study / name / "compare.json").write_text(to_json(summaries, outcomes, {}))
    (study / name / "compare.md").write_text(markdown(summaries, outcomes, f"`compare {name}`: setup line."))
    return {(o.variant, o.seed): o.final for o in outcomes}


def test_verdict_table_reads_the_gaps_bounds_and_holm(tmp_path):
    finals = _study_slice(tmp_path, "qwen3_base", list(OFFSETS))
    _study_slice(tmp_path, "deepseek_full", ["bf16", "nvfp4", "4/6"])
    lines = report.fidelity_verdicts(tmp_path).splitlines()
    assert lines[0].startswith("| slice | 4/6 - NVFP4, paired final-loss difference [95% CI] | NVFP4 - bf16 |")
    base, bounds, full = lines[2], lines[3], lines[4]
    gap = mean_interval([finals["4/6", s] - finals["nvfp4", s] for s in range(5)])
    assert base.startswith(f"| Qwen3 MoE, RL base point | {gap.mean:+.4f} [{gap.low:+.4f}, {gap.high:+.4f}] (n=5) | ")
    assert base.endswith("| not distinguishable |")
    bound = mean_interval([finals["4/6 B448", s] - finals["4/6", s] for s in range(5)])
    assert bound.high < 0  # the made-up data's point: a bound comparison compare's table does not hold
    assert bounds.startswith("| Qwen3 MoE, RL base point, variants against their base | nvfp4 B256 - nvfp4: ")
    assert f"4/6 B448 - 4/6: {bound.mean:+.4f} [{bound.low:+.4f}, {bound.high:+.4f}] (n=5) | | |" in bounds
    assert bounds.endswith("| 4/6 B448 - 4/6: lower (p = " + bounds.split("(p = ")[1].split(")")[0]
                           + "), kept by Holm over the slice's 8 intervals |")  # compare's 7 + this one
    assert full.startswith("| DeepSeek-V3, full recipe |") and full.endswith("| not distinguishable |")
    others = lines[lines.index("Other paired intervals that exclude 0 on their own:") + 1:]
    assert [o.split(": ")[1].split(" ")[:4] for o in others] == [["4/6", "B448", "-", "bf16"],
                                                                  ["4/6", "B448", "-", "nvfp4"]]
    assert all("kept by Holm" in o for o in others)


def test_verdict_names_intervals_holm_does_not_keep():
    family = [{"comparison": "a - b", "p": 0.04, "holm": False}, {"comparison": "c - b", "p": 0.5, "holm": False}]
    row = [("a - b", {"mean": -1.0, "low": -2.0, "high": -0.1, "n": 5}),
           ("c - b", {"mean": 0.1, "low": -1.0, "high": 1.2, "n": 5})]
    assert report._verdict(row, family) == "a - b: lower (p = 0.04), not kept by Holm over the slice's 2 intervals"
    assert report._verdict(row[1:], family) == "not distinguishable"


def test_fidelity_docs_writes_the_verdicts_and_each_slices_compare_md(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    study, docs = tmp_path / "study", tmp_path / "docs"
    _study_slice(study, "qwen3_base", list(OFFSETS))
    _study_slice(study, "qwen3_all", ["bf16", "nvfp4", "4/6"])
    (docs / "results").mkdir(parents=True)
    (docs / "fidelity").mkdir()
    page = docs / "results" / "fidelity.md"
    page.write_text("".join(f"## {n}\n\n<!-- begin {n} (scripts.report) -->\nold\n<!-- end {n} -->\n\n"
                            for n in ("fidelity-verdicts", "qwen3_base", "deepseek_base", "qwen3_all")))
    monkeypatch.setattr(report, "DOCS", docs)
    as_module(monkeypatch, "scripts.report", "fidelity", str(study), "--docs")
    report.main(["fidelity", str(study), "--docs"])
    marked = sections(page.read_text())
    assert marked["deepseek_base"][1] == "old"  # no slice folder: its section stays as it was
    for name in ("qwen3_base", "qwen3_all"):
        body = marked[name][1]
        assert body.startswith("Written by `python -m scripts.report fidelity ") and body.endswith((study / name / "compare.md").read_text()
                                                                             .strip())
    assert marked["fidelity-verdicts"][1].split("\n\n", 1)[1] == report.fidelity_verdicts(study).strip()
    assert (docs / "fidelity" / "verdicts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (study / "verdicts.png").exists()
