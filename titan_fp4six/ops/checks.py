"""Shape / dtype / device checks of the GEMM ops' arguments, with errors that say what would be valid."""

import torch

from ..numerics.formats import BLOCK_SIZE
from ..numerics.validation import check_float_tensor
from ..quant.recipe import FourOverSixRecipe


def check_recipe(recipe) -> None:
    if not isinstance(recipe, FourOverSixRecipe):
        raise TypeError(f"recipe must be a titan_fp4six.FourOverSixRecipe, got {type(recipe).__name__} {recipe!r}; "
                        "build one from the knobs, e.g. FourOverSixRecipe(err_mode='mse')")


def blockable(*dims: int) -> bool:
    """The rule for GEMM dims NVFP4 blocks, in one place: every one a multiple of 16 (what the converters skip or
    refuse, and what the ops' checks raise for)."""
    return all(d % BLOCK_SIZE == 0 for d in dims)


def check_multiple(value: int, what: str) -> None:
    """A GEMM dim that NVFP4 blocks: a positive multiple of 16 (0 would leave nothing to quantize or
    reshape; only the token count M may be 0)."""
    if not (blockable(value) and value):
        raise ValueError(f"{what} is {value}; NVFP4 GEMMs need a positive multiple of {BLOCK_SIZE}")


def check_same_device(*named) -> None:
    devices = {t.device for _, t in named}
    if len(devices) > 1:
        raise ValueError("all operands must be on one device, got " + ", ".join(f"{n} on {t.device}" for n, t in named))


def check_linear_weight(weight, recipe) -> None:
    check_recipe(recipe)
    check_float_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    check_multiple(weight.shape[1], "K (weight.shape[1])")
    check_multiple(weight.shape[0], "N (weight.shape[0])")


def check_dense(x, weight, bias, recipe) -> None:
    check_linear_weight(weight, recipe)
    check_float_tensor(x, "x")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., K)")
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"x has K={x.shape[-1]} but weight (N, K) has shape {tuple(weight.shape)}")
    named = [("x", x), ("weight", weight)]
    if bias is not None:
        check_float_tensor(bias, "bias")
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        named.append(("bias", bias))
    check_same_device(*named)


def check_expert_weights(B_t, recipe) -> None:
    check_recipe(recipe)
    check_float_tensor(B_t, "B_t")
    if B_t.dim() != 3:
        raise ValueError(f"B_t must be 3-D (E, K, N), the transposed view of (E, N, K) weights; "
                         f"got shape {tuple(B_t.shape)}")
    experts, k, n = B_t.shape
    if not experts or not n:
        raise ValueError(f"B_t (E, K, N) has shape {tuple(B_t.shape)}; E (experts) and N must be positive")
    check_multiple(k, "K (B_t.shape[1])")
    if recipe.weight_block == "16x16":
        if not blockable(n):
            raise ValueError(f"weight_block='16x16' needs N (B_t.shape[2]) a multiple of {BLOCK_SIZE}, got {n}; "
                             "use weight_block='1x16'")


def check_grouped(A, B_t, offs, recipe) -> None:
    check_expert_weights(B_t, recipe)
    check_float_tensor(A, "A")
    if A.dim() != 2:
        raise ValueError(f"A must be 2-D (M, K), got shape {tuple(A.shape)}")
    experts, k, n = B_t.shape
    if A.shape[1] != k:
        raise ValueError(f"A has K={A.shape[1]} but B_t (E, K, N) has shape {tuple(B_t.shape)}")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32:
        got = offs.dtype if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise TypeError(f"offs must be an int32 tensor of inclusive group ends, got {got}")
    if offs.shape != (experts,):
        raise ValueError(f"offs must have shape ({experts},), one end per expert of B_t, got {tuple(offs.shape)}")
    check_same_device(("A", A), ("B_t", B_t), ("offs", offs))


def check_loaded_weight(x, weight, experts: int, recipe) -> None:
    """x (M, K) and a QuantizedWeight.loaded of (R, K) codes with one amax (experts=0) or one per expert."""
    check_recipe(recipe)
    check_float_tensor(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    rows, half = weight.codes.shape
    if weight.codes.dtype != torch.uint8 or weight.scales.dtype != torch.float8_e4m3fn:
        raise TypeError(f"weight codes must be uint8 and scales float8_e4m3fn, got {weight.codes.dtype} and "
                        f"{weight.scales.dtype}")
    if x.shape[1] != half * 2 or weight.scales.shape != (rows, half * 2 // BLOCK_SIZE):
        raise ValueError(f"x has K={x.shape[1]}; the weight's codes {tuple(weight.codes.shape)} and scales "
                         f"{tuple(weight.scales.shape)} must be (R, K/2) and (R, K/16)")
    if weight.amax.shape != ((experts,) if experts else ()) or (experts and rows % experts):
        raise ValueError(f"weight amax of shape {tuple(weight.amax.shape)} for {rows} rows; want "
                         f"{(experts,) if experts else ()} ({experts or 'no'} experts of equal rows)")
    check_same_device(("x", x), ("weight codes", weight.codes), ("weight scales", weight.scales),
                      ("weight amax", weight.amax))
