"""Fidelity metrics (modules/fidelity/): the arithmetic, the operand roles against the op, the capture hooks on
converted modules, the training telemetry (integration/fidelity.py) and the CLI end to end on the CPU."""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.moe.moe import GroupedExperts

from tests.helpers.integration_helpers import SMALL_DEEPSEEK, build_model, convert, job_config
from tests.helpers.training_harness import CPU_ARGS, REPO
from titan_fp4six.integration import fidelity as telemetry
from titan_fp4six.integration import metrics
from titan_fp4six.integration.job_config import FourOverSixLinearConfig
from titan_fp4six.modules import FourOverSixLinear, convert_experts
from titan_fp4six.modules import fidelity as fid
from titan_fp4six.ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from titan_fp4six.quant.process_state import MAP4_STATS


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_snr_cosine_norm_ratio_and_mse_by_hand():
    ref, out = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0])
    assert fid.snr_db(ref, out) == pytest.approx(10 * math.log10(25 / 1))  # signal 9+16, noise 1
    assert fid.snr_db(ref, ref) == math.inf and math.isnan(fid.snr_db(torch.zeros(2), torch.zeros(2)))
    assert fid.cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert fid.cosine(torch.tensor([[1.0, 2.0]]), torch.tensor([[-2.0, -4.0]])) == pytest.approx(-1.0)
    assert math.isnan(fid.cosine(torch.zeros(2), ref))
    assert fid.norm_ratio(torch.tensor([6.0, 8.0]), ref) == pytest.approx(2.0)
    assert fid.relative_mse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])) == pytest.approx(1 / 5)
    assert fid.mean_metrics({"a": {"m": 1.0, "s": math.inf}, "b": {"m": 3.0, "s": 2.0}}) == {"m": 2.0, "s": 2.0}


def test_nvfp4_variant_is_scope_none_bound_448():
    recipe = FourOverSixRecipe(weight_block="1x16", activation_scaling="row", backward="high_precision")
    variants = fid.variant_recipes(recipe)
    assert variants["four_over_six"] is recipe
    assert variants["nvfp4"] == replace(recipe, scope="none", scale_bound=448)


def test_four_over_six_beats_nvfp4_on_gaussian():
    """The README's ~0.84x quantization MSE of 4/6 against plain NVFP4 on Gaussian data, and what follows from it."""
    case = fid.GemmCase("g", _randn(256, 256), _randn(128, 256, seed=1), _randn(256, 128, seed=2),
                        FourOverSixRecipe(weight_block="1x16"))
    m = fid.gemm_fidelity(case)
    for role in ("x", "w", "xT", "wT"):
        assert 0.78 < m[f"mse_{role}/four_over_six"] / m[f"mse_{role}/nvfp4"] < 0.90, role
    assert m["mse_dy/nvfp4"] == m["mse_dy/four_over_six"]  # dy is standard NVFP4 in both
    assert m["fwd_snr_db/four_over_six"] > m["fwd_snr_db/nvfp4"] > 15
    assert m["map4_fraction/nvfp4"] == 0 and 0.1 < m["map4_fraction/four_over_six"] < 0.5
    for variant in fid.VARIANTS:
        assert 0.98 < m[f"quantized_dx_cos/{variant}"] < m[f"dequantized_dx_cos/{variant}"] < 1
        assert m[f"high_precision_dw_cos/{variant}"] == pytest.approx(1, abs=1e-12)  # same dy, exact operands


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(weight_block="1x16", scope="weights"),
                                    FourOverSixRecipe(activation_scaling="row", weight_block="1x16")])
