"""The run drivers of scripts.runs (run specs, throughput summaries and ratios) and the benchmark flavor."""

import pytest
import torch

from scripts import runs
from titan_fp4six.compare.runs import parse_steps

STEP_LINE = ("[titan] 2026-11-30 05:13:41,183 - root - INFO - \x1b[31mstep: {step:2}  \x1b[32mloss: {loss:8.5f}  "
             "\x1b[38;2;180;60;0mgrad_norm:  1.5492  \x1b[38;2;54;234;195mmemory: {mem:5.2f}GiB(4.72%)  "
             "\x1b[34mtps: {tps:,}  \x1b[36mtflops: 0.00  \x1b[35mmfu: {mfu:.2f}%\x1b[39m  four_over_six map4: 0.0508")


def _log(rows):
    lines = ["[titan] ... - root - INFO - Training starts at step 1"]
    lines += [STEP_LINE.format(step=s, loss=l, mem=m, tps=t, mfu=f) for s, l, m, t, f in rows]
    lines.append("[titan] ... - root - INFO - Sleeping 2 seconds for other ranks to complete")
    return "\n".join(lines)


def test_parse_steps_reads_colored_step_lines():
    rows = parse_steps(_log([(1, 8.25, 1.5, 12345, 3.1), (2, 7.5, 2.25, 999, 0.5)]))
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["loss"] == 8.25 and rows[0]["tps"] == 12345 and rows[0]["memory"] == 1.5
    assert rows[1]["mfu"] == 0.5 and rows[1]["grad_norm"] == pytest.approx(1.5492)
    assert rows[1]["map4"] == pytest.approx(0.0508)  # the plugin's extra metric


def test_run_spec_parsing_and_command():
    run = runs.Run.parse("4/6 B448=configs/x.toml --quantize.linear.four_over_six.scale_bound 448")
    assert run.label == "4/6 B448" and run.config == "configs/x.toml"
    assert run.overrides == ["--quantize.linear.four_over_six.scale_bound", "448"]
    assert run.slug == "4_6_B448"
    cmd = runs.command(run, ["--training.steps", "3"])
    assert cmd[1:3] == ["-m", "titan_fp4six.train"] and cmd[-2:] == run.overrides
    with pytest.raises(ValueError, match="LABEL=CONFIG"):
        runs.Run.parse("configs/x.toml")
    with pytest.raises(ValueError, match=".toml"):
        runs.Run.parse("a=--training.steps 3")


def test_throughput_summary_skips_warmup_and_takes_peak_memory():
    rows = parse_steps(_log([(1, 9.0, 10.0, 5, 0.1), (2, 8.0, 30.0, 100, 1.0),
                                        (3, 7.0, 20.0, 120, 1.2), (4, 6.0, 20.0, 110, 1.1)]))
    s = runs.steady_state(rows, warmup=1)
    assert s["tps"] == 110 and s["memory_gib"] == 30.0 and s["mfu"] == pytest.approx(1.1)
    assert runs.steady_state(rows, warmup=4)["tps"] is None


def test_throughput_table_ratios():
    def r(tps, mem):
        return {"tps": tps, "memory_gib": mem, "mfu": 1.0, "exit_code": 0}

    results = {"bf16 | eager": r(1000, 50), "4/6 | eager": r(800, 55), "bf16 | compiled": r(1250, 40),
               "4/6 | compiled": {"tps": None, "memory_gib": None, "exit_code": -15}}
    lines = runs.throughput_table(results).splitlines()
    assert "| bf16 | compiled | 1,250 | 1.00x | 1.25x |" in lines[3]  # grouped by run, then mode
    assert "| 4/6 | eager | 800 | 0.80x | 0.80x | 55.0 | 1.10x |" in lines[4]
    assert "failed (exit -15)" in lines[5]


def test_throughput_repeats_pair_trials_run_back_to_back():
    def t(tps, mem):
        return {"tps": tps, "memory_gib": mem, "mfu": tps and tps / 100, "exit_code": 0}

    # the host slows down in the second repetition: the paired ratios see 0.80 both times, the medians 0.67
    results = {"bf16 | eager": runs.combine([t(1000, 50), t(600, 51)]),
               "4/6 | eager": runs.combine([t(800, 55), t(480, 54)])}
    assert results["4/6 | eager"]["tps"] == 640 and results["4/6 | eager"]["memory_gib"] == 55
    lines = runs.throughput_table(results).splitlines()
    assert "| 4/6 | eager | 640 (trials 480-800) | 0.80x (0.80-0.80) |" in lines[3]
    results["4/6 | eager"] = runs.combine([t(800, 55), t(300, 54), t(None, None)])
    md = runs.throughput_table(results)
    assert "0.65x (0.50-0.80)" in md and "(trials 300-800)" in md  # the failed trial has no pair and no tps


def test_benchmark_flavor_is_30b_a3b_with_four_layers():
    from torchtitan.models.qwen3 import qwen3_args
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_fp4six.integration import flavors

    flavor = get_train_spec("qwen3").model_args[flavors.BENCH_FLAVOR]
    base = qwen3_args["30B-A3B"]
    assert flavor.n_layers == 4 and base.n_layers == 48
    for field in ("dim", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "moe_inter_dim"):
        assert getattr(flavor, field) == getattr(base, field)
    assert flavor.moe_args == base.moe_args and flavor.moe_args is not base.moe_args
    with torch.device("meta"):
        model = get_train_spec("qwen3").model_cls(flavor)
    params = sum(p.numel() for p in model.parameters())
    assert 2.5e9 < params < 4e9  # fp32 weights + grads + AdamW state (16 B/param) stay well under 141 GB


def test_cli_parses_every_subcommand_and_keeps_trainer_overrides():
    p = runs.parser()
    args = p.parse_args(["throughput", "--out", "o", "--run", "bf16=configs/x.toml", "--run", "4/6=configs/y.toml"])
    assert callable(args.handler) and [r.label for r in args.run] == ["bf16", "4/6"]  # --run does not shadow it
    for argv in (["profile", "o", "configs/x.toml"], ["perf", "o", "ops", "debug"], ["table", "o"],
                 ["parity", "--global-batch", "8", "--out", "o"], ["compile-parity", "o"], ["rl-signal", "--mode", "grpo"]):
        assert callable(p.parse_args(argv).handler), argv
    with pytest.raises(SystemExit):
        runs.main(["perf", "o", "bogus"])
