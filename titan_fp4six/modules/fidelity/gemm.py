"""gemm_fidelity: one GEMM's metrics for both variants and every backward mode, against the unquantized GEMM."""

from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.nn.functional as F

from ...ops import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear
from ...quant.process_state import GRADIENT_ROUNDING, MAP4_STATS
from ...quant.recipe import plain_nvfp4
from .metrics import cosine, norm_ratio, snr_db
from .operands import GemmCase, operand_errors

VARIANTS = ("nvfp4", "four_over_six")

BACKWARD_MODES = ("quantized", "dequantized", "high_precision")


def variant_recipes(recipe: FourOverSixRecipe) -> dict[str, FourOverSixRecipe]:
    """{variant: recipe}: plain NVFP4 (quant.recipe.plain_nvfp4) and the recipe itself."""
    return {"nvfp4": plain_nvfp4(recipe), "four_over_six": recipe}

def run_gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None,
          recipe: FourOverSixRecipe | None) -> torch.Tensor:
    """x times w^T, dense (offs None) or grouped: unquantized (recipe None) or through the four-over-six op."""
    if offs is None:
        return F.linear(x, w) if recipe is None else four_over_six_linear(x, w, recipe=recipe)
    w_t = w.transpose(-2, -1)
    return torch._grouped_mm(x, w_t, offs=offs) if recipe is None else four_over_six_grouped_mm(x, w_t, offs,
                                                                                                recipe=recipe)

def _output_and_grads(case: GemmCase, recipe: FourOverSixRecipe | None):
    x, w = case.x.detach().requires_grad_(), case.w.detach().requires_grad_()
    y = run_gemm(x, w, case.offs, recipe)
    return (y.detach(), *torch.autograd.grad(y, (x, w), case.dy))

def _with_backward(recipe: FourOverSixRecipe, mode: str) -> FourOverSixRecipe:
    """The recipe with backward `mode`; wgrad_rht and stochastic gradient rounding kept only for the quantized
    backward (the others refuse them)."""
    quantized = mode == "quantized"
    return replace(recipe, backward=mode, wgrad_rht=recipe.wgrad_rht and quantized,
                   gradient_rounding=recipe.gradient_rounding if quantized else "nearest")

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
