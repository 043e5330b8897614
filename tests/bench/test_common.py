"""bench.common.median_interval (the order-statistic interval for a median, its coverage, its refusals),
interval_verdict (a target judged by the whole interval) and paired_target (a latency-ratio target from paired
rounds)."""

import math
import random

import pytest

from bench.common import interval_verdict, median_interval, paired_target, paired_target_line


def binomial_coverage(n: int, k: int) -> float:
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n, k", [(2, 1), (5, 1), (6, 1), (9, 2), (21, 6), (41, 14)])
def test_the_largest_k_whose_coverage_reaches_the_confidence(n, k):
    values = [float(v) for v in random.Random(n).sample(range(1000), n)]  # unsorted input
    got = median_interval(values)
    xs = sorted(values)
    assert got["k"] == k and got["low"] == xs[k - 1] and got["high"] == xs[n - k]
    assert got["coverage"] == pytest.approx(binomial_coverage(n, k))
    if binomial_coverage(n, 1) >= 0.95:  # k is the largest with coverage >= 0.95; one more falls below
        assert got["coverage"] >= 0.95 and binomial_coverage(n, k + 1) < 0.95
    else:  # too few values for 0.95: the range, with the coverage it has (n = 5: 1 - 2/32)
        assert k == 1


def test_the_coverage_is_that_of_draws_from_a_skewed_distribution():
    # exponential draws (median ln 2), 21 per trial: the interval holds the median in about 97.3% of trials
    rng = random.Random(0)
    trials, hits = 4000, 0
    for _ in range(trials):
        got = median_interval([rng.expovariate(1.0) for _ in range(21)])
        hits += got["low"] <= math.log(2) <= got["high"]
    nominal = binomial_coverage(21, 6)
    assert nominal == pytest.approx(0.9734, abs=1e-4)
    assert abs(hits / trials - nominal) < 0.012  # about 4.7 standard errors of a binomial proportion at 4000 trials


def test_too_few_values_or_a_bad_confidence():
    assert median_interval([1.0]) is None and median_interval([]) is None
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="confidence"):
            median_interval([1.0, 2.0], confidence=bad)


@pytest.mark.parametrize("low, high, at_least, verdict", [
    (1.0, 1.2, True, "met"), (0.7, 0.99, True, "missed"), (0.95, 1.05, True, "unresolved"),
    (1.0, 1.15, False, "met"), (1.16, 1.3, False, "missed"), (1.1, 1.2, False, "unresolved")])
def test_a_target_is_judged_by_the_whole_interval(low, high, at_least, verdict):
    target = 1.0 if at_least else 1.15
    assert interval_verdict({"low": low, "high": high, "coverage": 0.97, "k": 6}, target, at_least) == verdict
    assert interval_verdict(None, target, at_least) is None


def test_a_latency_ratio_target_from_paired_rounds():
    # round 3 is slow for both variants alike: paired, its ratio is as the others'; unpaired it would not be
    times = {"atlas": [1.10, 1.12, 3.30, 1.08, 1.11], "lora": [1.00, 1.00, 3.00, 1.00, 1.00]}
    got = paired_target(times, "atlas/lora", 1.15)
    assert got["per_round"] == pytest.approx([1.10, 1.12, 1.10, 1.08, 1.11])
    assert got["median_of_rounds"] == pytest.approx(1.10)
    # 5 rounds: the interval is their range, coverage 1 - 2/32
    assert got["interval"]["low"] == pytest.approx(1.08) and got["interval"]["high"] == pytest.approx(1.12)
    assert got["interval"]["coverage"] == pytest.approx(0.9375)
    assert got["by_rounds"] == "met"
    assert paired_target(times, "atlas/lora", 1.09)["by_rounds"] == "unresolved"
    assert paired_target(times, "atlas/lora", 1.05)["by_rounds"] == "missed"
    line = paired_target_line({"ratio": "atlas/lora", "limit": 1.15, **got})
    assert "1.10x" in line and "1.08-1.12x" in line and line.endswith("met")
    one_round = paired_target({"a": [1.0], "b": [1.0]}, "a/b", 1.0)
    assert one_round["interval"] is None and one_round["by_rounds"] is None
    assert paired_target_line({"ratio": "a/b", "limit": 1.0, **one_round}) is None
