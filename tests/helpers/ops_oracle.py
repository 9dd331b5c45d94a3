"""Float64 oracles for the GEMM ops, built from the public numerics API (the quantizers are tested on their
own against the scalar spec oracle): exact dequantized operands in float64 and float64 GEMMs."""

import torch

from titan_fp4six.quant import decode_block_scaled, four_over_six_quantize, nvfp4_quantize


def exact(codes, scales, amax, bound) -> torch.Tensor:
    """The exact real values e2m1 * scale * amax / (6B) in float64 (amax scalar or per row)."""
    amax = amax.double()
    amax = amax if amax.dim() == 0 else amax[:, None]
    return decode_block_scaled(codes, scales, torch.float64) * amax / (6.0 * bound)


def four_six64(x, amax, recipe, block="1x16") -> torch.Tensor:
    q = four_over_six_quantize(x.contiguous(), amax, block=block, err_mode=recipe.err_mode,
                               scale_bound=recipe.scale_bound)
    return exact(q.codes, q.scales, amax, recipe.scale_bound)


def standard64(x, amax) -> torch.Tensor:
    q = nvfp4_quantize(x.contiguous(), amax)
    return exact(q.codes, q.scales, amax, 448)


def pad16(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 16))


def assert_matches(out: torch.Tensor, oracle: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor, rel: float):
    """out ~ oracle = a64 @ b64 up to `rel` relative rounding of the result plus FP32 accumulation error
    (bounded through |a| @ |b|)."""
    bound = rel * oracle.abs() + 2.0 ** -18 * (a64.abs() @ b64.abs()) + 1e-30
    err = (out.double() - oracle).abs()
    assert torch.isfinite(out).all()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


def rel_for(dtype) -> float:
    """One rounding to dtype, with margin."""
    return {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -20}[dtype]
