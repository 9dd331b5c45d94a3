"""FourOverSixRecipe: every knob of the four-over-six GEMMs, in one place, checked once at construction.

The TOML sections of the torchtitan integration derive their fields and defaults from this dataclass
(`KNOBS`), so a knob is declared, documented and validated here only. Modules store a recipe resolved for
their GEMM kind (`resolve`: backward never "auto"); the hot path passes it to the custom ops as its `key`
string and never validates it again.
"""

import functools
from dataclasses import dataclass, field, fields, replace

from ..dispatch.backend import QUANTIZERS
from ..numerics.validation import BLOCKS, ERR_MODES, SCALE_BOUNDS, check_choice

ACTIVATION_SCALINGS = ("tensor", "row")
BACKWARDS = ("auto", "quantized", "high_precision", "dequantized")
GEMMS = ("auto", "emulated", "fp4")
SCOPES = ("all", "weights", "activations", "none")


def _knob(default, valid, doc: str):
    return field(default=default, metadata={"valid": valid, "doc": doc})


@dataclass(frozen=True, kw_only=True)
class FourOverSixRecipe:
    """How a four-over-six GEMM quantizes and where it runs (docs/numerics.md, docs/ops.md)."""

    err_mode: str = _knob("mse", ERR_MODES, "Candidate choice per block between map-to-6 and map-to-4: 'mse' or "
                                            "'mae' error.")
    scale_bound: int = _knob(256, SCALE_BOUNDS, "Largest block scale B: 256 (four-over-six) or 448 (E4M3 max).")
    weight_block: str = _knob("16x16", BLOCKS, "Weight quantization tile: '16x16' (one quantization serves W and "
                                               "W^T) or '1x16'.")
    activation_scaling: str = _knob("tensor", ACTIVATION_SCALINGS, "Activation amax granularity: 'tensor' (per "
                                    "token group for experts) or 'row' (per token).")
    backward: str = _knob("auto", BACKWARDS, "Backward GEMMs: 'auto', 'quantized', 'high_precision' or "
                          "'dequantized' ('auto': quantized for per-tensor dense GEMMs, high_precision for "
                          "row-scaled activations and routed experts).")
    scope: str = _knob("all", SCOPES, "Operands that choose between the two candidates: 'all', 'weights', "
                       "'activations' or 'none' (the others keep the map-to-6 candidate; 'none' with "
                       "scale_bound=448 is plain NVFP4, docs/numerics.md).")
    quantizer: str = _knob("auto", QUANTIZERS, "Quantizer implementation (same bytes): 'auto' (Triton on CUDA, "
                           "the reference elsewhere), 'triton' (required) or 'reference' (pure PyTorch); the "
                           "environment variable TITAN_FP4SIX_QUANTIZER overrides it.")
    gemm: str = _knob("auto", GEMMS, "GEMM implementation: 'auto' (real NVFP4 GEMMs on Blackwell where they "
                      "apply, emulated elsewhere), 'emulated' or 'fp4' (required: Blackwell); "
                      "TITAN_FP4SIX_EMULATE=1 overrides it with 'emulated'.")

    def __post_init__(self):
        for f in fields(self):
            check_choice(f"FourOverSixRecipe.{f.name}", getattr(self, f.name), f.metadata["valid"])
        if self.backward == "quantized" and self.activation_scaling == "row":
            raise ValueError("FourOverSixRecipe.backward='quantized' is not defined with "
                             "FourOverSixRecipe.activation_scaling='row' (per-row scales do not transpose); use "
                             "backward='high_precision' or 'dequantized', or activation_scaling='tensor'")

    @property
    def row_scaled(self) -> bool:
        return self.activation_scaling == "row"

    @property
    def weights_choose(self) -> bool:
        """Whether weight operands choose between map-to-4 and map-to-6 (else map-to-6 only)."""
        return self.scope in ("all", "weights")

    @property
    def activations_choose(self) -> bool:
        """Whether activation operands (x, A and their columnwise forms) choose between the candidates."""
        return self.scope in ("all", "activations")

    def resolved_backward(self, grouped: bool) -> str:
        """The backward mode a dense (grouped=False) or grouped GEMM runs: never "auto"."""
        if grouped and self.backward == "quantized":
            raise ValueError("FourOverSixRecipe.backward='quantized' is not defined for grouped (MoE) GEMMs; "
                             "valid there: 'auto', 'high_precision', 'dequantized'")
        if self.backward != "auto":
            return self.backward
        return "high_precision" if grouped or self.row_scaled else "quantized"

    def resolve(self, grouped: bool) -> "FourOverSixRecipe":
        """This recipe with `backward` resolved for a dense or grouped GEMM (what modules store)."""
        backward = self.resolved_backward(grouped)
        return self if backward == self.backward else replace(self, backward=backward)

    @property
    def key(self) -> str:
        """The recipe as one string (knob values in field order), the form the custom ops take."""
        return ",".join([str(getattr(self, f.name)) for f in KNOBS])


KNOBS = tuple(fields(FourOverSixRecipe))
"""The recipe's knobs (dataclass fields with metadata "valid" and "doc"): what the TOML sections derive from."""


@functools.cache
def recipe_from_key(key: str) -> FourOverSixRecipe:
    """Inverse of FourOverSixRecipe.key (cached: the hot path parses each distinct recipe once)."""
    values = key.split(",")
    return FourOverSixRecipe(**{f.name: f.type(v) for f, v in zip(KNOBS, values)})
