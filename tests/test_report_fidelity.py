"""`python -m scripts.report fidelity`: the study's paired gaps read back from the compare.json files that
`python -m titan_fp4six.compare` writes, in the verdict table's slice order, and drawn as one forest plot."""

import pytest

from scripts import report
from titan_fp4six.compare.report import VariantSummary, to_json
from titan_fp4six.compare.stats import mean_interval


def _summary(name, gap_bf16=None, gap_nv=None):
    est = lambda d: mean_interval(d) if d else None
    return VariantSummary(name, len(gap_bf16 or [0, 0]), len(gap_bf16 or [0, 0]), None, est(gap_bf16), est(gap_nv),
                          None, 0, None, [])


def _write_slice(study, name, summaries):
    (study / name).mkdir(parents=True)
    (study / name / "compare.json").write_text(to_json(summaries, [], {}))


def test_fidelity_report_reads_every_slice_in_order_and_plots(tmp_path):
    study, docs = tmp_path / "study", tmp_path / "docs"
    (docs / "fidelity").mkdir(parents=True)
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
    report.main(["fidelity", str(study), "--docs", str(docs)])
    assert (docs / "fidelity" / "verdicts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fidelity_report_without_intervals_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no slice under .* has a compare.json"):
        report.main(["fidelity", str(tmp_path), "--docs", str(tmp_path)])
