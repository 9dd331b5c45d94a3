"""scripts.bench's results tables: the markdown its *_table functions build from measured numbers (made-up numbers
here, on the CPU), and its --docs runs writing them into their sections of docs/results/ (a copy of the page)."""

import argparse
import itertools
import json
import re
import shutil

import pytest
import torch

from scripts import bench, results_page
from scripts.results_page import RESULTS, sections
from tests.helpers.as_module import as_module


def test_quantize_table():
    case = {"case": (16384, 7168, "tensor", "1x16"), "fos": 0.138, "copy": 0.0769, "ref": 25.9, "nvfp4": 0.082,
            "fused": 0.1766, "exact": True}
    table = bench.quantize_table([case, {**case, "case": (8192, 5120, "row", "16x16"), "exact": False}], (0.767, 0.137))
    assert table.splitlines() == [
        "| case | 4/6 time | % of copy bandwidth | vs reference | NVFP4 kernel | 4/6 / NVFP4 | fused / quantize | "
        "bitwise |",
        "|---|---|---|---|---|---|---|---|",
        "| 16384x7168 tensor, 1x16 | 0.138 ms | 55.7% | 188x | 0.082 ms | 1.68 | 1.28 | True |",
        "| 8192x5120 row, 16x16 | 0.138 ms | 55.7% | 188x | 0.082 ms | 1.68 | 1.28 | False |",
        "",
        "16384x7168 1x16 with every chunk on the exact path (amax 1e-30): 0.767 ms, 5.6x the fast path.",
    ]
    assert "exact path" not in bench.quantize_table([case])


def _operands(copy_pct, exact=True):
    """operand_kernels' result with every kernel at copy_pct of copy bandwidth in 0.1 ms."""
    return {name: {"ms": 0.1, "copy": copy_pct / 100 * 0.1, "unfused": 1.0, "exact": exact}
            for name in ("rht", "nv", "nvsr", "colnv", "colnvsr")}


def test_operands_table():
    table = bench.operands_table({(16384, 7168): _operands(61.5), (4100, 2048): _operands(49.0)})
    lines = table.splitlines()
    assert lines[:2] == ["| workload | measured | target | met |", "| --- | --- | --- | --- |"]
    assert lines[2] == ("| `rht16_columns` (wgrad_rht), % of copy bandwidth at 16384x7168 / 4100x2048 | 61.5 / 49.0% | "
                        ">= 50% | no |")
    assert lines[3] == ("| NVFP4 stochastic-rounding quantize, % of copy at 16384x7168 / 4100x2048 | 61.5 / 49.0% "
                        "(0.100 / 0.100 ms; round to nearest 0.100 / 0.100) | >= 50% | no |")
    assert lines[4].startswith("| the same, columnwise (x^T read in place: the wgrad's `Q_col(dy)`) | 61.5 / 49.0% "
                               "(0.100 / 0.100 ms); columnwise round to nearest 61.5 / 49.0% (0.100 / 0.100 ms) |")
    assert lines[-1].endswith(": yes.")
    inexact = {(16384, 7168): _operands(60.0),
               (8192, 5120): {**_operands(60.0), "nvsr": _operands(60.0, False)["nvsr"]}}
    table = bench.operands_table(inexact)
    assert "| >= 50% | yes |" in table and table.splitlines()[-1].endswith(": no (nvsr).")


def test_columns_table_bolds_each_kernels_shipped_launch():
    shipped = {"NVFP4": (16, 4, 8, 2, None), "4/6 + decode": (8, 4, 8, 1, None)}
    rows = [((8, 4, 8, 1), {"NVFP4": (0.2, 0.1), "4/6 + decode": (0.125, 0.1)}, True),
            ((16, 4, 8, 2, 80), {"NVFP4": (0.1, 0.06), "4/6 + decode": (0.4, 0.1)}, True),
            ((16, 4, 8, 2), {"NVFP4": (0.1, 0.06), "4/6 + decode": (0.4, 0.1)}, True),
            ((32, 1, 4, 1), {"NVFP4": (0.5, 0.1), "4/6 + decode": (0.5, 0.1)}, False),
            ("shipped, element loads", {"NVFP4": (0.125, 0.06), "4/6 + decode": (0.2, 0.1)}, True)]
    assert bench.columns_table(4100, 2048, shipped, rows).splitlines() == [
        "4100x2048 bf16 x, columnwise (x^T, 2048x4112); shipped launches in bold: NVFP4 16 x 4, 2; 4/6 + decode "
        "8 x 4, 1.",
        "",
        "| columns x blocks per warp, warps[, register cap] | NVFP4: % of copy (ms) | 4/6 + decode: % of copy (ms) | "
        "bitwise |",
        "|---|---|---|---|",
        "| 8 x 4, 1 | 50.0% (0.200) | **80.0% (0.125)** | True |",
        "| 16 x 4, 2, 80 registers | 60.0% (0.100) | 25.0% (0.400) | True |",
        "| 16 x 4, 2 | **60.0% (0.100)** | 25.0% (0.400) | True |",
        "| 32 x 1, 1, 4 chunks | 20.0% (0.500) | 20.0% (0.500) | False |",
        "| shipped, element loads | 48.0% (0.125) | 50.0% (0.200) | True |",
    ]


