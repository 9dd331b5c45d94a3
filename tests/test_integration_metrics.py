"""MFU peak selection (bf16 for emulated GEMMs, mixed FP4/bf16 on Blackwell) and the map-to-4 metric."""

import logging
import time
from types import SimpleNamespace

import pytest
import torch
from torchtitan.components.metrics import BaseLogger, DeviceMemStats, MetricsProcessor
from torchtitan.tools.utils import NoColor

from tests.helpers.integration_helpers import SMALL_DEEPSEEK, build_model, convert, job_config
from titan_fp4six.integration import metrics
from titan_fp4six.modules import FourOverSixLinear
from titan_fp4six.modules.experts import _FourOverSixExperts
from titan_fp4six.ops import FourOverSixRecipe
from titan_fp4six.quant import backends
from titan_fp4six.quant.process_state import MAP4_STATS


def test_emulated_gemms_use_the_bf16_peak():
    peak = metrics.select_peak("NVIDIA H200", 989e12, 1e9, 0)
    assert peak.flops == 989e12 and "bf16 peak" in peak.description and "emulated" in peak.description


def test_blackwell_mixes_fp4_and_bf16_peaks():
    peak = metrics.select_peak("NVIDIA B200", 2.25e15, 1e9, 0.5e9)
    # half the FLOPs at 9e15 and half at 2.25e15: time per FLOP is the mean of the inverses
    assert peak.flops == pytest.approx(1 / (0.5 / 9e15 + 0.5 / 2.25e15))
    assert "mixed peak" in peak.description and "50.0%" in peak.description
    gb = metrics.select_peak("NVIDIA GB200", 2.5e15, 1e9, 1e9)
    assert gb.flops == pytest.approx(10e15)
    unknown = metrics.select_peak("NVIDIA B300", 2.25e15, 1e9, 0.5e9)
    assert unknown.flops == 2.25e15 and "no FP4 peak known" in unknown.description


@pytest.mark.parametrize("recipe, grouped, expected", [
    (FourOverSixRecipe(), False, 6),  # auto -> quantized backward: forward, dgrad, wgrad all NVFP4
    (FourOverSixRecipe(backward="high_precision"), False, 2),
    (FourOverSixRecipe(), True, 2),  # grouped backward is bf16
    (FourOverSixRecipe(activation_scaling="row"), False, 2),  # forward native, row factors on its bf16 output
    (FourOverSixRecipe(backward="quantized", activation_scaling="row"), False, 6),
    (FourOverSixRecipe(backward="quantized"), True, 4),  # forward and dgrad native; the grouped wgrad emulated
])
def test_fp4_flops_per_param(recipe, grouped, expected):
    assert metrics.fp4_flops_per_param(recipe, grouped) == expected


def test_converters_account_the_quantized_flops(monkeypatch, on_mocked_blackwell):
    monkeypatch.setattr(metrics, "_tracked", {})
    job = job_config()
    model, args = build_model("deepseek_v3", job, **SMALL_DEEPSEEK)
    convert(model, job)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, FourOverSixLinear))
    experts = [m for m in model.modules() if isinstance(m, _FourOverSixExperts)]
    active = sum((m.w1.numel() + m.w2.numel() + m.w3.numel()) * args.moe_args.top_k // m.num_experts
                 for m in experts)
    assert linear > 0 and active > 0
    assert metrics.fp4_flops_per_token(on_mocked_blackwell) == 6 * linear + 2 * active
    assert metrics.fp4_flops_per_token(torch.device("cpu")) == 0  # emulated there


class _Recorder(BaseLogger):
    def __init__(self):
        self.logged = []

    def log(self, metrics, step):
        self.logged.append((step, metrics))


def _processor(device_name, bf16_peak, flops_per_token):
    p = MetricsProcessor.__new__(MetricsProcessor)  # no device: set what log() reads
    stats = DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)
    p.logger, p.job_config, p.color = _Recorder(), job_config(), NoColor()
    p.parallel_dims = SimpleNamespace(non_data_parallel_size=1, fsdp_enabled=False)
    p.device_memory_monitor = SimpleNamespace(device_name=device_name, get_peak_stats=lambda: stats,
                                              reset_peak_stats=lambda: None)
    p.gpu_peak_flops, p.num_flops_per_token = bf16_peak, flops_per_token
    p.ntokens_since_last_log, p.data_loading_times, p.time_last_log = 1000, [0.0], time.perf_counter() - 1.0
    return p


