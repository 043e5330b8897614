"""A paired bootstrap over code problems and retained items of the matched-KL difference, ATLAS minus each method.

The paired table (`analysis.matched.compare`) gives the spread over seeds; this gives the spread from the evaluation
sets. Every run of a backbone and benchmark is scored on the same code problems and the same retained items, so one
resample serves them all: the problems drawn with replacement, and each retained domain's items drawn with replacement,
independently of the problems and of the other domains. Per resample, each run's pass@1 is the share of the drawn
problems it passes (greedy; a problem drawn twice counts twice) and its KL the mean over retained domains of the drawn
items' KL over their tokens (sum of `kl_sum` over sum of `n_tokens`, nats per token; with far items, the mean of the
near and far domain means, as the headline is), the recorded `retained_kl_mean` on the original sets. From these, as the matched tables do: a sweep point's seed value is the mean of its runs, a
`gain:` level's requirement is recomputed from the resampled base and reference pass@1 (`analysis.matched.requirement`),
and each seed's matched KL is read along its training runs' fronts (`analysis.matched.read_seed`). The statistic is
the mean over the seeds where both reach the level of KL(ATLAS) - KL(method); the seeds are held fixed.

Reported per level and method: the statistic on the original sets (the paired table's mean difference), the
percentile interval of the resampled statistics, and a two-sided bootstrap p: twice the smaller share of resamples at
or below 0 and at or above 0 (capped at 1), Holm-corrected within each family like the paired table's
(`analysis.matched.holm_by_family`).
A resample where no seed pair reaches the level has no statistic; `n_defined` counts those that have one, and the
interval and p are over them (none are given when no pair reaches the level on the original sets).

Only records carrying `metrics.target.per_problem` and each retained domain's `per_item` can be resampled
(`analysis.schema.per_item_of`); a backbone whose runs lack them, or disagree on the problems or the item counts, is
listed as unavailable with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import pandas as pd

from analysis import matched as MT
from analysis import methods as M
from analysis import pareto, schema
from analysis.pareto import run_fronts

#: Resamples drawn by default, and the least allowed (the 2.5% and 97.5% percentiles of fewer rest on 1 or 2 values).
DEFAULT_RESAMPLES = 1000
MIN_RESAMPLES = 100
DEFAULT_SEED = 0
#: How far the per-problem and per-item arrays may be from the record's own pass@1 and KL (relative, for the KL).
PASS_TOL = 1e-9
KL_RTOL = 1e-6

BOOT_COLS = ["backbone", "benchmark", "level", "level_spec", "reference", "method", "n_problems", "n_items",
             "n_pairs", "mean_diff", "n_resamples", "n_defined", "boot_lo", "boot_hi", "p_boot", "p_boot_holm"]


@dataclass(frozen=True)
class EvalSets:
    """The per-problem and per-item results of a backbone's runs, one row per run (the order of the runs given):
    `passed` (runs x problems, 1 = passed), and per retained domain `kl_sum` (runs x items, nats summed over the
    item's response tokens) and `n_tokens` (runs x items)."""

    task_ids: tuple[str, ...]
    passed: np.ndarray
    domains: tuple[str, ...]
    kl_sum: tuple[np.ndarray, ...]
    n_tokens: tuple[np.ndarray, ...]
    # Each domain's weight in `retained_kl_mean` (`headline_weights`); far domains are named `<domain> (far)`.
    weights: tuple[float, ...] = ()

    @property
    def n_items(self) -> dict[str, int]:
        """Items per retained domain."""
        return {d: int(k.shape[1]) for d, k in zip(self.domains, self.kl_sum)}


def _numbers(values, what: str, run_id: str, counts: bool = False) -> np.ndarray:
    """`values` as floats, or _Unusable: not a list of numbers (bools allowed only as 0/1 outside `counts`), not
    finite, or (`counts`) not whole numbers >= 0."""
    ok = isinstance(values, list) and all(isinstance(v, (int, float)) for v in values)
    if not ok or (counts and any(isinstance(v, bool) for v in values)):
        raise _Unusable(f"run {run_id}: {what} is not a list of numbers")
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or (counts and not np.all((arr >= 0) & (arr == np.round(arr)))):
        raise _Unusable(f"run {run_id}: {what} holds a value that is not " + ("a count" if counts else "finite"))
    return arr


class _Unusable(Exception):
    """The per-item results of a backbone's runs cannot be resampled; the message says why."""


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-300


def headline_weights(n_near: int, n_far: int) -> list[float]:
    """Each item set's weight in `retained_kl_mean` (`experiments.evaluation.evaluate.headline_kl`): near domains
    1 / n_near, or, with far domains, 1 / (2 n_near) each and far ones 1 / (2 n_far)."""
    if not n_far:
        return [1.0 / n_near] * n_near
    return [0.5 / n_near] * n_near + [0.5 / n_far] * n_far


def eval_sets(rows: pd.DataFrame) -> Union[EvalSets, str]:
    """The `EvalSets` of the runs `rows` (one backbone and benchmark), or the reason they cannot be resampled: runs
    without per-problem or per-item results, malformed arrays, problems or item counts that differ between runs, or
    arrays that do not give the record's own pass@1 and KL (mean of `passed` within `PASS_TOL`, each domain's
    sum(kl_sum)/sum(n_tokens) and their `headline_weights` mean within `KL_RTOL` of `kl_token_mean` and
    `retained_kl_mean`). Far items (`retained_far`) are item sets of their own, `<domain> (far)`."""
    near, far = pareto.domains(rows), pareto.domains(rows, "retained_far")
    sets = [("items", "retained", d, d) for d in near] + [("far_items", "retained_far", d, f"{d} (far)") for d in far]
    doms = tuple(label for *_, label in sets)
    weights = headline_weights(len(near), len(far))
    col = rows[schema.PER_ITEM_COL] if schema.PER_ITEM_COL in rows.columns else pd.Series([None] * len(rows))
    missing = sum(1 for v in col if not isinstance(v, str))
    if missing:
        return (f"{missing} of {len(rows)} runs carry no per-problem or per-item results (records made before "
                "metrics.target.per_problem and the retained domains' per_item)")
    try:
        passed, kls, toks = [], [[] for _ in doms], [[] for _ in doms]
        task_ids: Optional[list] = None
        for (_, r), text in zip(rows.iterrows(), col):
            run, data = r["run_id"], json.loads(text)
            problems = data.get("problems")
            if not isinstance(problems, dict):
                raise _Unusable(f"run {run}: no metrics.target.per_problem")
            ids, p = problems.get("task_ids"), _numbers(problems.get("passed"), "per_problem.passed", run)
            if not isinstance(ids, list) or len(ids) != len(p) or not len(p):
                raise _Unusable(f"run {run}: per_problem has {len(ids) if isinstance(ids, list) else 'no'} task_ids "
                                f"for {len(p)} passed values")
            if not np.all((p == 0) | (p == 1)):
                raise _Unusable(f"run {run}: per_problem.passed holds a value other than 0 and 1")
            if task_ids is None:
                task_ids = ids
            elif ids != task_ids:
                raise _Unusable(f"runs were scored on different code problems (run {run} differs from run "
                                f"{rows['run_id'].iloc[0]})")
            if abs(float(p.mean()) - float(r[schema.TARGET_COL])) > PASS_TOL:
                raise _Unusable(f"run {run}: per_problem gives pass@1 {p.mean():.6g}, the record {r[schema.TARGET_COL]:.6g}")
            passed.append(p)
            means = []
            for j, (part, prefix, name, dom) in enumerate(sets):
                entry = (data.get(part) or {}).get(name)
                if not isinstance(entry, dict):
                    raise _Unusable(f"run {run}: no per_item for retained domain {dom}")
                k = _numbers(entry.get("kl_sum"), f"{dom}.per_item.kl_sum", run)
                n = _numbers(entry.get("n_tokens"), f"{dom}.per_item.n_tokens", run, counts=True)
                if len(k) != len(n) or not len(k) or n.sum() <= 0:
                    raise _Unusable(f"run {run}: {dom}.per_item has {len(k)} kl_sum and {len(n)} n_tokens "
                                    f"({int(n.sum())} tokens)")
                if kls[j] and len(k) != len(kls[j][0]):
                    raise _Unusable(f"runs were scored on different {dom} items ({len(k)} in run {run}, "
                                    f"{len(kls[j][0])} in run {rows['run_id'].iloc[0]})")
                recorded = float(r[f"{prefix}/{name}/kl_token_mean"])
                if not _close(k.sum() / n.sum(), recorded, KL_RTOL):
                    raise _Unusable(f"run {run}: {dom}.per_item gives KL {k.sum() / n.sum():.9g}, the record {recorded:.9g}")
                kls[j].append(k)
                toks[j].append(n)
                means.append(k.sum() / n.sum())
            headline = math.fsum(w * m for w, m in zip(weights, means))
            if not _close(headline, float(r[schema.KL_MEAN_COL]), KL_RTOL):
                raise _Unusable(f"run {run}: the domains' per_item KL average {headline:.9g}, "
                                f"retained_kl_mean is {float(r[schema.KL_MEAN_COL]):.9g}")
    except _Unusable as exc:
        return str(exc)
    return EvalSets(tuple(task_ids), np.vstack(passed), doms, tuple(np.vstack(k) for k in kls),
                    tuple(np.vstack(n) for n in toks), tuple(weights))


def draw_counts(n: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, n): how many times each of `n` units is drawn in each resample of `n` draws with replacement."""
    idx = rng.integers(0, n, size=(n_resamples, n)) + n * np.arange(n_resamples)[:, None]
    return np.bincount(idx.ravel(), minlength=n_resamples * n).reshape(n_resamples, n).astype(np.float64)


@dataclass(frozen=True)
class Resamples:
    """Draw counts (resamples x units) of the code problems and of each retained domain's items."""

    problems: np.ndarray
    items: tuple[np.ndarray, ...]

    @property
    def n(self) -> int:
        return self.problems.shape[0]

    @staticmethod
    def draw(sets: EvalSets, n_resamples: int, rng: np.random.Generator) -> "Resamples":
        """`n_resamples` resamples: problems first, then each domain's items in `sets.domains` order."""
        problems = draw_counts(len(sets.task_ids), n_resamples, rng)
        return Resamples(problems, tuple(draw_counts(k.shape[1], n_resamples, rng) for k in sets.kl_sum))

    @staticmethod
    def identity(sets: EvalSets) -> "Resamples":
        """The original sets: every problem and item once."""
        return Resamples(np.ones((1, len(sets.task_ids))), tuple(np.ones((1, k.shape[1])) for k in sets.kl_sum))


def _weighted_sums(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(resamples, runs): counts @ values.T, computed once per distinct row of `values`, so runs with equal arrays get
    bit-equal sums (a matrix product may round a column differently by its position)."""
    distinct, which = np.unique(values, axis=0, return_inverse=True)
    return (counts @ distinct.T)[:, np.ravel(which)]


def resampled_pass(passed: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(resamples, runs) pass@1: the share of each resample's drawn problems each run passes."""
    return _weighted_sums(counts, passed) / counts.shape[1]


def resampled_kl(sets: EvalSets, res: Resamples) -> np.ndarray:
    """(resamples, runs) retained KL in nats per token: the `headline_weights` mean over item sets (each retained
    domain, near and far) of the drawn items' summed KL over their summed tokens."""
    per_domain = [_weighted_sums(c, k) / _weighted_sums(c, n) for c, k, n in zip(res.items, sets.kl_sum, sets.n_tokens)]
    weights = sets.weights or headline_weights(len(per_domain), 0)
    return sum(w * d for w, d in zip(weights, per_domain))


@dataclass
class _Layout:
    """The cells (sweep point, seed) of a backbone's runs and how the matched reading walks them."""

    cell_runs: list[np.ndarray]         # per cell (sweep point, seed): the indices of its runs
    seeds: dict                         # (method, seed) -> (cell indices in sweep-key order, keys, train keys)
    base_runs: np.ndarray               # indices of the base model's runs
    reference_cells: np.ndarray         # cells of the reference point (one per seed)


def _layout(rows: pd.DataFrame, methods: Sequence[str], ref_key: Optional[str]) -> _Layout:
    cells = list(dict.fromkeys(zip(rows["method"], rows["sweep_key"], rows["seed"].astype(int))))
    index = {c: i for i, c in enumerate(cells)}
    which = np.asarray([index[c] for c in zip(rows["method"], rows["sweep_key"], rows["seed"].astype(int))])
    cell_runs = [np.flatnonzero(which == i) for i in range(len(cells))]
    train = dict(zip(rows["sweep_key"], rows["train_key"]))
    seeds = {}
    for method in methods:
        for seed in sorted({s for m, _, s in cells if m == method}):
            own = sorted((k, index[(m, k, s)]) for m, k, s in cells if m == method and s == seed)
            seeds[(method, seed)] = (np.array([i for _, i in own]), [k for k, _ in own], [train[k] for k, _ in own])
    base = np.flatnonzero((rows["method"] == M.BASE).to_numpy())
    ref = np.array([index[c] for c in cells if c[1] == ref_key], dtype=int)
    return _Layout(cell_runs, seeds, base, ref)


def _statistics(lay: _Layout, pass_runs: np.ndarray, kl_runs: np.ndarray, levels: Sequence[MT.Level],
                interpolate: bool, reference: str, others: Sequence[str]) -> "GroupStats":
    """`GroupStats` from per-run pass@1 and KL, (resamples, runs) each: cell means, requirements, matched readings."""
    n = pass_runs.shape[0]
    xs_all = np.stack([pass_runs[:, idx].mean(axis=1) for idx in lay.cell_runs], axis=1)
    ys_all = np.stack([kl_runs[:, idx].mean(axis=1) for idx in lay.cell_runs], axis=1)
    # The gain range as `analysis.matched.gain_range` takes it: the base runs' mean, the reference point's seeds' mean.
    lo = pass_runs[:, lay.base_runs].mean(axis=1) if len(lay.base_runs) else np.zeros(n)
    hi = xs_all[:, lay.reference_cells].mean(axis=1) if len(lay.reference_cells) else np.full(n, np.nan)
    req = np.array([[MT.requirement(lv, float(lo[b]), max(float(lo[b]), float(hi[b]))) for lv in levels]
                    for b in range(n)]).reshape(n, len(levels))
    stat = np.full((n, len(levels), len(others)), np.nan)
    pairs = np.zeros((n, len(levels), len(others)), dtype=int)
    for b in range(n):
        kl: list[dict] = [{} for _ in levels]  # per level: method -> seed -> matched KL of the seeds reaching it
        for (method, seed), (idx, keys, train_keys) in lay.seeds.items():
            xs, ys = xs_all[b, idx].tolist(), ys_all[b, idx].tolist()
            fronts = run_fronts(xs, ys, train_keys) if interpolate else None
            for j, c in enumerate(req[b]):
                r = MT.read_seed(xs, ys, keys, train_keys, float(c), interpolate, fronts)
                if r.reached:
                    kl[j].setdefault(method, {})[seed] = r.kl
        for j in range(len(levels)):
            ref = kl[j].get(reference, {})
            for o, method in enumerate(others):
                diffs = [ref[s] - v for s, v in kl[j].get(method, {}).items() if s in ref]
                if diffs:
                    stat[b, j, o] = math.fsum(diffs) / len(diffs)
                    pairs[b, j, o] = len(diffs)
    return GroupStats(list(others), stat, pairs, req)


@dataclass(frozen=True)
class GroupStats:
    """The statistic on each resample of one backbone's runs: `others` (the methods compared with the reference),
    `stat` (resamples, levels, others): the mean over seed pairs reaching the level of KL(reference) - KL(method) in
    nats per token, NaN without a pair; `pairs`: their number; `requirement` (resamples, levels): each level's pass@1
    requirement on the resample."""

    others: list[str]
    stat: np.ndarray
    pairs: np.ndarray
    requirement: np.ndarray


def percentile_interval(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The (1 - c)/2 and (1 + c)/2 quantiles (linear interpolation) of the finite `samples`; NaNs without any."""
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    if not len(s):
        return float("nan"), float("nan")
    lo, hi = np.quantile(s, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(lo), float(hi)


def bootstrap_p(samples: np.ndarray) -> float:
    """Two-sided bootstrap p of "the statistic is 0": twice the smaller share of the finite `samples` at or below 0
    and at or above 0, capped at 1 (NaN without any). All samples 0: 1. Its resolution is 2 / len(samples)."""
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    if not len(s):
        return float("nan")
    return float(min(1.0, 2.0 * min(np.mean(s <= 0.0), np.mean(s >= 0.0))))


@dataclass
class ItemBootstrap:
    """The bootstrap's table (`BOOT_COLS`, one row per backbone, level and method compared), the (backbone,
    benchmark, reason) of every group it could not resample, and its settings."""

    table: pd.DataFrame
    unavailable: list[tuple[str, str, str]] = field(default_factory=list)
    n_resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED


def check_resamples(n_resamples) -> None:
    """ValueError `resamples=<n> is not allowed: ...` (the config errors' wording) unless `n_resamples` is a whole
    number >= MIN_RESAMPLES."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < MIN_RESAMPLES:
        raise ValueError(f"resamples={n_resamples!r} is not allowed: a whole number of bootstrap resamples >= "
                         f"{MIN_RESAMPLES}")


def group_statistics(g: pd.DataFrame, sets: EvalSets, res: Resamples, levels: Sequence[MT.Level],
                     interpolate: bool = True, gain_reference: "str | MT.Reference" = MT.DEFAULT_REFERENCE,
                     reference: str = M.REFERENCE) -> GroupStats:
    """The statistic on every resample of `res` for the runs `g` of one backbone and benchmark (`sets`: their
    `eval_sets`, same order), `reference` against every other trained method."""
    g = g.reset_index(drop=True)
    trained = [m for m in M.ordered(g["method"]) if m != M.BASE]
    gains = any(lv.kind == "gain" for lv in levels)
    bb, bench = g["backbone"].iloc[0], g["benchmark"].iloc[0]
    lay = _layout(g, trained, MT.reference_point(g, bb, bench, gain_reference) if gains else None)
    return _statistics(lay, resampled_pass(sets.passed, res.problems), resampled_kl(sets, res), levels,
                       interpolate, reference, [m for m in trained if m != reference])


def item_bootstrap(runs: pd.DataFrame, levels: Sequence[MT.Level], interpolate: bool = True,
                   gain_reference: "str | MT.Reference" = MT.DEFAULT_REFERENCE, confidence: float = 0.95,
                   n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                   reference: str = M.REFERENCE) -> ItemBootstrap:
    """The paired problem-and-item bootstrap (module docstring) of `reference` (ATLAS) against every other trained
    method, per backbone, benchmark and level, over `n_resamples` resamples drawn by `numpy.random.default_rng(seed)`
    (one stream, backbones in sorted order). `gain_reference`: the sweep point `gain:` levels are shares of. KL
    differences in nats per token, p in [0, 1]."""
    check_resamples(n_resamples)
    rng = np.random.default_rng(seed)
    rows_out, unavailable = [], []
    groups = sorted({(b, c) for b, c in zip(runs["backbone"], runs["benchmark"])}) if len(runs) else []
    for bb, bench in groups:
        g = runs[(runs["backbone"] == bb) & (runs["benchmark"] == bench)].reset_index(drop=True)
        trained = [m for m in M.ordered(g["method"]) if m != M.BASE]
        if reference not in trained or len(trained) < 2:
            continue  # nothing to compare, as in the paired table
        sets = eval_sets(g)
        if isinstance(sets, str):
            unavailable.append((bb, bench, sets))
            continue
        observed = group_statistics(g, sets, Resamples.identity(sets), levels, interpolate, gain_reference, reference)
        others, obs, obs_pairs = observed.others, observed.stat, observed.pairs
        boot = group_statistics(g, sets, Resamples.draw(sets, n_resamples, rng), levels, interpolate, gain_reference,
                                reference).stat
        for j, lv in enumerate(levels):
            for o, method in enumerate(others):
                s = boot[:, j, o]
                # No pair on the original sets: no statistic to put an interval around (and no test in the family).
                lo, hi = percentile_interval(s, confidence) if obs_pairs[0, j, o] else (float("nan"), float("nan"))
                rows_out.append({"backbone": bb, "benchmark": bench, "level": lv.label, "level_spec": lv.spec,
                                 "reference": reference, "method": method, "n_problems": len(sets.task_ids),
                                 "n_items": sum(sets.n_items.values()), "n_pairs": int(obs_pairs[0, j, o]),
                                 "mean_diff": obs[0, j, o], "n_resamples": n_resamples,
                                 "n_defined": int(np.isfinite(s).sum()), "boot_lo": lo, "boot_hi": hi,
                                 "p_boot": bootstrap_p(s) if obs_pairs[0, j, o] else float("nan")})
    out = pd.DataFrame(rows_out, columns=BOOT_COLS)
    for c in ("mean_diff", "boot_lo", "boot_hi", "p_boot"):
        out[c] = out[c].astype(float)
    out["p_boot_holm"] = MT.holm_by_family(out, "p_boot")
    return ItemBootstrap(out, unavailable, n_resamples, seed)