def test_prologue_tables():
    rows = [("w1/w3", "forward: x rows (4/6)", 0.25, 0.2), ("w1/w3", "dgrad: decode of W's tiles", 0.5, 0.0),
            ("w2", "forward: x rows (4/6)", 1.0, 0.5)]
    assert bench.prologue_operands_table(rows).splitlines() == [
        "| GEMM | operand | with bf16 decode (ms) | without (ms) | decode's share |",
        "| --- | --- | --- | --- | --- |",
        "| w1/w3 | forward: x rows (4/6) | 0.250 | 0.200 | 20% |",
        "| w1/w3 | dgrad: decode of W's tiles | 0.500 | 0.000 | 100% |",
        "| w2 | forward: x rows (4/6) | 1.000 | 0.500 | 50% |",
        # one layer: w1 and w3 (the first shape's rows; their shared x once) and w2: 0.25 + 2 * 0.5 + 1.0 = 2.25
        # against 0.2 + 0 + 0.5
        "| one layer | w1 and w3 at the first shape (their shared x once), w2 at the second | 2.250 | 0.700 | 69% |",
    ]
    gemms = [("w1/w3", 65536, 2048, 768, 0.322, 0.396, (128, 256, 64, 8, 3), 0.387)]
    assert bench.prologue_gemm_table(gemms).splitlines() == [
        *bench.PROLOGUE_GEMM_HEADER.splitlines(),
        "| w1/w3 65536 x 2048 x 768 | 0.322 | 0.396 (128, 256, 64, 8, 3) | 1.23x | 0.387 |",
    ]


