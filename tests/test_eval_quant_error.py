"""Quantization-error report and its tensor capture (`python -m scripts.report quant-error`)."""

import itertools
import math

import pytest
import torch
from torch import nn

from scripts import report
from titan_fp4six import four_over_six_quantize, tensor_amax
from titan_fp4six.modules.fidelity import relative_mse
from titan_fp4six.numerics.validation import BLOCKS, ERR_MODES, SCALE_BOUNDS


def _gauss(rows=128, cols=128, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def test_configs_are_every_knob_setting_the_quantizer_accepts():
    """The report's grid against the library: each knob combination the public quantizer accepts (a per-row amax
    that varies inside a 16-row tile is refused with 16x16) is listed once, and nothing it refuses is."""
    x = _gauss(32, 32)
    accepted = set()
    for scaling, block, err_mode, bound in itertools.product(("tensor", "row"), BLOCKS, ERR_MODES, SCALE_BOUNDS):
        try:
            four_over_six_quantize(x, report.amax_for(x, scaling), block=block, err_mode=err_mode, scale_bound=bound)
        except ValueError:
            continue
        accepted.add(("4/6", scaling, block, err_mode, bound))
    assert ("4/6", "row", "16x16", "mse", 256) not in accepted and len(accepted) > len(SCALE_BOUNDS)
    accepted |= {("nvfp4", scaling, "1x16", "mse", 448) for scaling in ("tensor", "row")}
    configs = [(c.method, c.scaling, c.block, c.err_mode, c.scale_bound) for c in report.default_configs()]
    assert len(configs) == len(set(configs)) and set(configs) == accepted
    labels = [c.label for c in report.default_configs()]
    assert len(set(labels)) == len(labels)


def test_relative_mse_definition():
    x = _gauss()
    assert relative_mse(x, x) == 0.0
    assert relative_mse(x, torch.zeros_like(x)) == pytest.approx(1.0)
    assert relative_mse(x, 2 * x) == pytest.approx(1.0)


def test_nvfp4_error_level_and_no_map4():
    x = _gauss()
    xq, map4 = report.quantize_dequantize(x, report.QuantConfig("nvfp4"))
    assert math.isnan(map4)
    # E2M1 with an E4M3 block scale: a few 1e-3 relative MSE on Gaussian data, never exact, never garbage
    assert 1e-3 < relative_mse(x, xq) < 3e-2


@pytest.mark.parametrize("bound", [256, 448])
def test_four_over_six_beats_nvfp4_on_gaussian_and_reports_map4(bound):
    x = _gauss(256, 256)
    base, _ = report.quantize_dequantize(x, report.QuantConfig("nvfp4"))
    cfg = report.QuantConfig("4/6", "tensor", "1x16", "mse", bound)
    xq, map4 = report.quantize_dequantize(x, cfg)
    # dequantizing with the wrong bound would scale every value by 256/448 and blow this up
    assert relative_mse(x, xq) < relative_mse(x, base)
    amax = tensor_amax(x)
    expected = four_over_six_quantize(x, amax, block="1x16", err_mode="mse", scale_bound=bound).map4
    assert map4 == pytest.approx(expected.float().mean().item())
    assert 0.0 < map4 < 1.0


def test_group_amax_is_one_per_row_group():
    x = _gauss(64, 32)
    x[16:32] *= 10
    amax = report.amax_for(x, "tensor", group_rows=16)
    assert amax.shape == (64,) and amax.dtype == torch.float32
    for g in range(4):
        assert torch.equal(amax[16 * g:16 * (g + 1)], x[16 * g:16 * (g + 1)].abs().max().expand(16))
    assert torch.equal(report.amax_for(x, "row"), x.abs().amax(dim=1))
    assert report.amax_for(x, "tensor").dim() == 0


def test_synthetic_distributions_differ_in_tails():
    samples = report.synthetic_samples(128, 128, seed=1)
    kurt = {s.source: (s.x.pow(4).mean() / s.x.pow(2).mean() ** 2).item() for s in samples}
    assert kurt["gaussian"] == pytest.approx(3.0, abs=0.3)
    assert kurt["heavy-tailed"] > kurt["gaussian"] and kurt["outlier-rich"] > kurt["gaussian"]


def test_summary_table_and_plots(tmp_path):
    samples = report.synthetic_samples(64, 64) + [report.Sample("weight", "w", 3, _gauss(32, 32))]
    configs = [report.QuantConfig("nvfp4"), report.QuantConfig("4/6", "tensor", "16x16", "mae", 256)]
    records = report.evaluate(samples, configs)
    assert len(records) == len(samples) * len(configs)
    summary = report.summarize(records)
    table = report.markdown_table(summary)
    assert table.count("(1.00x)") == 4  # the baseline row, one per source
    assert "m4 " in table.splitlines()[-1] and "m4 " not in table.splitlines()[2]
    pytest.importorskip("matplotlib")
    assert all(p.stat().st_size > 0 for p in report.plot_quant_error(summary, records, tmp_path, baseline="NVFP4 tensor")[:1])


class _Experts(nn.Module):
    """A look-alike of torchtitan's GroupedExperts: w1/w3 (E, H, D), w2 (E, D, H), forward(x, counts)."""

    def __init__(self, experts=2, dim=16, hidden=32):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.randn(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.randn(experts, hidden, dim))

    def forward(self, x, counts):
        return x @ self.w1[0].t() @ self.w2[0].t()


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32, bias=False)
        self.gate = nn.Linear(32, 16, bias=False)
        self.router = nn.Module()
        self.router.gate = nn.Linear(16, 2, bias=False)
        self.experts = _Experts()

    def forward(self, x):
        h = self.gate(self.proj(x)) + self.router.gate(x).sum(-1, keepdim=True)
        return self.experts(h.view(-1, 16), None)


def test_recorder_captures_operands_and_output_gradients():
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": _Block()})
    recorder = report._Recorder(max_rows=32)
    report.attach(model, ["0"], recorder)
    x = torch.randn(2, 24, 16)
    proj_out = {}

    def keep(module, args, out):
        out.retain_grad()
        proj_out["o"] = out

    model.layers["0"].proj.register_forward_hook(keep)
    recorder.step, recorder.active = 7, True
    model.layers["0"](x).sum().backward()
    names = {(s.source, s.name) for s in recorder.samples}
    assert ("activation", "layers.0.proj") in names and ("gradient", "layers.0.gate") in names
    assert not any("router" in n for _, n in names)  # router gates stay bf16 in every recipe
    assert ("weight", "layers.0.experts.w2") in names
    by_key = {(s.source, s.name): s for s in recorder.samples}
    act = by_key[("activation", "layers.0.proj")]
    assert act.step == 7 and act.x.shape == (32, 16)  # 48 rows capped to max_rows, a multiple of 16
    assert torch.equal(act.x, x.reshape(-1, 16)[:32])
    grad = by_key[("gradient", "layers.0.proj")]
    assert torch.equal(grad.x, proj_out["o"].grad.reshape(-1, 32)[:32])
    w2 = by_key[("weight", "layers.0.experts.w2")]
    assert w2.group_rows == 16 and w2.x.shape == (32, 32)  # whole experts, one amax per expert
    recorder.samples.clear()
    recorder.active = False
    model.layers["0"](x).sum().backward()
    assert recorder.samples == []
