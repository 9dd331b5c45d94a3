"""Weights quantized ahead of the GEMM, for reuse: QuantizedWeight and the functions that make one.

A weight does not change between optimizer steps, so its four-over-six quantization (amax, codes, scales and
the emulated GEMM's bf16 decode) can be computed once and handed to every forward until the next step:
gradient-accumulation micro-batches and activation-checkpoint recomputations then skip the weight's amax and
quantize passes. The ops quantize a given weight exactly as their own forward does (same amax, block, scope),
so a QuantizedWeight changes no result; it only has to be of the same weight (QuantizedWeight.check).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..quant.amax import run_expert_amax, run_tensor_amax
from ..quant.library import compile_opaque_op
from ..quant.operands import GemmQuantizers, Operand, gemm_quantizers
from ..quant.recipe import GemmPlan


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight as the ops' forward quantizes it: codes, scales, the bf16 block-scaled decode (None where real
    FP4 GEMMs run) and the amax, () for a dense weight or (E,) per expert; `source` records the recipe key, shape,
    dtype and device of the weight it was made from."""

    codes: Tensor
    scales: Tensor
    decoded: Tensor | None
    amax: Tensor
    source: tuple

    @classmethod
    def loaded(cls, codes: Tensor, scales: Tensor, amax: Tensor) -> "QuantizedWeight":
        """A weight known only by its quantization, as an inference checkpoint holds it (ops/checkpoint.py): no
        decode (the emulated GEMM decodes the codes) and no high-precision weight to check against."""
        return cls(codes, scales, None, amax, ("loaded", tuple(codes.shape), codes.device))

    def check(self, weight: Tensor, plan: GemmPlan, name: str) -> None:
        """Raise unless this was made from a weight like `weight` with the recipe whose plan the op runs."""
        want = _source(weight, plan)
        if self.source != want:
            raise ValueError(f"quantized_weight was made from {_describe(self.source)}, but {name} is "
                             f"{_describe(want)}; quantize that weight with this recipe")


def _source(weight: Tensor, plan: GemmPlan) -> tuple:
    return source_of(tuple(weight.shape), weight.dtype, weight.device, plan)


def source_of(shape: tuple, dtype: torch.dtype, device: torch.device, plan: GemmPlan) -> tuple:
    """The `source` of a QuantizedWeight made from a weight of this shape, dtype and device with `plan`."""
    return plan.key, tuple(shape), dtype, torch.device(device)


def _describe(source: tuple) -> str:
    key, shape, dtype, device = source
    return f"a {dtype} weight of shape {shape} on {device} (recipe {key})"


def quantize_weight_rows(w: Tensor, experts: int, q: GemmQuantizers) -> tuple[Operand, Tensor]:
    """(operand, amax) of weight rows w (R, K) by the plan's weight spec: one amax over w (experts=0) or one per
    run of R/experts rows (an expert's) (what the grouped forward quantizes; the dense forward takes its
    weight's amax in one launch with x's)."""
    quantizer = q.backends.quantizer
    amax = run_expert_amax(w, experts, quantizer) if experts else run_tensor_amax(w, quantizer)
    return q.w.rows(w, amax), amax


@compile_opaque_op("quantize_weight")
def quantize_weight_op(w: Tensor, experts: int, recipe: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(codes, scales, decode or an empty tensor, amax) of quantize_weight_rows."""
    wq, amax = quantize_weight_rows(w, experts, gemm_quantizers(recipe, bool(experts), w.device))
    return wq.codes, wq.scales, (w.new_empty(0, dtype=torch.bfloat16) if wq.decoded is None else wq.decoded), amax


@quantize_weight_op.register_fake
def _(w, experts, recipe):
    rows, k = w.shape
    fp4 = gemm_quantizers(recipe, bool(experts), w.device).backends.fp4
    decoded = w.new_empty(0 if fp4 else (rows, k), dtype=torch.bfloat16)
    return (w.new_empty(rows, k // 2, dtype=torch.uint8), w.new_empty(rows, k // 16, dtype=torch.float8_e4m3fn),
            decoded, w.new_empty(experts or (), dtype=torch.float32))


def quantize_rows(w: Tensor, experts: int, plan: GemmPlan, source: Tensor) -> QuantizedWeight:
    """QuantizedWeight of weight rows w (R, K) (see quantize_weight_op), recorded as made from `source`."""
    with torch.no_grad():
        codes, scales, decoded, amax = quantize_weight_op(w.contiguous(), experts, plan.key)
    return QuantizedWeight(codes, scales, decoded if decoded.numel() else None, amax, _source(source, plan))
