"""Per-GEMM fidelity of plain NVFP4 and four-over-six against the unquantized GEMM, on real operands.

Why: loss curves of short runs cannot tell the formats apart (issue 33: seed noise exceeds every gap). These
metrics are deterministic and local: for one GEMM's operands x, W and upstream gradient dy they measure how far
each format's output, gradients and operand quantizations are from the unquantized GEMM on the same inputs.

- `fwd_snr_db`: 10 log10(sum y_ref^2 / sum (y - y_ref)^2); y_ref the unquantized GEMM in the operands' dtype
  (bf16 in GPU training), y the quantized op's output (bias excluded: the op adds it exactly).
- `<mode>_dx_cos`, `<mode>_dx_norm_ratio` (|dX| / |dX_ref|), and the same for dW, per backward mode, against
  the unquantized GEMM's gradients for the same dy (the quantized backward with the recipe's wgrad_rht and
  gradient_rounding; the others without: they refuse both), dense and grouped, per-tensor and row-scaled.
- `mse_<role>`: relative quantization MSE sum (deq(q(t)) - t)^2 / sum t^2 of each operand the GEMMs quantize,
  with the op's amax, block, bound and candidate choice: x and w of the forward, and those of the quantized
  backward (whichever backward the recipe runs): dy, dyT (standard NVFP4), xT and wT, as the op quantizes them
  (quant.grad_operands, the op's own builder: per token group amaxes of grouped dy, column amaxes of row-scaled
  x^T, the wgrad operands Hadamard-transformed with wgrad_rht and measured against the transformed tensor, dy rounded
  stochastically with gradient_rounding; 16x16 tiles transpose, so wT equals w there).
- `map4_fraction`: share of x's and w's forward 1x16 blocks that store map-to-4.

Variants: `four_over_six` is the module's recipe, `nvfp4` the same recipe with scope="none", scale_bound=448
(plain NVFP4, docs/numerics.md). `FidelityCapture` measures a model's converted modules during a forward and
backward: forward hooks keep each module's input, and when its output's gradient arrives (the weights still
those of the forward) it computes the metrics of the module's GEMMs. Routed experts give three GEMMs (w1, w3,
w2); the inner operands and gradients come from an unquantized rerun of the gated chain on the module's input.
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics.formats import BLOCK_SIZE
from ..numerics.groups import RowGroups, TokenBlocks
from ..numerics.reference import amax_per_row, global_decode_factor
from ..numerics.spec import OperandSpec
from ..ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from ..quant import four_over_six_quantize, group_amax, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax
from ..quant.amax import run_expert_amax, run_token_groups
from ..quant.grad_operands import dense_grad_operands, grouped_grad_operands
from ..quant.operands import Operand, gemm_quantizers
from ..quant.process_state import GRADIENT_ROUNDING, MAP4_STATS
from ..quant.quantize import padded_transpose, run_rht16_columns
from ..quant.recipe import GemmPlan, plain_nvfp4
from .autocast import autocast_operands, no_autocast
from .dtensor import local_weight
from .experts import _FourOverSixExperts, ep_dispatched, pad_token_groups
from .linear import FourOverSixLinear

VARIANTS = ("nvfp4", "four_over_six")
BACKWARD_MODES = ("quantized", "dequantized", "high_precision")
_EXPERT_WEIGHTS = ("w1", "w3", "w2")  # forward order


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-noise ratio of `out` against `ref` in dB (inf when equal, NaN when both are zero)."""
    ref = ref.double()
    signal, noise = ref.pow(2).sum().item(), (out.double() - ref).pow(2).sum().item()
    if noise == 0:
        return math.inf if signal > 0 else math.nan
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors as flat vectors (NaN if either is zero)."""
    a, b = a.double().flatten(), b.double().flatten()
    norms = a.norm().item() * b.norm().item()
    return a.dot(b).item() / norms if norms else math.nan


def norm_ratio(a: torch.Tensor, ref: torch.Tensor) -> float:
    """|a| / |ref| (NaN for a zero ref)."""
    ref_norm = ref.double().norm().item()
    return a.double().norm().item() / ref_norm if ref_norm else math.nan


def relative_mse(x: torch.Tensor, xq: torch.Tensor) -> float:
    """sum((xq - x)^2) / sum(x^2): the quantization MSE relative to x's mean square (0 for an exact zero x)."""
    x = x.double()
    return ((xq.double() - x).pow(2).sum() / x.pow(2).sum().clamp_min(1e-300)).item()


