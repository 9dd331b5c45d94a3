"""Interval arithmetic for paired multi-seed comparisons: means with Student-t 95% intervals, the ratio of two
paired means with Fieller's interval, Holm's correction for a table of such intervals read at once, final losses
and grad-norm spikes of one run.

Why Student t: five to ten seeds are a small sample; the normal quantile would understate the interval by up to
40%. Why Fieller: the fraction of NVFP4's gap that 4/6 closes is a ratio of two noisy means; a per-seed ratio
explodes when one seed's gap is near 0, and the delta method ignores that the denominator may not be
distinguishable from 0 (then the interval is unbounded, and the report says so). Why Holm: a report of five
variants holds seven paired intervals; at 95% each, one of them excludes 0 by chance about a third of the time.
Holm's step-down keeps the chance of any false "excludes 0" in the table at 5% and is never less powerful than
Bonferroni's.
"""

import math
import statistics
from dataclasses import dataclass

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (standard tables).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
    """t_{0.975, df}: the table up to 30, beyond it the Cornish-Fisher expansion (error < 1e-3)."""
    if df < 1:
        raise ValueError(f"a t interval needs at least 2 samples (df >= 1), got df={df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Estimate:
    """A mean over n samples with its 95% interval (low/high None when n < 2)."""

    mean: float
    n: int
    sd: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def half_width(self) -> float | None:
        return None if self.low is None else (self.high - self.low) / 2

    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)


def mean_interval(samples: list[float]) -> Estimate:
    n = len(samples)
    if n == 0:
        raise ValueError("no samples")
    mean = statistics.fmean(samples)
    if n < 2:
        return Estimate(mean, n)
    sd = statistics.stdev(samples)
    h = t975(n - 1) * sd / math.sqrt(n)
    return Estimate(mean, n, sd, mean - h, mean + h)


@dataclass(frozen=True)
class Ratio:
    """mean(a) / mean(b) with Fieller's 95% interval; `bounded` False when b's mean is not distinguishable from 0
    (then low/high are None: any value is compatible with the data)."""

    value: float
    n: int
    low: float | None
    high: float | None
    bounded: bool


def fieller_ratio(a: list[float], b: list[float]) -> Ratio:
    """Ratio of the means of paired samples a_i, b_i: the values r with (ā - r b̄)^2 <= t^2 var(ā - r b̄)."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"fieller_ratio needs two paired lists of >= 2 samples, got {len(a)} and {len(b)}")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    saa = statistics.variance(a) / n
    sbb = statistics.variance(b) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1) / n
    t2 = t975(n - 1) ** 2
    value = ma / mb if mb else math.nan
    qa = mb * mb - t2 * sbb  # quadratic in r: qa r^2 - 2 qb r + qc <= 0
    qb = ma * mb - t2 * sab
    qc = ma * ma - t2 * saa
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return Ratio(value, n, None, None, False)
    root = math.sqrt(disc)
    return Ratio(value, n, (qb - root) / qa, (qb + root) / qa, True)


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's T with df degrees of freedom: 1 minus the density integrated over [-|t|, |t|]
    by Simpson's rule on 2000 intervals (error < 1e-6); beyond |t| = 60, twice the density's power-law tail
    c |t|^-df / df (relative error below 1e-3 there, where p < 0.011)."""
    if df < 1:
        raise ValueError(f"a t test needs df >= 1, got {df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    x = abs(t)
    if x > 60.0:
        return 2.0 * math.exp(log_norm + (df + 1) / 2 * math.log(df) - df * math.log(x)) / df

    def density(u: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(u * u / df))

    n, h = 2000, x / 2000
    inner = h / 3 * (density(0.0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n)))
    return max(0.0, 1.0 - 2.0 * inner)


def holm(pvalues: list[float], alpha: float = 0.05) -> list[bool]:
    """Which of the hypotheses (each "the paired mean is 0") Holm's step-down rejects at family-wise level alpha:
    sorted ascending, p_(i) is compared with alpha / (m - i), stopping at the first that is not below."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected


def paired_p(e: Estimate) -> float:
    """The two-sided p-value of "mean 0" for an estimate with its sd (n >= 2)."""
    if e.sd is None:
        raise ValueError("a p-value needs at least 2 samples")
    if e.sd == 0:
        return 0.0 if e.mean else 1.0
    return t_two_sided_p(e.mean / (e.sd / math.sqrt(e.n)), e.n - 1)


def final_loss(losses: dict[int, float], steps: int, tail: int) -> float:
    """Mean loss over the last `tail` of `steps` steps (every one of them must be logged)."""
    window = range(steps - tail + 1, steps + 1)
    missing = [s for s in window if s not in losses]
    if missing:
        raise ValueError(f"steps {missing[0]}..{missing[-1]} of the last {tail} are not logged")
    return statistics.fmean(losses[s] for s in window)


def spikes(grad_norms: dict[int, float], factor: float, window: int = 50, after: int = 10) -> list[int]:
    """Steps whose grad norm exceeds `factor` times the median of the `window` steps before it (from step
    `after` on: the first steps' norms fall fast by design)."""
    steps = sorted(grad_norms)
    out = []
    for i, s in enumerate(steps):
        before = [grad_norms[p] for p in steps[max(0, i - window):i]]
        if s > after and len(before) >= 5 and grad_norms[s] > factor * statistics.median(before):
            out.append(s)
    return out
