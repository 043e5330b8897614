"""Small-sample statistics over seeds: Student-t intervals, the paired t-test, the exact sign test and
percentile bootstrap intervals of a mean.

No SciPy: the t distribution's CDF is the regularized incomplete beta function, evaluated by
its continued fraction (modified Lentz), and a quantile is found by bisection on the CDF.
Accurate to about 1e-10, far below what three-significant-digit tables show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| >= |t|) of Student's t with `df` degrees of freedom."""
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (e.g. p=0.975 for a 95% interval)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must lie strictly between 0 and 1")
    if df <= 0:
        raise ValueError(f"df={df} must be positive")
    if p == 0.5:
        return 0.0
    tail = 2.0 * min(p, 1.0 - p)  # two-sided tail probability at the quantile
    hi = 1.0
    while t_sf2(hi, df) > tail:
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf2(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    q = 0.5 * (lo + hi)
    return q if p > 0.5 else -q


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation and a two-sided t-interval of `n` values (n < 2: no spread)."""

    n: int
    mean: float
    std: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    confidence: float = 0.95

    @property
    def half_width(self) -> Optional[float]:
        return None if self.lo is None else 0.5 * (self.hi - self.lo)


def summarize(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """Mean, std (n-1) and the t-interval mean +/- t_{(1+c)/2, n-1} * std / sqrt(n); needs n >= 1."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("summarize needs at least one value")
    mean = math.fsum(xs) / n
    if n < 2:
        return Summary(n, mean, None, None, None, confidence)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half, confidence)


@dataclass(frozen=True)
class Paired:
    """Paired comparison of two methods over matched seeds: differences d_i = a_i - b_i."""

    n: int
    mean_diff: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    t: Optional[float]
    p_t: Optional[float]
    wins: int          # pairs with a_i < b_i (a lower)
    losses: int        # pairs with a_i > b_i
    p_sign: Optional[float]


def sign_test(wins: int, losses: int) -> Optional[float]:
    """Exact two-sided sign test (ties dropped): P of a split at least this uneven under p=1/2."""
    m = wins + losses
    if m == 0:
        return None
    k = min(wins, losses)
    tail = math.fsum(math.comb(m, i) for i in range(k + 1)) / 2.0 ** m
    return min(1.0, 2.0 * tail)


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Paired:
    """Paired t-test of a - b (two-sided) with its t-interval, plus win/loss counts and the sign test.

    n < 2: mean difference only (interval, t and p are None). All differences equal (up to float
    rounding) and non-zero: t = +/-inf, p = 0; all zero: t and p are None (no evidence either way).
    """
    if len(a) != len(b):
        raise ValueError(f"paired needs equal lengths, got {len(a)} and {len(b)}")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    wins = sum(d < 0 for d in diffs)
    losses = sum(d > 0 for d in diffs)
    p_sign = sign_test(wins, losses)
    if n == 0:
        return Paired(0, None, None, None, None, None, 0, 0, None)
    s = summarize(diffs, confidence)
    if n < 2:
        return Paired(n, s.mean, None, None, None, None, wins, losses, p_sign)
    # Differences equal up to float rounding (e.g. 0.1 - 0.3 vs 0.2 - 0.4) count as constant.
    if s.std <= 1e-12 * abs(s.mean) or s.std == 0.0:
        if s.mean == 0.0:
            return Paired(n, 0.0, 0.0, 0.0, None, None, wins, losses, p_sign)
        return Paired(n, s.mean, s.lo, s.hi, math.copysign(math.inf, s.mean), 0.0, wins, losses, p_sign)
    t = s.mean / (s.std / math.sqrt(n))
    return Paired(n, s.mean, s.lo, s.hi, t, t_sf2(t, n - 1), wins, losses, p_sign)


#: Up to this many values the bootstrap enumerates all n^n resamples (exact, no random numbers); above it,
#: `BOOTSTRAP_RESAMPLES` resamples from a fixed seed.
BOOTSTRAP_EXACT_MAX_N = 6
BOOTSTRAP_RESAMPLES = 20_000


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95,
                       seed: int = 0) -> Optional[tuple[float, float]]:
    """Percentile bootstrap interval of the mean of `values` (resampling the values with replacement): the
    (1 - c)/2 and (1 + c)/2 quantiles (linear interpolation) of the resampled means; None for fewer than 2 values.

    Deterministic: all n^n equally likely resamples for n <= BOOTSTRAP_EXACT_MAX_N, else a fixed-seed sample.
    With 3 seeds the resampled means take 10 distinct values and the interval is close to the values' range:
    it describes the seeds that were run and, unlike the t-interval, assumes nothing about their distribution,
    but it under-covers at such n. Both are reported.
    """
    import itertools

    import numpy as np

    xs = np.asarray([float(v) for v in values], dtype=np.float64)
    n = len(xs)
    if n < 2:
        return None
    if n <= BOOTSTRAP_EXACT_MAX_N:
        idx = np.array(list(itertools.product(range(n), repeat=n)))
    else:
        idx = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    means = xs[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(lo), float(hi)