def variant_recipes(recipe: FourOverSixRecipe) -> dict[str, FourOverSixRecipe]:
    """{variant: recipe}: plain NVFP4 (quant.recipe.plain_nvfp4) and the recipe itself."""
    return {"nvfp4": plain_nvfp4(recipe), "four_over_six": recipe}


@dataclass
class GemmCase:
    """One GEMM's operands: x (M, K) and dy (M, N) in the operands' dtype; w (N, K), or (E, N, K) experts with
    offs the int32 inclusive group ends (offs[-1] == M). token_rows: the rows of x that are tokens where the others
    are zero padding (they change no metric but would dilute the map-to-4 fraction); None: all."""

    name: str
    x: torch.Tensor
    w: torch.Tensor
    dy: torch.Tensor
    recipe: FourOverSixRecipe
    offs: torch.Tensor | None = None
    token_rows: torch.Tensor | None = None

    def __post_init__(self):
        rows, n = self.x.shape[0], self.w.shape[-2]
        if self.dy.shape != (rows, n):
            raise ValueError(f"{self.name}: dy has shape {tuple(self.dy.shape)}; x {tuple(self.x.shape)} and w "
                             f"{tuple(self.w.shape)} need (M, N) = ({rows}, {n})")
        if self.offs is not None and int(self.offs[-1]) != rows:
            raise ValueError(f"{self.name}: offs[-1]={int(self.offs[-1])} but x has {rows} rows; pass the token rows")


def _gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None,
          recipe: FourOverSixRecipe | None) -> torch.Tensor:
    """x times w^T, dense (offs None) or grouped: unquantized (recipe None) or through the four-over-six op."""
    if offs is None:
        return F.linear(x, w) if recipe is None else four_over_six_linear(x, w, recipe=recipe)
    w_t = w.transpose(-2, -1)
    return torch._grouped_mm(x, w_t, offs=offs) if recipe is None else four_over_six_grouped_mm(x, w_t, offs,
                                                                                                recipe=recipe)


def _output_and_grads(case: GemmCase, recipe: FourOverSixRecipe | None):
    x, w = case.x.detach().requires_grad_(), case.w.detach().requires_grad_()
    y = _gemm(x, w, case.offs, recipe)
    return (y.detach(), *torch.autograd.grad(y, (x, w), case.dy))


def _spec_error(t, amax, spec: OperandSpec, quantizer: str):
    """(relative MSE, map-to-4 mask) of t quantized by the forward operand `spec`, as the op quantizes it."""
    if spec.candidates == "nvfp4":
        q = nvfp4_quantize(t, amax, quantizer=quantizer, validate_amax=False)
    else:
        q = four_over_six_quantize(t, amax, block=spec.block, err_mode=spec.err_mode, scale_bound=spec.scale_bound,
                                   quantizer=quantizer, choose=spec.choose, validate_amax=False)
    return relative_mse(t, nvfp4_dequantize(q.codes, q.scales, amax, scale_bound=spec.scale_bound)), q.map4


def _with_backward(recipe: FourOverSixRecipe, mode: str) -> FourOverSixRecipe:
    """The recipe with backward `mode`; wgrad_rht and stochastic gradient rounding kept only for the quantized
    backward (the others refuse them)."""
    quantized = mode == "quantized"
    return replace(recipe, backward=mode, wgrad_rht=recipe.wgrad_rht and quantized,
                   gradient_rounding=recipe.gradient_rounding if quantized else "nearest")


def _activation_amax(case: GemmCase, plan: GemmPlan) -> torch.Tensor:
    """x's amax as the op takes it: per row (row-scaled), per token group (experts) or per tensor."""
    x = case.x
    if plan.row_scaled:
        return row_amax(x)
    if case.offs is None:
        return tensor_amax(x)
    sizes = torch.diff(case.offs, prepend=case.offs.new_zeros(1))
    return group_amax(x, case.offs).repeat_interleave(sizes, output_size=x.shape[0])


def _dequantized(op: Operand, factor: torch.Tensor, quantizer: str) -> torch.Tensor:
    """op's block-scaled decode in FP32 (R, C) times the global decode factor of each row (R,) or element (R, C)."""
    decoded = op.block_scaled(quantizer).float()
    decoded = decoded.reshape(-1, decoded.shape[-1])  # an (E, K, N) view of transposed expert tiles -> rows
    return decoded * (factor[:, None] if factor.dim() == 1 else factor)


