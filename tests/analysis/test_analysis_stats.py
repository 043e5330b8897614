"""Student-t quantiles and tail probabilities, t-intervals, the paired t-test, the sign test and the bootstrap,
against SciPy and closed forms."""

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.special
import scipy.stats

from analysis.stats import (
    BOOTSTRAP_EXACT_MAX_N,
    BOOTSTRAP_RESAMPLES,
    betainc,
    bootstrap_interval,
    paired,
    sign_test,
    summarize,
    t_quantile,
    t_sf2,
)

DFS = [1, 2, 3, 4, 5, 7, 10, 30, 100, 1000]


@pytest.mark.parametrize("df, q", [(1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (4, 2.776445105),
                                   (9, 2.262157163), (30, 2.042272456), (1000, 1.962339081)])
def test_t_quantile_matches_published_values(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-8)


@pytest.mark.parametrize("df", DFS)
def test_t_quantile_matches_scipy(df):
    for p in (0.6, 0.9, 0.95, 0.975, 0.995, 0.999):
        assert t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-11)
        assert t_quantile(1 - p, df) == pytest.approx(scipy.stats.t.ppf(1 - p, df), rel=1e-11)
    assert t_quantile(0.5, df) == 0.0
    with pytest.raises(ValueError):
        t_quantile(1.0, df)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 7.0, 40.0])
def test_t_tails_match_closed_forms(t):
    # df = 1 (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / pi; df = 2: 1 - t / sqrt(2 + t^2).
    assert t_sf2(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
    assert t_sf2(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
    assert t_sf2(-t, 2) == t_sf2(t, 2)


@pytest.mark.parametrize("df", DFS)
def test_t_tails_match_scipy(df):
    for t in (0.0, 0.1, 0.7, 1.5, 2.2, 3.0, 5.0, 12.0):
        assert t_sf2(t, df) == pytest.approx(2 * scipy.stats.t.sf(t, df), rel=1e-11)
        assert t_sf2(-t, df) == pytest.approx(2 * scipy.stats.t.sf(t, df), rel=1e-11)
    assert t_sf2(math.inf, df) == 0.0 and math.isnan(t_sf2(math.nan, df))


def test_betainc_matches_scipy_and_closed_forms():
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    assert betainc(1.0, 1.0, 0.37) == pytest.approx(0.37, abs=1e-12)  # uniform
    assert betainc(2.0, 1.0, 0.3) == pytest.approx(0.09, abs=1e-12)  # I_x(a, 1) = x^a
    for a, b in [(0.5, 0.5), (0.5, 5.0), (2.0, 3.0), (15.0, 0.5), (500.0, 0.5)]:
        for x in (0.01, 0.2, 0.5, 0.8, 0.99):
            assert betainc(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x), rel=1e-11, abs=1e-300)


def test_summarize_interval_width():
    s = summarize([1.0, 2.0, 3.0])
    assert s.mean == 2.0 and s.std == pytest.approx(1.0)
    half = 4.302652730 / math.sqrt(3)
    assert s.half_width == pytest.approx(half, abs=1e-8)
    assert (s.lo, s.hi) == pytest.approx((2 - half, 2 + half), abs=1e-8)
    one = summarize([0.5])
    assert one.mean == 0.5 and one.std is None and one.lo is None and one.half_width is None
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize("n, confidence", [(2, 0.95), (3, 0.95), (5, 0.9), (12, 0.99)])
def test_summarize_matches_scipy_t_interval(n, confidence):
    xs = np.random.default_rng(n).normal(0.3, 0.05, size=n)
    s = summarize(xs, confidence)
    assert s.mean == pytest.approx(np.mean(xs), rel=1e-14) and s.std == pytest.approx(np.std(xs, ddof=1), rel=1e-13)
    lo, hi = scipy.stats.t.interval(confidence, n - 1, loc=np.mean(xs), scale=scipy.stats.sem(xs))
    assert (s.lo, s.hi) == pytest.approx((lo, hi), rel=1e-11)


def test_paired_t_known_example():
    # d = [-1, -0.5, -1]: mean -5/6, sd 0.288675, t = -5 with 2 df, p = 1 - 5/sqrt(27).
    p = paired([1.0, 2.0, 3.5], [2.0, 2.5, 4.5])
    assert p.n == 3 and p.mean_diff == pytest.approx(-5 / 6)
    assert p.t == pytest.approx(-5.0)
    assert p.p_t == pytest.approx(1 - 5 / math.sqrt(27), abs=1e-10)
    half = 4.302652730 * math.sqrt(1 / 12) / math.sqrt(3)
    assert (p.lo, p.hi) == pytest.approx((-5 / 6 - half, -5 / 6 + half), abs=1e-8)
    assert (p.wins, p.losses) == (3, 0)
    assert p.p_sign == pytest.approx(0.25)


@pytest.mark.parametrize("n", [2, 3, 6, 20])
def test_paired_matches_scipy_ttest_rel(n):
    rng = np.random.default_rng(n)
    a, b = rng.normal(0.1, 0.02, size=n), rng.normal(0.11, 0.02, size=n)
    p, ref = paired(a, b), scipy.stats.ttest_rel(a, b)
    assert p.t == pytest.approx(ref.statistic, rel=1e-12) and p.p_t == pytest.approx(ref.pvalue, rel=1e-11)
    ci = ref.confidence_interval(0.95)
    assert (p.lo, p.hi) == pytest.approx((ci.low, ci.high), rel=1e-11)
    assert (p.wins, p.losses) == (int(np.sum(a < b)), int(np.sum(a > b)))


def test_paired_small_and_degenerate():
    one = paired([0.1], [0.3])
    assert one.n == 1 and one.mean_diff == pytest.approx(-0.2)
    assert one.lo is None and one.t is None and one.p_t is None
    zero = paired([0.2, 0.3], [0.2, 0.3])
    assert zero.mean_diff == 0.0 and zero.t is None and zero.p_t is None and zero.p_sign is None
    const = paired([0.1, 0.2], [0.3, 0.4])
    assert const.t == -math.inf and const.p_t == 0.0
    empty = paired([], [])
    assert empty.n == 0 and empty.mean_diff is None
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])


