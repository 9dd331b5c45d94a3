"""The fidelity metrics' arithmetic (what the package docstring defines), on plain tensors."""

import math

import torch


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-noise ratio of `out` against `ref` in dB (inf when equal, NaN when both are zero)."""
    ref = ref.double()
    signal, noise = ref.pow(2).sum().item(), (out.double() - ref).pow(2).sum().item()
    if noise == 0:
        return math.inf if signal > 0 else math.nan
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf

def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors as flat vectors (NaN if either is zero)."""
    a, b = a.double().flatten(), b.double().flatten()
    norms = a.norm().item() * b.norm().item()
    return a.dot(b).item() / norms if norms else math.nan

def norm_ratio(a: torch.Tensor, ref: torch.Tensor) -> float:
    """|a| / |ref| (NaN for a zero ref)."""
    ref_norm = ref.double().norm().item()
    return a.double().norm().item() / ref_norm if ref_norm else math.nan

def relative_mse(x: torch.Tensor, xq: torch.Tensor) -> float:
    """sum((xq - x)^2) / sum(x^2): the quantization MSE relative to x's mean square (0 for an exact zero x)."""
    x = x.double()
    return ((xq.double() - x).pow(2).sum() / x.pow(2).sum().clamp_min(1e-300)).item()


def mean_metrics(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the GEMMs that have a finite value (SNR: the mean of the dB values)."""
    values: dict[str, list[float]] = {}
    for metrics in results.values():
        for key, value in metrics.items():
            values.setdefault(key, [])
            if math.isfinite(value):
                values[key].append(value)
    return {key: math.fsum(v) / len(v) if v else math.nan for key, v in values.items()}
