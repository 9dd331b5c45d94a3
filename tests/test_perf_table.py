"""`python -m scripts.runs table`: the performance table from a `perf` output directory."""

import json

from scripts import runs


def _run(tps, mem, *more_tps):
    trials = [{"tps": t, "memory_gib": mem} for t in (tps, *more_tps)]
    return {"tps": tps, "memory_gib": mem, "trials": trials}


def test_rows_ratios_targets_and_parts_not_run(tmp_path):
    (tmp_path / "debug_qwen3").mkdir()
    (tmp_path / "debug_qwen3" / "throughput.json").write_text(json.dumps({"results": {
        "Qwen3 MoE bf16 | eager": _run(100.0, 10.0, 120.0), "Qwen3 MoE 4/6 | eager": _run(93.0, 10.2, 102.0)}}))
    (tmp_path / "30b").mkdir()
    (tmp_path / "30b" / "throughput.json").write_text(json.dumps({"results": {
        "bf16 | eager": _run(50.0, 40.0), "4/6 experts | eager": _run(49.0, 42.4),
        "bf16 | compiled": _run(60.0, 30.0), "4/6 experts | compiled": _run(54.0, 30.0)}}))
    (tmp_path / "ops.json").write_text(json.dumps({"rows": [
        {"name": "1024^3 linear fwd+bwd 4/6 quantized (ms)", "value": 0.2, "ratio": 1.9},
        {"name": "public four_over_six_quantize 1024x1024 back to back (us/call)", "value": 25.0, "ratio": None}]}))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.profile.json").write_text(
        json.dumps({"gpu_busy": 0.5, "kernels": 3000, "wall_ms": 150.0}))
    md, bars = runs.build_table(tmp_path)
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in md.splitlines()[2:]}
    # paired per repetition: 0.93 and 0.85, median 0.89
    assert rows["qwen3_moe_debug 4/6 / bf16"] == ["0.89 (pairs 0.93, 0.85)", ">= 0.9", "no |"]
    assert rows["30B-A3B-4layers experts / bf16, eager"] == ["0.98", ">= 0.95", "yes |"]
    assert rows["30B-A3B-4layers experts / bf16, compiled"][2] == "no |"  # 0.90 < 0.92
    assert rows["1024^3 fwd+bwd / bf16, quantized"] == ["1.9x", "<= 2", "yes |"]
    assert rows["1024^3 fwd+bwd / bf16, dequantized"][0] == "not measured"
    assert rows["deepseek_v3_debugmodel 4/6 all Linears / bf16"][0] == "not measured"
    assert rows["GPU busy, DeepSeek-V3 4/6 step (profiler)"][0].startswith("50%") and rows[
        "GPU busy, DeepSeek-V3 4/6 step (profiler)"][2] == "no |"
    assert rows["public quantize 1024x1024, host us per call"] == ["25.0", "<= 20", "no |"]
    assert rows["peak memory / bf16 (largest of the recipes)"] == ["1.06", "<= 1.05", "no |"]  # 30B eager 42.4/40
    assert len(bars) == 7 and all(b[2] == (b[1] >= 1) for b in bars)


def test_profile_step_times_kernels_by_kind_and_by_the_op_that_launched_them():
    from scripts.runs import kernel_kind, profile_step

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": 1, "args": args}

    events = [x("ProfilerStep#9", "user_annotation", 0, 1000),
              x("titan_fp4six::dense_fwd", "user_annotation", 100, 200),
              x("titan_fp4six quantize x", "user_annotation", 140, 20),
              x("cuLaunchKernelEx", "cuda_driver", 150, 5, correlation=1),
              x("cudaLaunchKernel", "cuda_runtime", 160, 5, correlation=2),
              x("cudaLaunchKernel", "cuda_runtime", 500, 5, correlation=3),
              x("_quantize_kernel", "kernel", 200, 40, correlation=1),
              x("nvjet_sm90_tst_192x192", "kernel", 240, 100, correlation=2),
              x("void at::native::direct_copy_kernel_cuda", "kernel", 600, 60, correlation=3),
              x("aten::to", "cpu_op", 480, 40), x("aten::copy_", "cpu_op", 490, 20, **{"Input Dims": [[8, 4], [8, 4]]}),
              x("aten::add", "cpu_op", 470, 5)]
    s = profile_step(events)
    assert s["kinds"] == {"GEMM": {"count": 1, "ms": 0.1}, "copies/casts": {"count": 1, "ms": 0.06},
                          "quantize": {"count": 1, "ms": 0.04}}
    assert s["kernel_ms_by_op"] == {"titan_fp4six::dense_fwd": {"GEMM": 0.1, "quantize": 0.04},
                                    "outside the plugin's ops": {"copies/casts": 0.06}}
    assert s["gpu_busy"] == 0.2 and kernel_kind("_rht16_columns_kernel") == "RHT"
    assert s["top_launching_ops"] == [  # the innermost op running at each launch, the others by time
        {"kind": "GEMM", "op": "no op", "count": 1, "ms": 0.1},
        {"kind": "copies/casts", "op": "aten::copy_ [[8, 4], [8, 4]]", "count": 1, "ms": 0.06},
        {"kind": "quantize", "op": "no op", "count": 1, "ms": 0.04}]
    assert s["quantize_launches"] == [{"op": "titan_fp4six::dense_fwd", "role": "x", "grid": None, "ts": 200,
                                       "us": 40}]
    assert set(s["host_ops"]) == {"titan_fp4six::dense_fwd"}  # the role's range is no op of its own


