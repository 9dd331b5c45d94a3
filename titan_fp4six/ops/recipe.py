"""FourOverSixRecipe: the knobs of the numerics spec for the four-over-six GEMMs, validated once at construction."""

from dataclasses import dataclass

from ..numerics.validation import BLOCKS, ERR_MODES, SCALE_BOUNDS, check_choice

ACTIVATION_SCALINGS = ("tensor", "row")
BACKWARDS = ("auto", "quantized", "high_precision", "dequantized")


def _check(name: str, value, valid) -> None:
    check_choice(f"FourOverSixRecipe.{name}", value, valid)


@dataclass(frozen=True, kw_only=True)
class FourOverSixRecipe:
    """How a four-over-six GEMM quantizes (see docs/numerics.md, 'Knobs and defaults').

    backward="auto" resolves per the spec: "quantized" for per-tensor dense GEMMs, "high_precision" for
    row-scaled activations and for grouped (MoE) GEMMs; use `resolved_backward(grouped)`.
    """

    err_mode: str = "mse"
    scale_bound: int = 256
    weight_block: str = "16x16"
    activation_scaling: str = "tensor"
    backward: str = "auto"

    def __post_init__(self):
        _check("err_mode", self.err_mode, ERR_MODES)
        _check("scale_bound", self.scale_bound, SCALE_BOUNDS)
        _check("weight_block", self.weight_block, BLOCKS)
        _check("activation_scaling", self.activation_scaling, ACTIVATION_SCALINGS)
        _check("backward", self.backward, BACKWARDS)
        if self.backward == "quantized" and self.activation_scaling == "row":
            raise ValueError("FourOverSixRecipe.backward='quantized' is not defined with activation_scaling='row' "
                             "(per-row scales do not transpose); use backward='high_precision' or 'dequantized', "
                             "or activation_scaling='tensor'")

    @property
    def row_scaled(self) -> bool:
        return self.activation_scaling == "row"

    def resolved_backward(self, grouped: bool) -> str:
        """The backward mode a dense (grouped=False) or grouped GEMM runs: never "auto"."""
        if grouped and self.backward == "quantized":
            raise ValueError("FourOverSixRecipe.backward='quantized' is not defined for grouped (MoE) GEMMs; "
                             "valid there: 'auto', 'high_precision', 'dequantized'")
        if self.backward != "auto":
            return self.backward
        return "high_precision" if grouped or self.row_scaled else "quantized"
