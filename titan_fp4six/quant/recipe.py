"""FourOverSixRecipe: every knob of the four-over-six GEMMs, in one place, checked once at construction.

The TOML sections of the torchtitan integration derive their fields and defaults from this dataclass
(`KNOBS`), so a knob is declared, documented and validated here only. resolve_plan turns a recipe into a
GemmPlan, the operand spec of every role of a dense or grouped GEMM; modules store a recipe resolved for their
GEMM kind (`resolve`: backward never "auto"); the hot path passes its plan to the custom ops as its `key`
string (a custom op takes no Python object), and the op bodies turn it back into the plan with plan_of_key, a
pure function cached per key: any process gets the same plan from the same string (a vLLM worker, a compile
subprocess, an RL engine rank), without a recipe built there first.
"""

import functools

from dataclasses import dataclass, field, fields, replace

from .backends import GEMMS, QUANTIZERS
from ..numerics.formats import STANDARD_BOUND
from ..numerics.spec import NVFP4, NVFP4_STOCHASTIC, OperandSpec
from ..numerics.validation import BLOCKS, ERR_MODES, SCALE_BOUNDS, check_choice

ACTIVATION_SCALINGS = ("tensor", "row")
BACKWARDS = ("auto", "quantized", "high_precision", "dequantized")
GRADIENT_ROUNDINGS = ("nearest", "stochastic")
SCOPES = ("all", "weights", "activations", "none")


def _knob(default, valid, doc: str):
    return field(default=default, metadata={"valid": valid, "doc": doc})


@dataclass(frozen=True, kw_only=True)
class FourOverSixRecipe:
    """How a four-over-six GEMM quantizes and where it runs (docs/numerics.md, docs/ops.md). `key`: the knob
    values as one string in field order (from_key is its inverse; plan_of_key the plan it names)."""

    err_mode: str = _knob("mse", ERR_MODES, "Candidate choice per block between map-to-6 and map-to-4: 'mse' or "
                                            "'mae' error.")
    scale_bound: int = _knob(256, SCALE_BOUNDS, "Largest block scale B: 256 (four-over-six) or 448 (E4M3 max).")
    weight_block: str = _knob("16x16", BLOCKS, "Weight quantization tile: '16x16' (one quantization serves W and "
                                               "W^T) or '1x16'.")
    activation_scaling: str = _knob("tensor", ACTIVATION_SCALINGS, "Activation amax granularity: 'tensor' (per "
                                    "token group for experts) or 'row' (per token).")
    backward: str = _knob("auto", BACKWARDS, "Backward GEMMs: 'auto', 'quantized', 'high_precision' or "
                          "'dequantized' ('auto': quantized for per-tensor dense GEMMs, high_precision for "
                          "row-scaled activations and routed experts; 'quantized' applies to all of them).")
    wgrad_rht: bool = _knob(False, (False, True), "16-point randomized Hadamard transform (TransformerEngine's "
                            "sign vector) of both weight-gradient GEMM operands, x^T and dy^T, along the tokens "
                            "before their amax and quantization (docs/numerics.md section 11); needs the quantized "
                            "backward.")
    gradient_rounding: str = _knob("nearest", GRADIENT_ROUNDINGS, "E2M1 rounding of the quantized backward's "
                                   "gradient operand dy: 'nearest' or 'stochastic' (unbiased, Philox bits seeded "
                                   "from the run's seed and step; needs backward 'quantized' or 'auto' resolving "
                                   "to it).")
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
        # The key and both plans, made once here: the hot path reads them as plain attributes (a cached_property
        # takes a lock, which torch.compile cannot trace).
        object.__setattr__(self, "key", ",".join([str(getattr(self, f.name)) for f in KNOBS]))
        object.__setattr__(self, "_dense_plan", resolve_plan(self, grouped=False))
        object.__setattr__(self, "_grouped_plan", _plan_or_none(self, grouped=True))

    @classmethod
    def from_key(cls, key: str) -> "FourOverSixRecipe":
        """The recipe whose `key` this is (a recipe's or a plan's), checked like any other construction."""
        values = key.split(",")
        if len(values) != len(KNOBS):
            raise ValueError(f"{key!r} is not a FourOverSixRecipe key: it holds {len(values)} comma-separated "
                             f"values, a key holds one per knob ({', '.join(f.name for f in KNOBS)})")
        return cls(**{f.name: _parse_knob(f, v) for f, v in zip(KNOBS, values)})

    def plan(self, grouped: bool) -> "GemmPlan":
        """This recipe resolved for a dense (grouped=False) or grouped GEMM (resolve_plan)."""
        # Two attributes, not a tuple indexed by the bool: torch.compile cannot index a tuple with a bool.
        plan = self._grouped_plan if grouped else self._dense_plan
        return plan or resolve_plan(self, grouped)  # None where resolve_plan raises: it raises here again

    @property
    def stochastic(self) -> bool:
        """Whether the quantized backward rounds its gradient operand stochastically."""
        return self.gradient_rounding == "stochastic"

    def resolve(self, grouped: bool) -> "FourOverSixRecipe":
        """This recipe with `backward` resolved for a dense or grouped GEMM (what modules store)."""
        backward = self.plan(grouped).backward
        return self if backward == self.backward else replace(self, backward=backward)