def test_blackwell_projection_scales_each_kernel_by_what_bounds_it():
    """project_step: bf16 GEMMs by the bf16 throughput ratio, the plugin's forward GEMMs by FP4, the grouped
    backward's half and half (its wgrad stays bf16), memory-bound kernels by bandwidth, and the quantize kernels
    feeding FP4 GEMMs without their decode writes."""
    bf16 = runs.H200["bf16"] / runs.B200["bf16"]
    fp4 = runs.H200["bf16"] / runs.B200["fp4"]
    memory = runs.H200["bandwidth"] / runs.B200["bandwidth"]
    got = runs.project_step({
        "outside the plugin's ops": {"GEMM": 10.0, "copies/casts": 4.0, "attention": 2.0},
        "titan_fp4six::grouped_fwd": {"GEMM": 8.0, "quantize": 3.0},
        "titan_fp4six::grouped_bwd": {"GEMM": 6.0, "quantize": 6.0, "decode": 1.0}})
    plugin = "plugin GEMMs (FP4, the grouped wgrad bf16)"
    assert abs(got["GEMM"] - 10.0 * bf16) < 1e-12 and abs(got["attention"] - 2.0 * bf16) < 1e-12
    assert abs(got[plugin] - (8.0 * fp4 + 3.0 * fp4 + 3.0 * bf16)) < 1e-12
    assert abs(got["copies/casts"] - 4.0 * memory) < 1e-12 and abs(got["decode"] - memory) < 1e-12
    share = runs.DECODE_SHARE
    assert abs(got["quantize"] - (3.0 * memory * (1 - share) + 6.0 * memory * (1 - share / 3))) < 1e-12
    assert 0.4 < share < 0.5  # 2 of the 4.5625 bytes per element a bf16 quantize-with-decode moves
    halved = runs.project_step({"titan_fp4six::grouped_bwd": {"quantize": 6.0}}, dgrad_share=0.5)
    assert abs(halved["quantize"] - 6.0 * memory * (1 - share / 2)) < 1e-12


def test_the_dgrad_share_of_the_grouped_quantize_comes_from_the_launches_roles():
    """The grouped backward's dy share of its quantize time, from the profile's launches (the w1/w3 op quantizes
    two dy per x^T); a third for a profile whose launches carry no role."""
    def launch(role, us, op="titan_fp4six::grouped_bwd"):
        return {"op": op, "role": role, "grid": [1, 1, 1], "ts": 0, "us": us}
    profile = {"quantize_launches": [launch("dy", 10), launch("dy_t", 20), launch("dy", 10), launch("dy_t", 20),
                                     launch("x_t", 40), launch("dy", 99, "titan_fp4six::dense_bwd")]}
    assert runs.dgrad_quantize_share(profile) == 20 / 100
    assert runs.dgrad_quantize_share({"quantize_launches": [launch(None, 5)]}) == 1 / 3
    assert runs.dgrad_quantize_share({}) == 1 / 3


def test_quantize_launches_pair_one_by_one_within_each_op():
    """compare-profiles' launches table: the i-th quantize launch of an op in one step against the i-th in the
    other, summed by op, operand role and grid, the largest extra first; no table when the launches do not
    pair."""
    def step(durations):
        return {"quantize_launches": [{"op": op, "role": role, "grid": grid, "ts": i, "us": us}
                                      for i, (op, role, grid, us) in enumerate(durations)]}

    bwd, fwd = "titan_fp4six::grouped_bwd", "titan_fp4six::dense_fwd"
    plain = step([(bwd, "dy_t", [8, 1, 1], 100), (bwd, "x_t", [8, 1, 1], 50), (fwd, "x", [2, 1, 1], 10)])
    fos = step([(bwd, "dy_t", [8, 1, 1], 110), (bwd, "x_t", [8, 1, 1], 150), (fwd, "x", [2, 1, 1], 12)])
    lines = runs.launches_table(plain, fos, ("NVFP4", "4/6")).splitlines()
    assert lines[0] == "| op | operand | grid | launches | NVFP4 ms | 4/6 ms | extra ms | ratio |"
    assert lines[2] == "| grouped_bwd | x_t | [8, 1, 1] | 1 | 0.05 | 0.15 | +0.1 | 3.00x |"  # one grid, two roles
    assert len(lines) == 5
    assert runs.launches_table(plain, step([(fwd, "x", [2, 1, 1], 12)]), ("a", "b")) == ""
    older = {"quantize_launches": [{k: v for k, v in q.items() if k != "role"} for q in fos["quantize_launches"]]}
    assert "| grouped_bwd | - | [8, 1, 1] | 2 |" in runs.launches_table(plain, older, ("a", "b"))
