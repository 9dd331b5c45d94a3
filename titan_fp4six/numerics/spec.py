"""OperandSpec: how one GEMM operand is quantized. The recipe resolves to one spec per operand role, its
role quantizers (quant/operands.py) quantize a tensor by their spec and the Triton quantizer derives its
compile-time flags from it, so a new way to quantize (a rounding, a transform) is added here first."""

import functools
from dataclasses import dataclass, fields, replace

from .formats import STANDARD_BOUND
from .validation import BLOCKS, ERR_MODES, SCALE_BOUNDS, check_choice

CANDIDATES = ("4/6", "6", "nvfp4")
"""'4/6': each block keeps the candidate (map-to-4 or map-to-6) of smaller error; '6': map-to-6 in every block
(the four-over-six arithmetic, for operands outside the recipe's scope); 'nvfp4': standard NVFP4 (one
candidate, its own scale arithmetic; scale_bound 448, 1x16 blocks)."""
SCALINGS = ("tensor", "row", "group")
"""Where an operand's global amax comes from: the whole tensor (an expert's, for expert weights), each row
(token), or each token group of a grouped GEMM."""
ROUNDINGS = ("nearest", "stochastic")
"""How the E2M1 element codes round: 'nearest' (ties to even, docs/numerics.md section 2) or 'stochastic'
(section 12: unbiased, from Philox bits of a per-call seed; standard NVFP4 gradient operands only). The E4M3
block scales always round to nearest."""
TRANSFORMS = ("none", "rht16")
"""'none', or 'rht16': each 1x16 block of the operand (as the GEMM consumes it) is replaced by its 16-point
randomized Hadamard transform (numerics.hadamard, docs/numerics.md section 11) before the amax and the
quantization; the operand's amax is then that of the transformed tensor. 1x16 blocks only."""


@dataclass(frozen=True)
class OperandSpec:
    """One operand's quantization; checked once at construction (specs are made when a recipe is resolved)."""

    candidates: str = "4/6"
    block: str = "1x16"
    scaling: str = "tensor"
    scale_bound: int = 256
    err_mode: str = "mse"
    rounding: str = "nearest"
    transform: str = "none"

    def __post_init__(self):
        for f in fields(self):
            check_choice(f"OperandSpec.{f.name}", getattr(self, f.name), _VALID[f.name])
        if self.candidates == "nvfp4" and (self.scale_bound != STANDARD_BOUND or self.block != "1x16"):
            raise ValueError(f"OperandSpec.candidates='nvfp4' is standard NVFP4: scale_bound={STANDARD_BOUND}, "
                             f"block='1x16'; got scale_bound={self.scale_bound}, block={self.block!r}")
        if self.rounding == "stochastic" and self.candidates != "nvfp4":
            raise ValueError(f"OperandSpec.rounding='stochastic' is defined for OperandSpec.candidates='nvfp4' only "
                             f"(the quantized backward's gradient operand); got candidates={self.candidates!r}")
        if self.transform != "none" and self.block != "1x16":
            raise ValueError(f"OperandSpec.transform={self.transform!r} transforms 1x16 blocks; got "
                             f"block={self.block!r}")

    @property
    def untransformed(self) -> "OperandSpec":
        """This spec without its transform: how the transformed tensor itself is quantized."""
        return _untransformed(self)

    @property
    def choose(self) -> bool:
        """Whether blocks choose between map-to-4 and map-to-6."""
        return self.candidates == "4/6"


_VALID = {"candidates": CANDIDATES, "block": BLOCKS, "scaling": SCALINGS, "scale_bound": SCALE_BOUNDS,
          "err_mode": ERR_MODES, "rounding": ROUNDINGS, "transform": TRANSFORMS}


@functools.cache
def _untransformed(spec: OperandSpec) -> OperandSpec:
    return spec if spec.transform == "none" else replace(spec, transform="none")


NVFP4 = OperandSpec(candidates="nvfp4", scale_bound=STANDARD_BOUND)
"""Standard NVFP4 (the quantized backward's gradient operand)."""
NVFP4_STOCHASTIC = OperandSpec(candidates="nvfp4", scale_bound=STANDARD_BOUND, rounding="stochastic")
"""Standard NVFP4 with stochastically rounded codes (gradient_rounding='stochastic'); quantizing by it takes a
seed."""


@functools.cache
def four_over_six_spec(block: str, err_mode: str, scale_bound: int, choose: bool) -> OperandSpec:
    """The spec of the public four-over-six quantizers' arguments (cached: their eager path builds none)."""
    return OperandSpec("4/6" if choose else "6", block, scale_bound=scale_bound, err_mode=err_mode)
