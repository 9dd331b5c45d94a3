"""Quantized weights as an inference checkpoint holds them, and the recipe knobs that travel with them.

The layout is ModelOpt's NVFP4 (what vLLM, SGLang and TensorRT-LLM read): per weight `weight` (uint8 (N, K/2), the
packed E2M1 codes, element 2j in the low nibble), `weight_scale` (float8_e4m3fn (N, K/16), one scale per 1x16
block; a 16x16 tile's scale is repeated on its 16 rows, as the quantizer stores it) and `weight_scale_2` (FP32
(1,), the global decode factor amax * fl(1/(6B)) itself). It was chosen over compressed-tensors'
`nvfp4-pack-quantized` because that format stores the global scale as a divisor G and engines decode with
fl(1/G): fl(1/fl(1/f)) != f for about 17% of FP32 factors f (uniformly drawn), so that export could not be
bit-exact with a plain reciprocal. The factor is all the emulated and the FP4 GEMMs use of a weight's amax (docs/numerics.md, Decode);
`amax_for_factor` gives back an amax with exactly that factor.

`serving_knobs` / `serving_recipe`: the recipe knobs that decide what an inference forward computes (the
weights' bytes and the activations' quantization), written per module into the checkpoint's quantization_config
by the export (integration/export.py) and read back by the vLLM plugin (titan_fp4six/vllm_plugin).
"""

from dataclasses import asdict

import torch
from torch import Tensor

from ..numerics.reference import global_decode_factor
from ..quant.recipe import FourOverSixRecipe

QUANT_METHOD = "four_over_six"
"""quantization_config.quant_method of an exported checkpoint: the vLLM plugin's registered name."""
SERVING_KNOBS = ("err_mode", "scale_bound", "weight_block", "activation_scaling", "scope")
"""The knobs an inference forward depends on; the backward's and the implementation knobs do not travel."""
WEIGHT_SUFFIXES = ("weight", "weight_scale", "weight_scale_2")
"""The tensors of one quantized weight: codes, block scales, global decode factor."""


def serving_knobs(recipe: FourOverSixRecipe) -> dict:
    return {k: v for k, v in asdict(recipe).items() if k in SERVING_KNOBS}


def serving_recipe(knobs: dict, where: str) -> FourOverSixRecipe:
    """The inference recipe of a module's knobs (checked: unknown or missing knobs, invalid values), on the
    engine's device's implementations (quantizer and gemm 'auto'); `where` names the module in errors."""
    if not isinstance(knobs, dict) or set(knobs) != set(SERVING_KNOBS):
        got = sorted(knobs) if isinstance(knobs, dict) else type(knobs).__name__
        raise ValueError(f"quantization_config of {where}: the knobs must be exactly {list(SERVING_KNOBS)}, got {got}")
    try:
        return FourOverSixRecipe(**knobs)
    except ValueError as e:
        raise ValueError(f"quantization_config of {where}: {e}") from e


def weight_tensors(codes: Tensor, scales: Tensor, amax: Tensor, scale_bound: int) -> dict[str, Tensor]:
    """The checkpoint tensors of one weight (WEIGHT_SUFFIXES) from its quantization; amax: a 0-d tensor."""
    factor = global_decode_factor(amax.float().reshape(1), scale_bound)
    return dict(zip(WEIGHT_SUFFIXES, (codes.contiguous(), scales.contiguous(), factor)))


def amax_for_factor(factor: Tensor, scale_bound: int) -> Tensor:
    """An FP32 amax whose global decode factor amax * fl(1/(6B)) is exactly `factor` (any shape); NaN stays NaN.
    The amax behind a factor lies within two ulps of factor / fl(1/(6B)). A negative factor, or one no amax
    gives, is no checkpoint of this package's: an error."""
    factor = factor.float()
    if bool((factor < 0).any()):
        raise ValueError(f"weight_scale_2 holds {factor[factor < 0][0].item()!r}: a global decode factor "
                         "amax/(6B) is >= 0")
    guess = (factor.double() / global_decode_factor(torch.ones((), dtype=torch.float64), scale_bound)).float()
    bits = guess.view(torch.int32)
    found = torch.where(torch.isnan(factor), factor, torch.nan)
    for step in (0, -1, 1, -2, 2):
        candidate = (bits + step).view(torch.float32)
        hit = torch.isnan(found) & (global_decode_factor(candidate, scale_bound) == factor)
        found = torch.where(hit, candidate, found)
    missing = torch.isnan(found) & ~torch.isnan(factor)
    if bool(missing.any()):
        raise ValueError(f"weight_scale_2 {factor[missing][0].item()!r} is no amax * fl(1/(6*{scale_bound})): not a "
                         f"global decode factor of scale_bound={scale_bound}")
    return found
