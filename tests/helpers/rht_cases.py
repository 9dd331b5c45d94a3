"""Inputs and comparisons for the rht16 tests (tests/test_rht.py, tests/helpers/interp_rht.py)."""

import torch

NAN_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN equals any NaN (a NaN's sign and payload are not specified)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    kind = NAN_BITS[a.dtype]
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a.view(kind) == b.view(kind)) | both_nan).all())


def realistic(name: str, n: int, g: torch.Generator) -> torch.Tensor:
    """FP32 data shaped like activations and gradients."""
    if name == "gaussian":
        return torch.randn(n, generator=g)
    if name == "small":
        return torch.randn(n, generator=g) * 1e-4
    if name == "heavy":
        return torch.randn(n, generator=g) / torch.rand(n, generator=g).clamp(min=1e-3) ** 0.5
    if name == "outliers":
        x = torch.randn(n, generator=g)
        return torch.where(torch.rand(n, generator=g) < 0.01, x * 1000, x)
    if name == "sparse":
        x = torch.randn(n, generator=g)
        return torch.where(torch.rand(n, generator=g) < 0.3, 0.0, x)
    raise ValueError(name)


REALISTIC = ("gaussian", "small", "heavy", "outliers", "sparse")


def edge_matrix(dtype, g: torch.Generator) -> torch.Tensor:
    """(48, 64) in dtype, columns of 16-row blocks holding the edge cases: zeros, -0, NaN, +-Inf, subnormals,
    the dtype's largest values, single non-zeros, cancellations, and random finite bit patterns."""
    info = torch.finfo(dtype)
    x = torch.randn(48, 64, generator=g)
    x[:, 0] = 0.0
    x[:, 1] = -0.0
    x[3, 2] = float("nan")
    x[5, 3] = float("inf")
    x[7, 4], x[8, 4] = float("inf"), float("-inf")
    x[:, 5] = info.tiny / 4  # subnormals (FP32 for float32 input: tiny / 4 is subnormal there too)
    x[:, 6] = info.max
    x[::2, 7] = -info.max
    x[:, 8] = 0.0
    x[9, 8] = 1.0
    x[:16, 9] = 1.0
    x[16:, 9] = torch.tensor([1.0, -1.0]).repeat(16)
    x[:, 10] = info.tiny
    x[::3, 10] = 1.0
    x = x.to(dtype)
    kind = NAN_BITS[dtype]
    bits = torch.randint(torch.iinfo(kind).min, torch.iinfo(kind).max, (48, 16), generator=g, dtype=torch.int64)
    rnd = bits.to(kind).view(dtype)
    x[:, 48:] = torch.where(torch.isfinite(rnd), rnd, torch.zeros_like(rnd))
    return x