def _row_factors(amax: torch.Tensor, rows: int, bound: int, groups: RowGroups | None = None) -> torch.Tensor:
    return global_decode_factor(amax_per_row(amax, rows, groups).float().expand(rows), bound)


def _columnwise_pair(t: torch.Tensor, op: Operand, amax: torch.Tensor, spec: OperandSpec,
                     quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t^T as the columnwise quantizer reads it: transformed by spec.transform, zero-padded to ceil16(M) tokens;
    its dequantized operand), amax () or one per row of t^T."""
    ref = padded_transpose(run_rht16_columns(t, quantizer) if spec.transform != "none" else t)
    return ref, _dequantized(op, _row_factors(amax, ref.shape[0], spec.scale_bound), quantizer)


def _token_blocks_pair(t: torch.Tensor, tb: TokenBlocks, op: Operand, amax: torch.Tensor, spec: OperandSpec,
                       quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t^T in the grouped wgrad's token-block layout (C, P), transformed by spec.transform; its dequantized
    operand), amax per group (E,) or per group and column (E, C)."""
    laid = tb.gather(t)
    if spec.transform != "none":
        laid = run_rht16_columns(laid, quantizer)
    factor = global_decode_factor(tb.block_amax(amax), spec.scale_bound).repeat_interleave(BLOCK_SIZE, dim=0)
    factor = factor[None, :] if factor.dim() == 1 else factor.t()
    return laid.t(), _dequantized(op, factor.expand(laid.shape[1], -1), quantizer)