def test_operand_errors_measure_what_the_op_quantizes(recipe, grouped):
    """With dy = identity blocks the dequantized backward returns the op's own dequantized operands (dX = deq(W),
    dW = deq(x)): the x and w errors computed here from the public quantizers must be theirs."""
    n = k = 32
    experts = 3 if grouped else 1
    x, w = _randn(experts * n, k), _randn(experts, n, k, seed=1) * 3
    offs = torch.arange(1, experts + 1, dtype=torch.int32) * n if grouped else None
    w = w if grouped else w[0]
    dy = torch.eye(n).repeat(experts, 1)
    for r in fid.variant_recipes(recipe).values():
        case = fid.GemmCase("c", x, w, dy, r, offs)
        errors = fid.operand_errors(case, r)
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        r_deq = replace(r, backward="dequantized")
        y = (four_over_six_grouped_mm(xl, wl.transpose(-2, -1), offs, recipe=r_deq) if grouped
             else four_over_six_linear(xl, wl, recipe=r_deq))
        y.backward(dy)
        w_deq = xl.grad.view(experts, n, k) if grouped else xl.grad
        x_deq = wl.grad.reshape(-1, k)
        assert errors["mse_w"] == pytest.approx(fid.relative_mse(w, w_deq), rel=1e-9)
        assert errors["mse_x"] == pytest.approx(fid.relative_mse(x, x_deq), rel=1e-9)
        assert {"mse_dy", "mse_dyT", "mse_xT", "mse_wT"} <= set(errors)  # the quantized backward's, every GEMM kind


_FULL = FourOverSixRecipe(backward="quantized", gradient_rounding="stochastic", wgrad_rht=True)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("recipe", [FourOverSixRecipe(backward="quantized"), _FULL,
                                    FourOverSixRecipe(activation_scaling="row", weight_block="1x16",
                                                      backward="quantized"),
                                    replace(_FULL, activation_scaling="row", weight_block="1x16")])
