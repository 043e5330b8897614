"""Small-sample statistics over seeds: Student-t intervals, the paired t-test, the exact sign test and
percentile bootstrap intervals of a mean.

The sign test is SciPy's `binomtest`, and a bootstrap over more than `BOOTSTRAP_EXACT_MAX_N` values is
SciPy's `bootstrap`. The t distribution, the t-intervals and the paired t-test are computed here: the
t distribution's CDF is the regularized incomplete beta function, evaluated by its continued fraction
(modified Lentz), and a quantile is found by bisection on the CDF; both agree with SciPy's to about
1e-12 (relative) for 1 to 1000 degrees of freedom, but not to the last digit, and the committed reports
(docs/results/) print intervals, t and p in full precision in their `data/*.csv`: SciPy's `t.ppf`,
`t.sf` or `ttest_rel` would change those files (each function below says what would move). The exact
bootstrap over at most `BOOTSTRAP_EXACT_MAX_N` values stays here too: SciPy's only samples (see
`bootstrap_interval`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
from scipy.stats import binomtest, bootstrap


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
    """Regularized incomplete beta function I_x(a, b) (a probability in [0, 1]) for a, b > 0 and 0 <= x <= 1.

    The engine of `t_sf2`, and kept for it rather than `scipy.special.betainc`: at the t-tails the committed
    reports use, the two differ in the last digit or two (see `t_sf2`).
    """
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| >= |t|) (in [0, 1]) of Student's t with `df` degrees of freedom, `t` in
    standard errors: I_{df/(df+t^2)}(df/2, 1/2) by `betainc`.

    Not `2 * scipy.stats.t.sf(abs(t), df)`: SciPy's value differs from this continued fraction by up to about
    2e-15 (relative), in the last digit, for most paired t statistics in the committed reports, so their `p_t`
    column (data/paired.csv) would change.
    """
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom, in standard errors (e.g. p=0.975: the
    multiplier of a 95% interval's half-width), by bisection on `t_sf2` to 1e-12 (relative).

    Not `scipy.stats.t.ppf`: SciPy's quantile is closer to the exact one than this bisection stops
    (t.ppf(0.975, 1) = 12.706204736174694 against 12.706204736172367 here, t.ppf(0.975, 2) = 4.302652729749462
    against 4.302652729749752), so every t-interval bound of the committed reports (`lo`, `hi` in
    data/matched_summary.csv and data/paired.csv, `x_lo` to `y_hi` in data/pareto_points.csv) would move in
    its 13th significant digit.
    """
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
        """Half the interval's width, in the values' units; None without an interval (n < 2)."""
        return None if self.lo is None else 0.5 * (self.hi - self.lo)


def summarize(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """Mean, std (n-1) and the t-interval mean +/- t_{(1+c)/2, n-1} * std / sqrt(n), in the values' units;
    needs n >= 1.

    The quantile is `t_quantile`'s, not `scipy.stats.t.interval`'s (which uses t.ppf; see `t_quantile`), and
    the sums are `math.fsum`'s: numpy's pairwise sums give a different last digit for some committed stds.
    """
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
    """Exact two-sided sign test (ties dropped), `scipy.stats.binomtest`: the probability, under P(win) = 1/2,
    of a split of the wins + losses non-tied pairs at least as uneven as this one; None without such pairs."""
    m = wins + losses
    if m == 0:
        return None
    return float(binomtest(wins, m, 0.5).pvalue)


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Paired:
    """Paired t-test of a - b (two-sided) with its t-interval, plus win/loss counts and the sign test.

    Differences, interval and mean in the values' units, t in standard errors, p in [0, 1].
    n < 2: mean difference only (interval, t and p are None). All differences equal (up to float
    rounding) and non-zero: t = +/-inf, p = 0; all zero: t and p are None (no evidence either way).

    Not `scipy.stats.ttest_rel`: its t (numpy's mean and std) differs in the last digit for about half the
    committed pairs, its p (t.sf) for most, and its confidence interval uses t.ppf (see `t_quantile`), so
    `t`, `p_t`, `lo` and `hi` in the committed reports' data/paired.csv would change.
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
#: `BOOTSTRAP_RESAMPLES` resamples from a fixed seed (`scipy.stats.bootstrap`).
BOOTSTRAP_EXACT_MAX_N = 6
BOOTSTRAP_RESAMPLES = 20_000


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95,
                       seed: int = 0) -> Optional[tuple[float, float]]:
    """Percentile bootstrap interval of the mean of `values` (resampling the values with replacement), in the
    values' units: the (1 - c)/2 and (1 + c)/2 quantiles (linear interpolation) of the resampled means; None for
    fewer than 2 values.

    Deterministic: all n^n equally likely resamples for n <= BOOTSTRAP_EXACT_MAX_N, else `scipy.stats.bootstrap`
    (method="percentile") over `BOOTSTRAP_RESAMPLES` resamples drawn by `numpy.random.default_rng(seed)`.
    With 3 seeds the resampled means take 10 distinct values and the interval is close to the values' range:
    it describes the seeds that were run and, unlike the t-interval, assumes nothing about their distribution,
    but it under-covers at such n. Both are reported.

    The enumeration is done here because `scipy.stats.bootstrap` has no exhaustive mode: it always draws
    `n_resamples` random resamples, so the committed reports (2 or 3 values per interval) would get random
    intervals instead of their exact `boot_lo`, `boot_hi`. Its percentile step (`scipy.stats.quantile`) also
    differs from `numpy.quantile` in the last digit for about a third of the committed intervals, so passing it
    the enumerated means (its `bootstrap_result` argument) would change them too.
    """

    xs = np.asarray([float(v) for v in values], dtype=np.float64)
    n = len(xs)
    if n < 2:
        return None
    if n > BOOTSTRAP_EXACT_MAX_N:
        res = bootstrap((xs,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=confidence,
                        method="percentile", rng=np.random.default_rng(seed))
        return float(res.confidence_interval.low), float(res.confidence_interval.high)
    idx = np.array(list(itertools.product(range(n), repeat=n)))
    means = xs[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(lo), float(hi)


def holm(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (each in [0, 1]) of a family of tests, in the order given.

    The family is the entries that are numbers (None and NaN are no test: they stay None). With the m p-values
    sorted, p_(1) <= ... <= p_(m), the adjusted value of p_(i) is min(1, max_{j <= i} (m - j + 1) p_(j)): a test is
    rejected at level alpha, with the family-wise error rate held at alpha, exactly when its adjusted value is
    <= alpha. Ties get equal adjusted values. Applied on top of the p-values computed above (`paired`, `sign_test`),
    which it leaves as they are; SciPy has no Holm correction (`scipy.stats.false_discovery_control` is
    Benjamini-Hochberg/Yekutieli, which controls the false discovery rate instead and is never above Holm).
    """
    tests = [i for i, p in enumerate(pvalues) if p is not None and not math.isnan(float(p))]
    m = len(tests)
    out: list[Optional[float]] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(tests, key=lambda i: float(pvalues[i]))):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out