@torch.no_grad()
def quantized_backward_operands(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, recipe: FourOverSixRecipe,
                                offs: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{role: (operand, its dequantization)} for roles dy, dyT, xT, wT of the GEMM x (M, K) times w^T with output
    gradient dy (M, N), under `recipe` with backward='quantized': dense (w (N, K), offs None) or grouped (w (E, N,
    K) experts, offs the int32 inclusive token-group ends). The operands are the op's own
    (quant.grad_operands, seeds from GRADIENT_ROUNDING in the op's order), each next to the tensor its quantizer
    reads: dy (grouped: rows past offs[-1] zero, N zero-padded to a multiple of 16 for 1x16 weights); dyT and xT
    transposed and blocked along the tokens (dense: zero-padded to ceil16(M); grouped: each group padded to
    16-token blocks), Hadamard-transformed with wgrad_rht; wT = W^T (16x16: the forward's tiles transposed)."""
    grouped = offs is not None
    p = replace(recipe, backward="quantized").plan(grouped=grouped)  # wgrad_rht, gradient_rounding kept
    gq = gemm_quantizers(p.key, grouped, dy.device)
    with MAP4_STATS.paused():  # the forward's tiles, quantized again here, are no training forward
        if not grouped:
            return _dense_backward_operands(dy, x, w, p, gq)
        return _grouped_backward_operands(dy, x, w, offs, p, gq)


def _dense_backward_operands(dy, x, w, p: GemmPlan, gq) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    q = gq.backends.quantizer
    w_amax = tensor_amax(w)
    tiles = gq.w.rows(w, w_amax) if p.w_t.block == "16x16" else None  # the forward's tiles
    x_amax = tensor_amax(x)  # the forward's; a row-scaled x^T takes its column amaxes in the builder
    g = dense_grad_operands(dy, x, w, tiles, x_amax, w_amax, gq, True, True)
    return {"dy": (dy, _dequantized(g.dy, _row_factors(g.dy_amax, dy.shape[0], p.dy.scale_bound), q)),
            "dyT": _columnwise_pair(dy, g.dy_t, g.dy_t_amax, p.dy_t, q),
            "xT": _columnwise_pair(x, g.x_t, g.x_t_amax, p.x_t, q),
            "wT": (_columnwise_pair(w, g.w_t, w_amax, p.w_t, q) if p.w_t.block == "1x16" else
                   (w.t(), _dequantized(g.w_t, _row_factors(w_amax, w.shape[1], p.w_t.scale_bound), q)))}


def _grouped_backward_operands(dy, x, w, offs, p: GemmPlan, gq) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    q = gq.backends.quantizer
    experts, n, k = w.shape
    w_rows = w.reshape(experts * n, k)
    w_amax = run_expert_amax(w_rows, experts, q)
    tiles = gq.w.rows(w_rows, w_amax) if p.w_t.block == "16x16" else None
    a_amax, group_of_row, _ = run_token_groups(x, offs, p.row_scaled, q)
    g = grouped_grad_operands(dy, x, w.transpose(-2, -1), offs, group_of_row, a_amax, tiles, w_amax, gq, True, True)
    pad_n = -n % BLOCK_SIZE  # 1x16 weights: N zero-padded as the op pads it (16x16 tiles need N % 16 == 0)
    dy_rows = torch.nn.functional.pad(dy, (0, pad_n))
    groups = RowGroups(group_of_row, experts, amax_by_group=True)
    w_t = torch.nn.functional.pad(w.transpose(1, 2).reshape(experts * k, n), (0, pad_n))
    return {"dy": (torch.where((group_of_row < experts)[:, None], dy_rows, 0),
                   _dequantized(g.dy, _row_factors(g.dy_amax, dy.shape[0], p.dy.scale_bound, groups), q)),
            "dyT": _token_blocks_pair(dy, g.tokens, g.dy_t, g.dy_t_amax, p.dy_t, q),
            "xT": _token_blocks_pair(x, g.tokens, g.x_t, g.x_t_amax, p.x_t, q),
            "wT": (w_t, _dequantized(g.w_t, _row_factors(w_amax, experts * k, p.w_t.scale_bound), q))}


def _weight_rows(case: GemmCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(w as quantized rows, its amax): (N, K) per tensor, or experts flattened to (E*N, K), one amax each."""
    if case.offs is None:
        return case.w, tensor_amax(case.w)
    experts, n, k = case.w.shape
    rows = case.w.reshape(experts * n, k)
    ends = torch.arange(1, experts + 1, device=rows.device, dtype=torch.int32) * n
    return rows, group_amax(rows, ends).repeat_interleave(n)


def operand_errors(case: GemmCase, recipe: FourOverSixRecipe) -> dict[str, float]:
    """Relative quantization MSE per operand role and the forward's map-to-4 fraction under `recipe`."""
    plan = recipe.plan(grouped=case.offs is not None)
    x_amax, (w, w_amax) = _activation_amax(case, plan), _weight_rows(case)
    mse_x, map4_x = _spec_error(case.x, x_amax, plan.x, recipe.quantizer)
    map4_x = map4_x if case.token_rows is None else map4_x[case.token_rows]
    mse_w, map4_w = _spec_error(w, w_amax, plan.w, recipe.quantizer)
    out = {"map4_fraction": (map4_x.sum() + map4_w.sum()).item() / (map4_x.numel() + map4_w.numel()),
           "mse_x": mse_x, "mse_w": mse_w}
    # the quantized backward's operands, whichever backward the recipe runs, as the op quantizes them
    for role, (t, deq) in quantized_backward_operands(case.dy, case.x, case.w, recipe, case.offs).items():
        out[f"mse_{role}"] = relative_mse(t, deq)
    return out


def gemm_fidelity(case: GemmCase) -> dict[str, float]:
    """{"<metric>/<variant>": value} for both variants (the module docstring defines the metrics). The seeds of
    stochastic gradient rounding it draws are given back: a training step's own GEMMs get the seeds they would
    get unmeasured."""
    out = {}
    with torch.enable_grad(), MAP4_STATS.paused(), _seeds_given_back():
        y_ref, dx_ref, dw_ref = _output_and_grads(case, None)
        for variant, recipe in variant_recipes(case.recipe).items():
            metrics = operand_errors(case, recipe)
            for mode in BACKWARD_MODES:
                y, dx, dw = _output_and_grads(case, _with_backward(recipe, mode))
                if mode == BACKWARD_MODES[0]:  # the forward does not depend on the backward mode
                    metrics["fwd_snr_db"] = snr_db(y_ref, y)
                for name, g, ref in (("dx", dx, dx_ref), ("dw", dw, dw_ref)):
                    metrics[f"{mode}_{name}_cos"] = cosine(g, ref)
                    metrics[f"{mode}_{name}_norm_ratio"] = norm_ratio(g, ref)
            out.update({f"{k}/{variant}": v for k, v in metrics.items()})
    return out


@contextmanager
def _seeds_given_back():
    """GRADIENT_ROUNDING's call count as it was on entry, on exit (the seeds drawn inside are handed out again)."""
    calls = GRADIENT_ROUNDING.calls
    try:
        yield
    finally:
        GRADIENT_ROUNDING.calls = calls


def mean_metrics(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the GEMMs that have a finite value (SNR: the mean of the dB values)."""
    values: dict[str, list[float]] = {}
    for metrics in results.values():
        for key, value in metrics.items():
            values.setdefault(key, [])
            if math.isfinite(value):
                values[key].append(value)
    return {key: math.fsum(v) / len(v) if v else math.nan for key, v in values.items()}


def converted_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of every four-over-six Linear and routed-experts module of `model`."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, (FourOverSixLinear, _FourOverSixExperts))]


def _linear_cases(fqn: str, module: FourOverSixLinear, x: torch.Tensor, w_dtype, dy) -> list[GemmCase]:
    w = local_weight(module.weight, "weight").detach().to(w_dtype)
    return [GemmCase(fqn, x, w, dy.reshape(-1, w.shape[0]).to(x.dtype), module.recipe)]


def _expert_cases(fqn: str, module: _FourOverSixExperts, x: torch.Tensor, num_tokens_per_expert, w_dtype,
                  dy) -> list[GemmCase]:
    """w1, w3 and w2 of the gated chain in the module's token-group layout, their inner operands and gradients
    from the unquantized chain for the module's output gradient."""
    w = {n: local_weight(getattr(module, n), n, experts=True).detach().to(w_dtype) for n in _EXPERT_WEIGHTS}
    dy = dy.to(x.dtype)
    if ep_dispatched(module):
        sizes, dest = num_tokens_per_expert, None
    else:
        x, sizes, dest = pad_token_groups(x, num_tokens_per_expert, module.pad_multiple)
        dy = dy.new_zeros(x.shape[0], dy.shape[1]).index_copy(0, dest, dy)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    rows = int(offs[-1])
    x, dy = x[:rows], dy[:rows]
    h1, h3 = (_gemm(x, w[n], offs, None).requires_grad_() for n in ("w1", "w3"))
    h = F.silu(h1) * h3
    d1, d3 = torch.autograd.grad(_gemm(h, w["w2"], offs, None), (h1, h3), dy)
    return [GemmCase(f"{fqn}.w1", x, w["w1"], d1, module.recipe, offs, dest),
            GemmCase(f"{fqn}.w3", x, w["w3"], d3, module.recipe, offs, dest),
            GemmCase(f"{fqn}.w2", h.detach(), w["w2"], dy, module.recipe, offs, dest)]


class FidelityCapture:
    """Measures the GEMMs of `modules` ((fqn, converted module) pairs) in the forward and backward passes run
    while `active`: `take()` returns {gemm name: gemm_fidelity} in module order. A module is measured once per
    take (the first micro-batch; a forward without gradient is skipped). unquantized_forward: the modules
    compute what their unconverted parents compute (bf16 twin), so every captured input is the bf16 model's."""

    def __init__(self, modules: list[tuple[str, nn.Module]], *, unquantized_forward: bool = False):
        self.active = True
        self._modules = modules
        self._results: dict[str, dict[str, dict[str, float]]] = {}
        self._handles = [m.register_forward_hook(self._forward_hook(fqn)) for fqn, m in modules]
        self._unquantized = unquantized_forward
        for _, m in modules if unquantized_forward else ():
            m.forward = super(FourOverSixLinear if isinstance(m, FourOverSixLinear) else _FourOverSixExperts,
                              m).forward

    def _forward_hook(self, fqn: str):
        def hook(module, args, output):
            if not self.active or fqn in self._results or not output.requires_grad:
                return
            linear = isinstance(module, FourOverSixLinear)
            # the dtypes the converted forward hands the op (autocast's), x as (tokens, K)
            x, w = autocast_operands(args[0], module.weight if linear else module.w1)
            x, w_dtype, extra = x.detach().reshape(-1, x.shape[-1]), w.dtype, args[1:]

            def measure(dy):
                with torch.enable_grad(), no_autocast(dy.device):
                    cases = (_linear_cases if linear else _expert_cases)(fqn, module, x, *extra, w_dtype, dy)
                    self._results[fqn] = {c.name: gemm_fidelity(c) for c in cases}

            output.register_hook(measure)
        return hook

    def take(self) -> dict[str, dict[str, float]]:
        """The measured GEMMs' metrics in module order; the capture starts over."""
        results = [self._results.get(fqn, {}) for fqn, _ in self._modules]
        self._results = {}
        return {name: metrics for per_module in results for name, metrics in per_module.items()}

    def remove(self) -> None:
        """Drop the hooks (and the unquantized forwards)."""
        for handle in self._handles:
            handle.remove()
        for _, m in self._modules if self._unquantized else ():
            del m.forward

    def __enter__(self) -> "FidelityCapture":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