def test_backward_operands_are_the_ones_the_quantized_backward_multiplies(recipe, grouped):
    """The dequantized operands of modules.fidelity.quantized_backward_operands, multiplied, give the op's quantized dX and dW (the
    Hadamard transform cancels in dY^T x): they are the op's operands, amaxes, layouts and stochastic seeds."""
    from titan_fp4six.quant.process_state import set_rounding_seed
    from titan_fp4six.modules.fidelity import quantized_backward_operands
    counts = torch.tensor([21, 0, 40, 3]) if grouped else torch.tensor([50])
    m, n, k, experts = int(counts.sum()), 32, 48, counts.numel()
    x, dy = _randn(m, k), _randn(m, n, seed=2)
    w = _randn(experts, n, k, seed=1) if grouped else _randn(n, k, seed=1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32) if grouped else None
    for r in fid.variant_recipes(recipe).values():
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        set_rounding_seed(7, 3)
        y = (four_over_six_grouped_mm(xl, wl.transpose(-2, -1), offs, recipe=r) if grouped
             else four_over_six_linear(xl, wl, recipe=r))
        y.backward(dy)
        set_rounding_seed(7, 3)
        ops = {role: deq.double() for role, (_, deq) in quantized_backward_operands(dy, x, w, r, offs).items()}
        if grouped:  # per group: its rows of dy, its expert's W^T, its 16-token blocks of dy^T and x^T
            starts, blocks = offs - counts, torch.cumsum((counts + 15) // 16 * 16, 0) - (counts + 15) // 16 * 16
            dx = torch.cat([ops["dy"][s:s + c] @ ops["wT"].view(experts, k, -1)[e].t()
                            for e, (s, c) in enumerate(zip(starts.tolist(), counts.tolist()))])
            dw = torch.stack([ops["dyT"][:, b:b + c] @ ops["xT"][:, b:b + c].t()
                              for b, c in zip(blocks.tolist(), ((counts + 15) // 16 * 16).tolist())])
            tol = 4e-3  # the grouped GEMMs' bf16 product
        else:
            dx, dw, tol = ops["dy"] @ ops["wT"].t(), ops["dyT"] @ ops["xT"].t(), 1e-5
        for got, mine in ((xl.grad, dx[:, :k]), (wl.grad, dw[..., :n, :k])):
            assert ((got.double() - mine).norm() / got.double().norm()).item() < tol
        errors = {role: fid.relative_mse(t, deq) for role, (t, deq) in
                  quantized_backward_operands(dy, x, w, r, offs).items()}
        assert all(0.004 < e < (0.03 if r.stochastic and role.startswith("dy") else 0.015)
                   for role, e in errors.items()), errors


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("recipe", [FourOverSixRecipe(backward="quantized"), _FULL,
                                    FourOverSixRecipe(activation_scaling="row", weight_block="1x16")])
def test_quantized_backward_is_measured_for_grouped_and_row_scaled_gemms(recipe, grouped):
    counts = torch.tensor([30, 0, 50, 16])
    x, dy = _randn(96, 64), _randn(96, 32, seed=2)
    w = _randn(4, 32, 64, seed=1) if grouped else _randn(32, 64, seed=1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32) if grouped else None
    m = fid.gemm_fidelity(fid.GemmCase("g", x, w, dy, recipe, offs))
    for variant in fid.VARIANTS:
        for g in ("dx", "dw"):
            assert 0.9 < m[f"quantized_{g}_cos/{variant}"] <= 1
            assert 0.9 < m[f"quantized_{g}_norm_ratio/{variant}"] < 1.1
            assert m[f"quantized_{g}_cos/{variant}"] < m[f"high_precision_{g}_cos/{variant}"]
        for role in ("dy", "dyT", "xT", "wT"):
            assert 0 < m[f"mse_{role}/{variant}"] < 0.03
    assert m["mse_xT/four_over_six"] < m["mse_xT/nvfp4"]  # x^T takes the candidate choice, dy none
    if not recipe.stochastic:  # standard NVFP4 in both variants
        assert m["mse_dy/four_over_six"] == m["mse_dy/nvfp4"] and m["mse_dyT/four_over_six"] == m["mse_dyT/nvfp4"]


def test_measuring_gives_the_stochastic_seeds_back():
    """The telemetry measures inside a training step's backward: its GEMMs must draw the seeds they would draw
    unmeasured."""
    from titan_fp4six.quant.process_state import GRADIENT_ROUNDING, set_rounding_seed
    set_rounding_seed(3, 5)
    GRADIENT_ROUNDING.next()
    fid.gemm_fidelity(fid.GemmCase("c", _randn(32, 64), _randn(4, 32, 64, seed=1), _randn(32, 32, seed=2), _FULL,
                                   torch.tensor([8, 8, 30, 32], dtype=torch.int32)))
    assert GRADIENT_ROUNDING.calls == 1


def test_gemm_case_names_the_shapes():
    with pytest.raises(ValueError, match=r"c: dy has shape \(4, 16\).*\(M, N\) = \(4, 32\)"):
        fid.GemmCase("c", torch.zeros(4, 16), torch.zeros(32, 16), torch.zeros(4, 16), FourOverSixRecipe())


def test_capture_of_a_linear_measures_its_operands_and_restores_the_forward():
    torch.manual_seed(0)
    linear = FourOverSixLinear(64, 32, bias=True)
    model = nn.Sequential(linear, nn.ReLU())
    x = torch.randn(3, 16, 64)
    quantized_out = model(x)
    with fid.FidelityCapture(fid.converted_modules(model), unquantized_forward=True) as capture:
        y = linear(x)
        assert torch.equal(y, F.linear(x, linear.weight, linear.bias))  # the bf16 twin's forward
        dy = torch.randn_like(y)
        y.backward(dy)
        results = capture.take()
    assert list(results) == ["0"]
    expected = fid.gemm_fidelity(fid.GemmCase("0", x.reshape(-1, 64), linear.weight.detach(), dy.reshape(-1, 32),
                                              linear.recipe))
    assert results["0"] == expected
    assert torch.equal(model(x), quantized_out) and "forward" not in vars(linear)


def test_capture_of_experts_gives_w1_w3_w2_in_the_token_group_layout():
    """The module pads each token group to pad_multiple rows; zero rows change no metric, so the three GEMMs
    equal hand-built unpadded cases whose inner operands and gradients come from the unquantized chain. (The
    unquantized forward is the parent's: its loop over experts here, on the CPU.)"""
    dim, hidden, counts = 64, 32, torch.tensor([10, 0, 25, 5])
    torch.manual_seed(0)
    plain = GroupedExperts(dim, hidden, 4, use_grouped_mm=False)
    with torch.no_grad():
        plain.init_weights(0.1)
    experts = convert_experts(GroupedExperts(dim, hidden, 4, use_grouped_mm=False), FourOverSixRecipe())
    experts.load_state_dict(plain.state_dict())
    x, dy = _randn(40, dim, seed=1), _randn(40, dim, seed=2)
    with fid.FidelityCapture([("e", experts)], unquantized_forward=True) as capture:
        y = experts(x, counts)
        assert torch.equal(y, plain(x, counts))
        y.backward(dy)
        results = capture.take()
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    w1, w2, w3 = (getattr(plain, n).detach() for n in ("w1", "w2", "w3"))
    h1, h3 = (torch._grouped_mm(x, w.transpose(-2, -1), offs=offs).requires_grad_() for w in (w1, w3))
    h = F.silu(h1) * h3
    d1, d3 = torch.autograd.grad(torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs), (h1, h3), dy)
    cases = [("e.w1", x, w1, d1), ("e.w3", x, w3, d3), ("e.w2", h.detach(), w2, dy)]
    assert list(results) == [c[0] for c in cases]
    # Two float32 chains (the capture's padded grouped GEMMs, this unpadded one) sum in another order, as the
    # CPU's kernels choose: a dot product of length K moves by up to ~K ulps, and the chain has a dim- and a
    # hidden-long one, so metrics may differ by (dim + hidden) float32 epsilons (seen: ~1e-7 relative).
    rel = (dim + hidden) * torch.finfo(torch.float32).eps
    for name, a, w, g in cases:
        expected = fid.gemm_fidelity(fid.GemmCase(name, a, w, g, experts.recipe, offs))
        assert results[name] == pytest.approx(expected, rel=rel), name


@pytest.mark.parametrize("value", [-1, True, 2.0])
def test_fidelity_every_must_be_a_count(value):
    with pytest.raises(ValueError, match=rf"quantize.linear.four_over_six.fidelity_every={value}; it must be an int"):
        FourOverSixLinearConfig(fidelity_every=value)


def test_fidelity_every_refuses_compile():
    job = job_config("--quantize.grouped_mm.four_over_six.fidelity_every", "2", "--compile.enable")
    with pytest.raises(ValueError, match=r"quantize.grouped_mm.four_over_six.fidelity_every = 2 with compile"):
        convert(build_model("deepseek_v3", job, **SMALL_DEEPSEEK)[0], job)


class _Recorder:
    def __init__(self):
        self.logged = []

    def log(self, logged, step):
        self.logged.append((step, logged))


def test_telemetry_logs_the_metrics_at_every_nth_step_only(monkeypatch):
    monkeypatch.setattr(telemetry, "_captures", [])
    monkeypatch.setattr(MAP4_STATS, "enabled", True)  # the should_log wrapper sets it
    monkeypatch.setattr(torch, "histc", lambda x, *a, histc=torch.histc, **k: histc(x.float(), *a, **k).to(x.dtype))
    job = job_config("--quantize.linear.four_over_six.fidelity_every", "2",
                     "--quantize.grouped_mm.four_over_six.fidelity_every", "2")
    torch.manual_seed(0)
    model, args = build_model("deepseek_v3", job, device="cpu", **SMALL_DEEPSEEK)
    with torch.no_grad():
        model.init_weights()
    convert(model, job)
    metrics.install()
    processor = metrics.MetricsProcessor.__new__(metrics.MetricsProcessor)
    processor.logger, processor.job_config = _Recorder(), job_config("--metrics.log_freq", "10")
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    for step in range(1, 6):
        model(tokens).float().square().mean().backward()
        processor.should_log(step)
    assert [step for step, _ in processor.logger.logged] == [2, 2, 4, 4]  # the linear, then the grouped section
    linear_keys, grouped_keys = (set(logged) for _, logged in processor.logger.logged[:2])
    gemms = {k.split("/")[1] for k in linear_keys | grouped_keys}
    assert "layers.0.attention.wq" in gemms and "layers.1.moe.experts.w2" in gemms and "output" not in gemms
    for variant in fid.VARIANTS:
        assert f"four_over_six_fidelity/layers.1.moe.experts.w1/map4_fraction/{variant}" in grouped_keys
        assert f"four_over_six_fidelity/layers.0.attention.wq/quantized_dx_cos/{variant}" in linear_keys
    values = processor.logger.logged[0][1]
    assert 0 < values["four_over_six_fidelity/layers.0.attention.wq/map4_fraction/four_over_six"] < 1
    assert values["four_over_six_fidelity/layers.0.attention.wq/fwd_snr_db/nvfp4"] > 10


def test_cli_on_the_cpu_tiny_flavor_is_deterministic(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="")
    outputs = []
    for run in ("a", "b"):
        cmd = [sys.executable, "-m", "titan_fp4six.fidelity", "--job.config_file",
               str(REPO / "configs" / "deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml"),
               "--job.dump_folder", str(tmp_path / "dump"), *CPU_ARGS, "--out", str(tmp_path / run),
               "--steps-of-training", "1"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        outputs.append((proc.stdout, json.loads((tmp_path / run / "fidelity.json").read_text())))
        assert (tmp_path / run / "fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (stdout, record), (_, again) = outputs
    assert record == again
    gemms = record["gemms"]
    rows = [line for line in stdout.splitlines() if line.startswith("| layers.") or line.startswith("| mean")]
    assert len(rows) == len(gemms) + 1 and rows[-1].startswith("| mean | ")
    assert "layers.1.moe.experts.w2" in gemms and "layers.0.attention.wq" in gemms
    assert "mse_dy/nvfp4" in gemms["layers.0.attention.wq"] and "mse_dy/nvfp4" in gemms["layers.1.moe.experts.w2"]
    assert 0.9 < record["mean"]["quantized_dw_cos/four_over_six"] <= 1
    assert record["steps_of_training"] == 1 and "model state after 1 steps" in stdout
    assert record["mean"]["mse_x/four_over_six"] < record["mean"]["mse_x/nvfp4"]


def test_cli_refuses_a_missing_recipe_and_an_unwritable_out_before_measuring(tmp_path, capsys):
    from titan_fp4six.fidelity import main

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--job.config_file RECIPE.toml is required" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as e:
        main(["--job.config_file", "configs/qwen3_moe_debug_nvfp4_four_over_six.toml", "--out", str(blocker / "sub")])
    assert e.value.code == 2 and f"--out {blocker / 'sub'}: cannot write fidelity.json there" in capsys.readouterr().err


def test_a_checkpoint_torchtitan_cannot_read_is_named():
    from titan_fp4six.fidelity import load_checkpoint

    class Truncated:
        def load(self, step):
            raise EOFError("Ran out of input")

    with pytest.raises(ValueError, match=r"--checkpoint ck: torchtitan could not read it \(EOFError: Ran out of "
                                         r"input\); a step-N folder is truncated or corrupt"):
        load_checkpoint(Truncated(), "ck", -1)

    class Unreadable:
        def load(self, step):
            from torch.distributed.checkpoint.api import CheckpointException

            raise CheckpointException("load", {})

    with pytest.raises(ValueError, match=r"torchtitan could not read it \(CheckpointException"):
        load_checkpoint(Unreadable(), "ck", -1)

    class Empty:
        def load(self, step):
            return False

    with pytest.raises(ValueError, match=r"--checkpoint ck: no checkpoint there"):
        load_checkpoint(Empty(), "ck", -1)