def test_layouts_table_takes_each_layouts_worst_ratio():
    rows = "rows, per-tensor amax (dense x)"
    tiles = "16x16 tiles (weights)"
    big = {(rows, True): {"fos": 0.23, "nvfp4": 0.2}, (rows, False): {"fos": 0.1, "nvfp4": 0.08},
           (tiles, True): {"fos": 0.22, "nvfp4": 0.2}, (tiles, False): {"fos": 0.088, "nvfp4": 0.08}}
    small = {**big, (rows, True): {"fos": 0.05, "nvfp4": 0.04}}
    assert bench.layouts_table({(16384, 7168): big, (8192, 5120): small}).splitlines() == [
        "| layout (4/6 / plain NVFP4 kernel time at 16384x7168 / 8192x5120) | with the decode (Hopper) | without "
        "(Blackwell) | target | met with / without the decode |",
        "| --- | --- | --- | --- | --- |",
        # 0.05 / 0.04 = 1.25x at the second shape: the layout misses the target though 1.15x at the first
        "| rows, per-tensor amax (dense x) | 1.15x / 1.25x (0.230 vs 0.200 ms / 0.050 vs 0.040 ms) | 1.25x / 1.25x "
        "(0.100 vs 0.080 ms / 0.100 vs 0.080 ms) | <= 1.15x | no (1.250x) / no (1.250x) |",
        "| 16x16 tiles (weights) | 1.10x / 1.10x (0.220 vs 0.200 ms / 0.220 vs 0.200 ms) | 1.10x / "
        "1.10x (0.088 vs 0.080 ms / 0.088 vs 0.080 ms) | <= 1.15x | yes / yes |",
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layout_kernels_time_each_layout_against_its_twin():
    out = bench.layout_kernels(1024, 512, 2, 1)
    assert set(out) == {(name, decode) for decode in (True, False) for name in (
        "rows, per-tensor amax (dense x)", "rows, per-group amax (grouped x)", "16x16 tiles (weights)",
        "16x16 tiles, one amax per expert (expert weights)", "the same, map-to-4 blocks counted (a logged step's)",
        "columns (dense x^T, wgrad)", "token blocks (grouped x^T, wgrad)",
        "token blocks, routed groups padded with zero rows", "token blocks, 128 routed groups of skewed sizes, padded")}
    assert all(r["fos"] > 0 and r["nvfp4"] > 0 for r in out.values())


def test_gemm_table():
    modes = list(bench.GEMM_MODES)
    dense = {"shape": "dsv3 attn wq_a 7168->1536, 8192 tokens", "bf16": (0.8, 0),
             **{mode: (0.8 * (i + 2), 10 if i == 0 else 0) for i, mode in enumerate(modes)}}
    grouped = {"shape": "qwen3 experts w1, 65536 rows", "bf16": (1.0, 2), modes[-1]: (16.8, 11)}
    lines = bench.gemm_table([dense, grouped]).splitlines()
    assert lines[0] == "| shape | bf16 ms | " + " | ".join("4/6 " + mode for mode in modes) + " |"
    assert lines[1] == "| --- | --- |" + " --- |" * len(modes)
    assert lines[2] == ("| dsv3 attn wq_a 7168->1536, 8192 tokens | 0.800 | 2.0x (10 syncs) | 3.0x | 4.0x | 5.0x | "
                        "6.0x |")
    assert lines[3] == "| qwen3 experts w1, 65536 rows | 1.000 (2 syncs) | - | - | - | - | 16.8x (11 syncs) |"


def test_cache_weights_table():
    cache = {"high_precision": (0.349, 0.294), "quantized": (0.692, 0.499), "dequantized": (0.421, 0.343)}
    assert bench.cache_weights_table(1024, cache).splitlines() == [
        "| 1024^3 fwd+bwd | quantized | dequantized | high_precision |",
        "| --- | --- | --- | --- |",
        "| weight quantized in the forward | 0.692 ms | 0.421 ms | 0.349 ms |",
        "| weight cached (a micro-batch after the first) | 0.499 ms (-28%) | 0.343 ms (-19%) | 0.294 ms (-16%) |",
    ]


def _ops_json(bf16_host, kernel_ms, extra=None):
    rows = [{"name": "1024^3 linear fwd+bwd bf16 host (us)", "value": bf16_host, "unit": "us", "ratio": None},
            {"name": "four_over_six_quantize 8192x5120: the kernel alone (ms)", "value": kernel_ms, "unit": "ms",
             "ratio": None}]
    return {"device": "NVIDIA H200", "rows": rows + ([extra] if extra else [])}


def test_compare_table_least_range_and_ratio():
    before = [_ops_json(182.0, 0.057), _ops_json(85.2, 0.058)]
    after = [_ops_json(89.4, 0.056), _ops_json(376.0, 0.0571),
             _ops_json(100.0, 0.06, {"name": "new row (us)", "value": 5.0, "unit": "us", "ratio": None})]
    assert bench.compare_table(before, after).splitlines() == [
        "| row | before: least (range), 2 runs | after: least (range), 3 runs | after / before (least) |",
        "| --- | --- | --- | --- |",
        "| 1024^3 linear fwd+bwd bf16 host (us) | 85 (85-182) | 89 (89-376) | 1.05 |",
        "| four_over_six_quantize 8192x5120: the kernel alone (ms) | 0.057 (0.057-0.058) | 0.056 (0.056-0.060) | "
        "0.98 |",
        "| new row (us) | - | 5 (5-5) | - |",
    ]


# --- the --docs runs, into a copy of the page ------------------------------------------------------------------

@pytest.fixture
def results(tmp_path, monkeypatch):
    """docs/results/ as a temporary copy, where write_section writes: {page: its text before}."""
    pages = {}
    for page in (bench.KERNELS_PAGE, bench.SPEED_PAGE):
        shutil.copy(RESULTS / page, tmp_path / page)
        pages[page] = (tmp_path / page).read_text()
    monkeypatch.setattr(results_page, "RESULTS", tmp_path)
    return pages


def test_docs_refuses_a_smoke_run():
    args = argparse.Namespace(quick=True)
    problem = bench.docs_run_problem(args)
    assert problem == ("--quick shapes are a smoke test, not the table's shapes" if torch.cuda.is_available()
                       else "the tables are GPU measurements and this machine has no CUDA device")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            bench.main(["ops", "--docs"])


def _run(monkeypatch, *argv):
    """bench.main(argv) as `python -m scripts.bench ARGV` runs it (the provenance line names that command); the
    smoke runs here write into a copy of the page, so the guard against smoke runs on the real one is lifted."""
    monkeypatch.setattr(bench, "docs_run_problem", lambda args: None)
    as_module(monkeypatch, "scripts.bench", *argv)
    bench.main(list(argv))


def _outside(text, name):
    """The page with section `name`'s body cut out: what a --docs run must leave as it was."""
    return re.sub(rf"(<!-- begin {re.escape(name)} \(scripts\.bench\) -->\n).*?(<!-- end {re.escape(name)} -->)",
                  r"\1\2", text, flags=re.S)


def _written(results, page, name):
    text = (results_page.RESULTS / page).read_text()
    assert _outside(text, name) == _outside(results[page], name)
    writer, body = sections(text)[name]
    assert writer == "scripts.bench" and body.startswith("Written by `python -m scripts.bench ")
    return body


def test_compare_docs_writes_its_section(results, tmp_path, monkeypatch):
    files = {}
    for name, doc in {"b0": _ops_json(85.0, 0.057), "a0": _ops_json(89.0, 0.056)}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    _run(monkeypatch, "compare", "--before", str(files["b0"]), "--after", str(files["a0"]), "--docs")
    body = _written(results, bench.SPEED_PAGE, "ops-compare")
    assert body.endswith("| 1024^3 linear fwd+bwd bf16 host (us) | 85 (85-85) | 89 (89-89) | 1.05 |\n"
                         "| four_over_six_quantize 8192x5120: the kernel alone (ms) | 0.057 (0.057-0.057) | "
                         "0.056 (0.056-0.056) | 0.98 |")


@pytest.fixture
def fake_times(monkeypatch):
    """bench's timers without running what they time: gpu_ms returns 1, 2, 3, ... ms, host_us 7 us."""
    count = itertools.count(1)
    monkeypatch.setattr(bench, "gpu_ms", lambda fn, iters, warmup=3: float(next(count)))
    monkeypatch.setattr(bench, "host_us", lambda fn, iters: 7.0)
    monkeypatch.setattr(bench, "_host_syncs", lambda step: 0)


def test_ops_docs_writes_its_section(results, fake_times, monkeypatch):
    from titan_fp4six.quant.process_state import MAP4_STATS

    monkeypatch.setattr(MAP4_STATS, "enabled", MAP4_STATS.enabled)  # cmd_ops turns counting off, as training does
    try:
        _run(monkeypatch, "ops", "--size", "16", "--iters", "1", "--docs")
    finally:
        torch.autograd.set_multithreading_enabled(True)  # cmd_ops runs the backward on the calling thread
    body = _written(results, bench.SPEED_PAGE, "ops-cache-weights")
    # gpu_ms: bf16 1, then per mode the op and the op with the weight cached: 2, 3 / 4, 5 / 6, 7
    assert body.splitlines()[2:] == [
        "| 16^3 fwd+bwd | quantized | dequantized | high_precision |", "| --- | --- | --- | --- |",
        "| weight quantized in the forward | 2.000 ms | 4.000 ms | 6.000 ms |",
        "| weight cached (a micro-batch after the first) | 3.000 ms (+50%) | 5.000 ms (+25%) | 7.000 ms (+17%) |"]
    assert body.startswith("Written by `python -m scripts.bench ops --size 16 --iters 1 --docs` on ")


def test_gemm_docs_writes_its_section(results, fake_times, monkeypatch):
    _run(monkeypatch, "gemm", "--quick", "--docs")
    lines = _written(results, bench.SPEED_PAGE, "gemm").splitlines()
    assert lines[4:6] == ["| quick dense, 256 tokens | 1.000 | 2.0x | 3.0x | 4.0x | 5.0x | 6.0x |",
                          "| quick grouped, 512 rows | 7.000 | 1.1x | 1.3x | 1.4x | 1.6x | 1.7x |"]


def test_kernels_docs_refuses_a_part_without_a_table(monkeypatch):
    monkeypatch.setattr(bench, "docs_run_problem", lambda args: None)
    with pytest.raises(SystemExit, match="no results page has its table"):
        bench.main(["kernels", "--only", "epilogue", "--docs"])


def test_every_section_bench_writes_is_on_its_page():
    source = (RESULTS.parents[1] / "scripts" / "bench.py").read_text()
    written = set(re.findall(r"write_section\((\w+_PAGE), \"([\w-]+)\"", source))
    written |= {(page, name) for parts in bench.KERNELS_DOCS.values() for page, name in parts}
    pages = {"KERNELS_PAGE": bench.KERNELS_PAGE, "SPEED_PAGE": bench.SPEED_PAGE}
    on_pages = {(page, name) for page in pages.values()
                for name, (writer, _) in sections((RESULTS / page).read_text()).items() if writer == "scripts.bench"}
    assert {(pages.get(page, page), name) for page, name in written} == on_pages
