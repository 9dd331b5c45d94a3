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

Modules: metrics.py (the arithmetic), operands.py (GemmCase, the operands' quantization errors), gemm.py
(gemm_fidelity), capture.py (FidelityCapture).
"""

from .capture import FidelityCapture, converted_modules
from .gemm import BACKWARD_MODES, VARIANTS, gemm_fidelity, variant_recipes
from .metrics import cosine, mean_metrics, norm_ratio, relative_mse, snr_db
from .operands import GemmCase, operand_errors, quantized_backward_operands

__all__ = ["BACKWARD_MODES", "FidelityCapture", "GemmCase", "VARIANTS", "converted_modules", "cosine",
           "gemm_fidelity", "mean_metrics", "norm_ratio", "operand_errors", "quantized_backward_operands",
           "relative_mse", "snr_db", "variant_recipes"]