@dataclass(frozen=True)
class GemmPlan:
    """A recipe resolved for one GEMM kind: the spec of every operand role, the backward mode and the
    implementation knobs. dy, x_t, w_t, dy_t: the quantized backward's operands (gradient, x^T, W^T, dy^T; None
    in the other modes), dense and grouped, per-tensor and row-scaled activations (docs/numerics.md, section 9):
    dy's amax per tensor (dense) or per token group (grouped, scaling "group"); x_t's (blocks along the
    tokens) the forward's per-tensor / per-group amax, or for row-scaled x (scaling "row") one per row of x^T,
    i.e. per column of x (and per group), as TransformerEngine's row-scaled NVFP4 does; x_t and dy_t, the
    weight-gradient GEMM's operands, carry transform 'rht16' with wgrad_rht (their amaxes then the transformed
    tensors'); dy and dy_t carry rounding 'stochastic' with gradient_rounding; a 16x16 w_t is the forward's
    tiles transposed (a tile is its own transpose), not quantized again. key: the resolved recipe's key, the form
    the custom ops take (plan_of_key turns it back into this plan)."""

    key: str
    backward: str
    x: OperandSpec
    w: OperandSpec
    dy: OperandSpec | None
    x_t: OperandSpec | None
    w_t: OperandSpec | None
    dy_t: OperandSpec | None
    quantizer: str
    gemm: str
    row_scaled: bool  # activation_scaling='row': x's amax per row


def resolve_plan(recipe: FourOverSixRecipe, grouped: bool) -> GemmPlan:
    """The one place that reads `scope`, `weight_block`, `activation_scaling`, `backward`, `wgrad_rht` and
    `gradient_rounding` (an error where the backward quantizes no gradient): the spec
    of every operand role of a dense or grouped GEMM ("auto" backward: quantized for per-tensor dense GEMMs,
    high_precision for row-scaled activations and routed experts; an explicit "quantized" holds for both)."""
    row = recipe.activation_scaling == "row"
    backward = recipe.backward
    if backward == "auto":
        backward = "high_precision" if grouped or row else "quantized"
    if recipe.stochastic and backward != "quantized":
        why = (f"resolves to {backward!r} for {'grouped (MoE) GEMMs' if grouped else 'row-scaled activations'}, "
               "which quantizes no gradient" if recipe.backward == "auto" else "quantizes none")
        raise ValueError(f"FourOverSixRecipe.gradient_rounding='stochastic' rounds the quantized backward's "
                         f"gradient, but FourOverSixRecipe.backward={recipe.backward!r} {why}; use "
                         f"backward='quantized' ('auto' resolves to it for per-tensor dense GEMMs only), or "
                         f"gradient_rounding='nearest'")

    def spec(choose: bool, block: str, scaling: str) -> OperandSpec:
        return OperandSpec("4/6" if choose else "6", block, scaling, recipe.scale_bound, recipe.err_mode)

    x = spec(recipe.scope in ("all", "activations"), "1x16", "row" if row else "group" if grouped else "tensor")
    w = spec(recipe.scope in ("all", "weights"), recipe.weight_block, "tensor")  # an expert's tensor if grouped
    quantized = backward == "quantized"
    if recipe.wgrad_rht and not quantized:
        resolved = f" (resolved to {backward!r})" if backward != recipe.backward else ""
        raise ValueError(f"FourOverSixRecipe.wgrad_rht=True transforms the quantized backward's weight-gradient "
                         f"operands, but FourOverSixRecipe.backward={recipe.backward!r}{resolved} quantizes no "
                         f"gradient of {'grouped' if grouped else 'dense'} GEMMs; use backward='quantized' or "
                         "wgrad_rht=False")
    key = recipe.key if backward == recipe.backward else replace(recipe, backward=backward).key
    if not quantized:
        return GemmPlan(key, backward, x, w, None, None, None, None, recipe.quantizer, recipe.gemm, row)
    dy = NVFP4_STOCHASTIC if recipe.stochastic else NVFP4
    dy = replace(dy, scaling="group") if grouped else dy  # grouped: one amax per token group
    rht = "rht16" if recipe.wgrad_rht else "none"  # x_t and dy_t: the wgrad GEMM's operands
    return GemmPlan(key, backward, x, w, dy, replace(x, transform=rht), w, replace(dy, transform=rht),
                    recipe.quantizer, recipe.gemm, row)


def _plan_or_none(recipe: FourOverSixRecipe, grouped: bool) -> GemmPlan | None:
    """resolve_plan, or None where it raises (FourOverSixRecipe.plan calls it again then, to raise)."""
    try:
        return resolve_plan(recipe, grouped)
    except ValueError:
        return None


PLAIN_NVFP4 = {"scope": "none", "scale_bound": STANDARD_BOUND}
"""The knob values that turn a four-over-six recipe into plain NVFP4 (docs/numerics.md): no operand chooses
(map-to-6 everywhere) and block scales bounded by 448. The fidelity metrics and `compare` derive their NVFP4 twin
with it."""


def plain_nvfp4(recipe: FourOverSixRecipe) -> FourOverSixRecipe:
    """The recipe's plain-NVFP4 twin (PLAIN_NVFP4), every other knob kept."""
    return replace(recipe, **PLAIN_NVFP4)


KNOBS = tuple(fields(FourOverSixRecipe))
"""The recipe's knobs (dataclass fields with metadata "valid" and "doc"): what the TOML sections derive from."""


def _parse_knob(knob, text: str):
    """A knob's value from its text in a key: the type of the knob's default (str(True) is 'True')."""
    kind = type(knob.default)
    if kind is bool:
        return {"True": True, "False": False}.get(text, text)  # anything else: refused by check_choice
    if kind is int:
        return int(text) if text.lstrip("-").isdigit() else text
    return text


@functools.cache
def plan_of_key(key: str, grouped: bool) -> GemmPlan:
    """The plan a recipe's key (or a plan's, what the custom ops' bodies receive) names for a dense or grouped
    GEMM: resolved from the key's knob values alone, the same in every process."""
    return FourOverSixRecipe.from_key(key).plan(grouped)
