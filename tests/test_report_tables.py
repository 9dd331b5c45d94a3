"""The results tables the report scripts write (scripts/results_page.py): each builder on made-up numbers, and
`--docs` writing into its section of a copy of the page (the pages' folder is monkeypatched to a tmp one), without
touching the sections of other machines or commands."""

import gzip
import json

import pytest

from scripts import report
from scripts.results_page import sections
from tests.helpers.as_module import as_module


def _page(path, *names, writer="scripts.report"):
    """A results page with the given sections, each holding a stale line; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"<!-- begin {n} ({writer}) -->\nstale {n}\n<!-- end {n} -->\n\nprose\n\n" for n in names)
    path.write_text(f"# Page\n\n{body}")
    return path


@pytest.fixture
def docs(tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    (folder / "results").mkdir(parents=True)
    (folder / "fidelity").mkdir()
    monkeypatch.setattr(report, "DOCS", folder)
    return folder


# --- quant-error ------------------------------------------------------------------------------------------------

def test_quant_error_docs_writes_this_machines_section_and_records(docs, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(report.torch.cuda, "is_available", lambda: False)  # the CPU's section, whatever runs this
    page = _page(docs / "results" / "quant_error.md", "quant-error-gpu", "quant-error-cpu")
    out = tmp_path / "out"
    argv = ["quant-error", "--out", str(out), "--no-capture", "--synthetic-size", "32", "--docs"]
    as_module(monkeypatch, "scripts.report", *argv)
    report.main(argv)
    table = (out / "quant_error.md").read_text().strip()
    marked = sections(page.read_text())
    assert marked["quant-error-gpu"] == ("scripts.report", "stale quant-error-gpu")  # another machine's: untouched
    body = marked["quant-error-cpu"][1]
    assert body.startswith("Written by `python -m scripts.report quant-error ") and body.endswith(table)
    assert table.startswith("| config | gaussian | heavy-tailed | outlier-rich |")
    record = json.loads(gzip.decompress((docs / "results" / "quant_error_cpu.json.gz").read_bytes()))
    assert record == json.loads((out / "quant_error.json").read_text())
    assert not (docs / "results" / "quant_error_gpu.json.gz").exists()
    assert not (docs / "results" / "quant_error_ratio.png").exists()  # the page's figures are the GPU run's


def test_quant_error_without_docs_leaves_the_page(docs, tmp_path):
    page = _page(docs / "results" / "quant_error.md", "quant-error-gpu", "quant-error-cpu")
    before = page.read_text()
    pytest.importorskip("matplotlib")
    report.main(["quant-error", "--out", str(tmp_path / "out"), "--no-capture", "--synthetic-size", "32"])
    assert page.read_text() == before and (tmp_path / "out" / "quant_error.md").is_file()
    assert not list((docs / "results").glob("*.gz"))


# --- rl -----------------------------------------------------------------------------------------------------------

def _rl_runs(out, steps=30):
    for k, name in enumerate(report.RL_RUNS):
        (out / name).mkdir(parents=True)
        lines = [{"step": s, "reward": 0.1 + 0.01 * s * (k + 1), "mismatch_max": 0.0 if k == 0 else 1e-5 * s,
                  "mismatch_mean": 0.0 if k == 0 else 1e-6, "mismatch_kl": 0.0, "gen_tps": 1000.0 * (k + 1),
                  "train_tps": 2000.0 * (k + 1)} for s in range(1, steps + 1)]
        (out / name / "rl_metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
        (out / name / "wall.json").write_text(json.dumps({"wall_s": 10 * (k + 1)}))


def test_rl_table_from_made_up_runs(tmp_path):
    _rl_runs(tmp_path)
    text = report.rl_table(report.rl_load(tmp_path), tmp_path)
    rows = text.splitlines()
    assert rows[2] == ("| 4/6 row-scaled, consistent | 30 | 0.205 -> 0.305 | 0 | 0 | 0 | 30/30 | 1,000 | 2,000 | "
                       "10 |")
    assert rows[3].startswith("| 4/6 row-scaled, fast | 30 | 0.310 -> 0.510 | 0.0003 | 1e-06 | 0 | 0/30 | 2,000 |")
    assert rows[-1] == ("Consistent mode costs: generation 0.50x and training 0.50x the fast mode's tokens/s "
                        "(medians over steps 2..N).")


def test_rl_docs_writes_its_section_and_the_figures_beside_the_page(docs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "runs"
    _rl_runs(out)
    page = _page(docs / "results" / "rl.md", "rl-generators", "rl-h200")
    report.main(["rl", str(out)])  # without --docs: figures in OUT, the page as it was
    assert (out / "rl_reward.png").is_file() and "stale rl-h200" in page.read_text()
    report.main(["rl", str(out), "--docs"])
    marked = sections(page.read_text())
    assert marked["rl-generators"][1] == "stale rl-generators"
    body = marked["rl-h200"][1]
    assert body.startswith("Written by `") and "| 4/6 row-scaled, consistent | 30 |" in body
    assert body.endswith("![reward](rl_reward.png)\n\n![mismatch](rl_mismatch.png)")
    assert (docs / "results" / "rl_reward.png").is_file() and (docs / "results" / "rl_mismatch.png").is_file()


# --- per-layer ----------------------------------------------------------------------------------------------------

def _fidelity_record(folder, config, gemms, scale):
    mean = {}
    for key, base in (("fwd_snr_db", 17.5), ("map4_fraction", 0.0), ("mse_x", 0.00876), ("mse_w", 0.0124),
                      ("quantized_dx_cos", 0.9912), ("quantized_dw_cos", 0.9953), ("dequantized_dx_cos", 0.99547),
                      ("dequantized_dw_cos", 0.99672)):
        mean[f"{key}/nvfp4"] = base
        mean[f"{key}/four_over_six"] = base * scale if key != "map4_fraction" else 0.427
    folder.mkdir(parents=True)
    record = {"config": f"configs/{config}", "model": "qwen3", "flavor": "debugmodel_moe",
              "gemms": {f"layers.{i}.moe.experts": {} for i in range(gemms)}, "mean": mean}
    (folder / "fidelity.json").write_text(json.dumps(record))
    return folder


def test_per_layer_table_and_docs(docs, tmp_path, monkeypatch):
    a = _fidelity_record(tmp_path / "a", "base.toml", 24, 1.04)
    b = _fidelity_record(tmp_path / "b", "all.toml", 56, 1.0)
    del_key = json.loads((b / "fidelity.json").read_text())
    del del_key["mean"]["mse_w/nvfp4"]  # a metric the record lacks: "-"
    (b / "fidelity.json").write_text(json.dumps(del_key))
    page = _page(docs / "results" / "fidelity.md", "fidelity-verdicts", "per-layer")
    argv = ["per-layer", str(a), str(b / "fidelity.json"), "--docs"]
    as_module(monkeypatch, "scripts.report", *argv)
    report.main(argv)
    body = sections(page.read_text())["per-layer"][1]
    lines = body.splitlines()
    assert lines[0].startswith("Written by `python -m scripts.report per-layer ")
    assert lines[2] == ("| recipe (model, GEMMs) | fwd SNR dB | map-to-4 | MSE x | MSE w | quantized dX cos | "
                        "quantized dW cos | dequantized dX cos | dequantized dW cos |")
    assert lines[4].startswith("| `base.toml` (qwen3 debugmodel_moe, 24) | 17.50 / 18.20 | 0.000 / 0.427 | "
                               "0.00876 / 0.00911 | 0.0124 / 0.0129 | 0.99120 / ")
    assert lines[5].startswith("| `all.toml` (qwen3 debugmodel_moe, 56) | 17.50 / 17.50 | 0.000 / 0.427 | "
                               "0.00876 / 0.00876 | - | ")
    assert sections(page.read_text())["fidelity-verdicts"][1] == "stale fidelity-verdicts"
    with pytest.raises(SystemExit, match="no fidelity.json"):
        report.main(["per-layer", str(tmp_path / "missing")])


# --- rl_generators -------------------------------------------------------------------------------------------------

def test_rl_generators_table_gives_intervals_over_seeds_and_means_for_one():
    rl_generators = pytest.importorskip("scripts.rl_generators")
    row = lambda v: {"mismatch_max": v, "mismatch_mean": v / 10, "mismatch_kl": v / 100, "logp": -3.5}  # noqa: E731
    results = {s: {"teach_loss": 2.6, "reward": 0.05, "rows": {"native fast": [row(1e-6), row(2e-6)],
                                                                 "vLLM": [row(3e-6), row(3e-6)]}}
               for s in ("row", "tensor")}
    lines = rl_generators.table(results, 2).splitlines()
    assert lines[0].startswith("| activation scaling | generator | max \\|dlogp\\|")
    assert lines[2].startswith("| row | native fast | 1.50e-06 [") and lines[2].endswith("| -3.500 |")
    assert lines[3].startswith("| row | vLLM | 3.00e-06 [3.00e-06, 3.00e-06] |")
    assert lines[-1] == "- tensor: teacher-forced loss 2.600, vLLM rollout reward 0.050, 2 seeds x 64 rollouts"
    one = {s: dict(r, rows={n: ms[:1] for n, ms in r["rows"].items()}) for s, r in results.items()}
    assert rl_generators.table(one, 1).splitlines()[2] == ("| row | native fast | 1.00e-06 | 1.00e-07 | 1.00e-08 | "
                                                           "-3.500 |")