def test_sign_test_exact():
    assert sign_test(3, 0) == pytest.approx(0.25)
    assert sign_test(5, 1) == pytest.approx(2 * (1 + 6) / 64)
    assert sign_test(2, 2) == 1.0
    assert sign_test(0, 0) is None


@pytest.mark.parametrize("m", [1, 2, 3, 7, 10, 25, 60])
def test_sign_test_is_the_two_sided_binomial_tail(m):
    # Under p = 1/2 the two-sided p of k wins is 2 P(Bin(m, 1/2) <= min(k, m - k)), at most 1: exact in fractions.
    for wins in range(m + 1):
        k = min(wins, m - wins)
        exact = min(Fraction(1), 2 * Fraction(sum(math.comb(m, i) for i in range(k + 1)), 2 ** m))
        assert sign_test(wins, m - wins) == pytest.approx(float(exact), rel=1e-12)


def test_bootstrap_interval_enumerates_small_samples_exactly():
    # (0, 1): the 4 resamples have means 0, 0.5, 0.5, 1; linear quantiles at 2.5% and 97.5% of those
    assert bootstrap_interval([0.0, 1.0]) == pytest.approx((0.0375, 0.9625))
    # (0, 0, 3): of the 27 resamples 8 have mean 0, 12 mean 1, 6 mean 2, 1 mean 3; sorted, the 2.5% quantile lies
    # at position 0.65 (between two zeros) and the 97.5% one at 25.35, between the last 2 and the 3.
    assert bootstrap_interval([0.0, 0.0, 3.0]) == pytest.approx((0.0, 2.35))
    assert bootstrap_interval([0.0, 0.0, 3.0], confidence=0.5) == pytest.approx((0.0, 1.5))  # 6.5, 19.5
    assert bootstrap_interval([0.3]) is None and bootstrap_interval([]) is None
    three = [0.010, 0.018, 0.026]
    lo, hi = bootstrap_interval(three)
    t = summarize(three)
    assert 0.010 <= lo < 0.018 < hi <= 0.026 and t.lo < lo and hi < t.hi  # inside the range, narrower than t
    assert bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))


def test_bootstrap_interval_samples_larger_ones_from_a_fixed_seed():
    nine = list(np.random.default_rng(7).normal(0.5, 0.2, size=9))
    assert len(nine) > BOOTSTRAP_EXACT_MAX_N
    # The percentile interval of the means of BOOTSTRAP_RESAMPLES resamples drawn by default_rng(seed).
    for seed in (0, 1):
        idx = np.random.default_rng(seed).integers(0, len(nine), size=(BOOTSTRAP_RESAMPLES, len(nine)))
        expected = np.quantile(np.asarray(nine)[idx].mean(axis=1), [0.025, 0.975])
        assert bootstrap_interval(nine, seed=seed) == pytest.approx(tuple(expected), rel=1e-12)
    assert bootstrap_interval(nine, seed=0) != bootstrap_interval(nine, seed=1)
    eight = [0.1, 0.4, 0.2, 0.9, 0.5, 0.3, 0.7, 0.6]
    assert 0.1 < bootstrap_interval(eight)[0] < sum(eight) / 8 < bootstrap_interval(eight)[1] < 0.9
    assert bootstrap_interval([0.2] * 8) == pytest.approx((0.2, 0.2))