@pytest.mark.parametrize("native", [False, True])
def test_installed_log_reports_mfu_peak_and_map4(native, monkeypatch, caplog):
    monkeypatch.setattr(metrics, "_tracked", {"w": (100, FourOverSixRecipe(), False)})  # 600 FP4 FLOPs/token
    monkeypatch.setattr(metrics, "run_fp4_flops", lambda job, dims: 600 if native else 0)
    metrics.install()
    metrics.install()  # idempotent: one wrapper
    assert MetricsProcessor.log.__wrapped__.__name__ == "log" and not hasattr(MetricsProcessor.log.__wrapped__,
                                                                            "_four_over_six")
    p = _processor("NVIDIA B200", 2.25e15, 1000)
    MAP4_STATS.read_and_reset()
    MAP4_STATS.counts(torch.device("cpu"))[0, :2].add_(torch.tensor([1, 4]))  # 1 of 4 blocks map-to-4
    with caplog.at_level(logging.INFO):
        p.log(3, 2.5, 2.6, 1.0, extra_metrics={"lr": 1e-3})
    step, logged = p.logger.logged[-1]
    expected_peak = 1 / (0.6 / 9e15 + 0.4 / 2.25e15) if native else 2.25e15
    assert step == 3 and logged["lr"] == 1e-3 and logged[metrics.MAP4_METRIC] == 0.25
    tps = logged["throughput(tps)"]
    assert logged["mfu(%)"] == pytest.approx(100 * 1000 * tps / expected_peak)
    assert ("mixed peak" if native else "bf16 peak") in caplog.text
    step_line = next(r.getMessage() for r in caplog.records if "loss:" in r.getMessage())
    assert step_line.startswith("step:  3") and step_line.endswith("four_over_six map4: 0.2500")
    # nothing quantized since the last log: no metric, the console says so
    p.data_loading_times.append(0.0)
    with caplog.at_level(logging.INFO):
        p.log(4, 2.5, 2.6, 1.0)
    assert metrics.MAP4_METRIC not in p.logger.logged[-1][1]
    assert caplog.records[-1].getMessage().endswith("four_over_six map4: n/a")
    assert not metrics.logger.filters  # the filter lives only during the call


@pytest.mark.parametrize("fsdp, tp, dtype, expected", [
    (True, False, "float32", "bfloat16"),  # FSDP mixed precision
    (False, False, "float32", "bfloat16"),  # single device / DDP: AMP
    (False, True, "float32", "float32"),  # TP without FSDP: neither
    (False, True, "bfloat16", "bfloat16"),
])
def test_compute_dtype_follows_torchtitan(fsdp, tp, dtype, expected):
    job = job_config("--training.dtype", dtype)
    dims = SimpleNamespace(fsdp_enabled=fsdp, tp_enabled=tp, pp_enabled=False)
    assert metrics.compute_dtype(job, dims) == expected


def test_map4_counting_runs_only_on_steps_that_log(monkeypatch):
    """should_log(step), asked by torchtitan at the end of every step, switches the counting on for step + 1
    exactly when step + 1 will be logged (step 1 and multiples of log_freq)."""
    metrics.install()
    p = _processor("NVIDIA H200", 989e12, 1000)
    p.job_config = SimpleNamespace(metrics=SimpleNamespace(log_freq=5))
    monkeypatch.setattr(MAP4_STATS, "enabled", True)
    counted = []
    for step in range(1, 12):
        counted.append(MAP4_STATS.enabled)  # what the ops of this step see
        assert p.should_log(step) == (step == 1 or step % 5 == 0)
    assert counted == [step == 1 or step % 5 == 0 for step in range(1, 12)]


@pytest.fixture
def on_mocked_blackwell(monkeypatch):
    """A CUDA device whose GEMMs resolve to the real FP4 kernels (backends.fp4_available patched; what was
    resolved before and under the patch is forgotten)."""
    monkeypatch.setattr(backends, "fp4_available", lambda device: device.type == "cuda")
    monkeypatch.delenv(backends.EMULATE_ENV, raising=False)
    backends.backends_for.cache_clear()
    yield torch.device("cuda", 0)
    backends.backends_for.cache_clear()


def test_an_emulation_forced_by_the_environment_reports_the_bf16_peak(monkeypatch, on_mocked_blackwell):
    """TITAN_FP4SIX_EMULATE=1 runs every GEMM emulated, also on Blackwell: the MFU peak is the bf16 one. The
    metrics take the decision from the ops' resolved backends."""
    monkeypatch.setattr(metrics, "_tracked", {"w": (100, FourOverSixRecipe(), False)})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    dims = SimpleNamespace(fsdp_enabled=True, tp_enabled=False, pp_enabled=False)
    assert metrics.run_fp4_flops(job_config(), dims) == 600  # bf16 mixed precision on Blackwell: FP4 GEMMs
    monkeypatch.setenv(backends.EMULATE_ENV, "1")
    backends.backends_for.cache_clear()  # the environment is read when a device is first resolved
    assert metrics.run_fp4_flops(job_config(), dims) == 0
    p = _processor("NVIDIA B200", 2.25e15, 1000)
    p.parallel_dims = dims
    assert metrics._peak_for(p).flops == 2.25e15
