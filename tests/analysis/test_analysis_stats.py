"""Student-t quantiles and tail probabilities, t-intervals, the paired t-test and the sign test."""

import math

import pytest

from analysis.stats import betainc, bootstrap_interval, paired, sign_test, summarize, t_quantile, t_sf2


@pytest.mark.parametrize("df, q", [(1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (4, 2.776445105),
                                   (9, 2.262157163), (30, 2.042272456), (1000, 1.962339081)])
def test_t_quantile_matches_published_values(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-8)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 7.0, 40.0])
def test_t_tails_match_closed_forms(t):
    # df = 1 (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / pi; df = 2: 1 - t / sqrt(2 + t^2).
    assert t_sf2(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
    assert t_sf2(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
    assert t_sf2(-t, 2) == t_sf2(t, 2)


def test_betainc_edges_and_symmetry():
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    assert betainc(2.0, 3.0, 0.3) == pytest.approx(1 - betainc(3.0, 2.0, 0.7), abs=1e-12)
    # I_x(1, 1) = x (uniform)
    assert betainc(1.0, 1.0, 0.37) == pytest.approx(0.37, abs=1e-12)


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


def test_bootstrap_interval_enumerates_small_samples_and_is_deterministic():
    # (0, 1): the 4 resamples have means 0, 0.5, 0.5, 1; linear quantiles at 2.5% and 97.5% of those
    assert bootstrap_interval([0.0, 1.0]) == pytest.approx((0.0375, 0.9625))
    assert bootstrap_interval([0.3]) is None and bootstrap_interval([]) is None
    three = [0.010, 0.018, 0.026]
    lo, hi = bootstrap_interval(three)
    t = summarize(three)
    assert 0.010 <= lo < 0.018 < hi <= 0.026 and t.lo < lo and hi < t.hi  # inside the range, narrower than t
    eight = [0.1, 0.4, 0.2, 0.9, 0.5, 0.3, 0.7, 0.6]  # sampled, from a fixed seed
    assert bootstrap_interval(eight) == bootstrap_interval(eight)
    assert 0.1 < bootstrap_interval(eight)[0] < sum(eight) / 8 < bootstrap_interval(eight)[1] < 0.9
    assert bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
