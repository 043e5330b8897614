"""Sweep points with their spread over seeds, and the frontiers of coding performance against retained KL.

A sweep point is (method, backbone, benchmark, knob values without the seed); its seeds give a
mean and a 95% t-interval of pass@1 and of the retained KL.

A method's frontier is built from its training runs, not from its points pooled: each training run's
points (the run at scale 1 and its post-hoc scales, which share a `train_key`) form a curve, the run's
points that no other point of the same run dominates, in pass@1 order. Between two adjacent points of one
curve a model exists (the same run at an intermediate scale), so the curve is read linearly there; between
points of two different runs no model exists, so no line joins them. The method's frontier is the lower
envelope of its curves: at a pass@1 c, the least over its runs of the KL where the run's curve reaches c
(the curve's lowest KL below its least pass@1; the run does not count above its best pass@1). A point is on
the frontier when its KL is that envelope's value at its pass@1. A further training run can only lower the
envelope; pooling the runs' points into one Pareto set and joining neighbours of different runs would not
(a point of one run that lies above the straight line between two points of another run would raise the
value read between them).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import pandas as pd

from analysis import schema
from analysis.stats import summarize

GROUP = ["backbone", "benchmark"]
POINT = ["backbone", "benchmark", "method", "sweep_key"]


DOMAIN_ORDER = ("math", "commonsense")


def domains(df: pd.DataFrame, prefix: str = "retained") -> list[str]:
    """Retained domain names present in the table (near items: `retained`; far items: `retained_far`): math,
    commonsense, then any other in sorted order."""
    out = set()
    for col in df.columns:
        parts = col.split("/")
        if len(parts) == 3 and parts[0] == prefix and parts[2] == "kl_token_mean":
            out.add(parts[1])
    return sorted(out, key=lambda d: (DOMAIN_ORDER.index(d) if d in DOMAIN_ORDER else len(DOMAIN_ORDER), d))


def kl_column(domain: Optional[str]) -> str:
    """The KL column of one retained domain, or the mean over domains for None / 'mean'."""
    return schema.KL_MEAN_COL if domain in (None, "mean") else f"retained/{domain}/kl_token_mean"


#: The token-pooled retained KL (`pooled_kl`); computed by `analysis.analyze`, not carried by the records.
POOLED_KL_COL = "retained_kl_pooled"


#: KL columns of records with far items (`analysis.analyze` computes them; NaN for records without far items): the
#: near and the far items' means over domains, and the far and all (near + far) items pooled over tokens.
NEAR_KL_COL, FAR_KL_COL = "retained_kl_near", "retained_kl_far"
FAR_POOLED_KL_COL, ALL_POOLED_KL_COL = "retained_kl_far_pooled", "retained_kl_all_pooled"


def domain_mean_kl(df: pd.DataFrame, prefix: str) -> pd.Series:
    """Per row, the mean over the `prefix` set's domains (`retained` near, `retained_far` far) of the token-mean KL,
    nats per token; NaN for a row missing any of them (or where the table has no such domain)."""
    cols = [f"{prefix}/{d}/kl_token_mean" for d in domains(df, prefix)]
    if not cols:
        return pd.Series(float("nan"), index=df.index, dtype=float)
    return df[cols].astype(float).mean(axis=1, skipna=False)


def pooled_kl(df: pd.DataFrame, prefixes: Sequence[str] = ("retained",)) -> pd.Series:
    """Per row, the retained KL pooled over tokens, in nats per token: the sum over retained domains of
    kl_token_mean * n_tokens divided by the domains' total n_tokens, i.e. the mean over every scored token of every
    domain (the headline `retained_kl_mean` instead averages the domains' token means, each domain weighing the
    same); over the near items (`retained`) by default, or every set in `prefixes` (`retained_far`: far items). NaN for
    a row missing any domain's kl_token_mean or n_tokens, or with no tokens."""
    doms = [(p, d) for p in prefixes for d in domains(df, p)]
    out = []
    for _, r in df.iterrows():
        kls = [r.get(f"{p}/{d}/kl_token_mean") for p, d in doms]
        ns = [r.get(f"{p}/{d}/n_tokens") for p, d in doms]
        vals = [(float(k), float(n)) for k, n in zip(kls, ns) if k is not None and n is not None
                and not pd.isna(k) and not pd.isna(n)]
        total = math.fsum(n for _, n in vals)
        ok = doms and len(vals) == len(doms) and total > 0
        out.append(math.fsum(k * n for k, n in vals) / total if ok else float("nan"))
    return pd.Series(out, index=df.index, dtype=float)


def domain_label(domain: Optional[str]) -> str:
    return "mean over retained domains" if domain in (None, "mean") else domain


def per_seed(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    """One row per (sweep point, seed): the mean of `cols` over that seed's runs (normally one run;
    several only when runs differ in config outside the knobs), with `n_runs`."""
    cols = [c for c in cols if c in df.columns]
    keep = df.dropna(subset=cols) if cols else df
    if keep.empty:
        return pd.DataFrame(columns=POINT + ["train_key", schema.SCALE_COL, "seed", "n_runs", *cols])
    agg = {c: "mean" for c in cols}
    agg.update({"train_key": "first", schema.SCALE_COL: "first", "run_id": "count"})
    out = keep.groupby(POINT + ["seed"], sort=True, dropna=False).agg(agg).reset_index()
    return out.rename(columns={"run_id": "n_runs"})


def frontier_mask(x: Sequence[float], y: Sequence[float]) -> list[bool]:
    """True for the points not dominated when x is maximised and y minimised.

    Exact duplicates keep only the first; a point equal in x and higher in y (or equal in y and lower
    in x) is dominated.
    """
    order = sorted(range(len(x)), key=lambda i: (-x[i], y[i], i))
    best = float("inf")
    mask = [False] * len(x)
    for i in order:
        if y[i] < best:
            mask[i] = True
            best = y[i]
    return mask


TOL = 1e-9   # pass@1 within this of a level counts as meeting it (float noise in level arithmetic)


def run_fronts(x: Sequence[float], y: Sequence[float], runs: Sequence) -> list[list[tuple[float, float]]]:
    """Each training run's curve: per distinct value of `runs` (the points' `train_key`), the (x, y) of that run's
    points that no other point of the same run dominates (`frontier_mask`), x (pass@1) ascending."""
    fronts = []
    for run in dict.fromkeys(runs):
        idx = [i for i, r in enumerate(runs) if r == run]
        xs, ys = [x[i] for i in idx], [y[i] for i in idx]
        mask = frontier_mask(xs, ys)
        fronts.append(sorted((xs[j], ys[j]) for j in range(len(xs)) if mask[j]))
    return fronts


def front_value(front: Sequence[tuple[float, float]], c: float) -> Optional[float]:
    """The y (KL) where one run's curve (x ascending, y ascending) reaches x = c: linear between its two points
    around c, its lowest y below its least x, None above its best x (no extrapolation)."""
    if not front or front[-1][0] < c - TOL:
        return None
    if c <= front[0][0] + TOL:
        return front[0][1]
    for (x0, y0), (x1, y1) in zip(front, front[1:]):
        if x0 < c <= x1 + TOL:
            if x1 <= c:
                return y1
            return y0 + (c - x0) / (x1 - x0) * (y1 - y0)
    return front[-1][1]


def envelope_value(fronts: Sequence[Sequence[tuple[float, float]]], c: float) -> Optional[float]:
    """The frontier's KL at pass@1 = c: the least `front_value` over the runs' curves; None when no run reaches c."""
    values = [v for v in (front_value(f, c) for f in fronts) if v is not None]
    return min(values) if values else None


def front_bracket(front: Sequence[tuple[float, float]], c: float) -> Optional[tuple[float, float]]:
    """The pass@1 (x) of the two adjacent points of one run's curve that `front_value` reads linearly between at
    x = c; None where it reads a measured point (c at a point, or below the curve's least x) or the run does not
    reach c."""
    if not front or front[-1][0] < c - TOL or c <= front[0][0] + TOL:
        return None
    for (x0, _), (x1, _) in zip(front, front[1:]):
        if x0 < c <= x1 + TOL:
            return None if x1 <= c else (x0, x1)
    return None


def envelope_gap(fronts: Sequence[Sequence[tuple[float, float]]], c: float) -> Optional[float]:
    """The pass@1 gap (share of problems) between the two measured points the frontier's KL at pass@1 = c is read
    between: that of the run whose curve gives `envelope_value` (of runs giving it, one read at a measured point
    first, then the narrowest gap); None where the value is a measured point's or no run reaches c."""
    value = envelope_value(fronts, c)
    if value is None:
        return None
    gaps = []
    for front in fronts:
        v = front_value(front, c)
        if v is not None and v <= value + TOL:
            bracket = front_bracket(front, c)
            if bracket is None:
                return None
            gaps.append(bracket[1] - bracket[0])
    return min(gaps)


def envelope_line(fronts: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The frontier as a polyline (x, y), x ascending, exact: the envelope evaluated at every point of the curves,
    at every crossing of two curves' pieces and on both sides of every curve's end (where the envelope steps up
    to the next run's curve); between these x values it is linear."""
    fronts = [list(f) for f in fronts if f]
    if not fronts:
        return []
    lo = min(f[0][0] for f in fronts)
    breaks = {x for f in fronts for x, _ in f}

    def pieces(front):  # (x0, y0, x1, y1): the flat piece below the curve's least x, then its segments
        out = [(lo, front[0][1], front[0][0], front[0][1])] if front[0][0] > lo else []
        return out + [(a[0], a[1], b[0], b[1]) for a, b in zip(front, front[1:])]

    all_pieces = [pieces(f) for f in fronts]
    for i in range(len(fronts)):
        for j in range(i + 1, len(fronts)):
            for (a0, b0, a1, b1) in all_pieces[i]:
                for (c0, d0, c1, d1) in all_pieces[j]:
                    left, right = max(a0, c0), min(a1, c1)
                    if right - left <= TOL:
                        continue
                    s1, s2 = (b1 - b0) / (a1 - a0), (d1 - d0) / (c1 - c0)
                    if s1 == s2:
                        continue
                    xc = (d0 - s2 * c0 - b0 + s1 * a0) / (s1 - s2)
                    if left + TOL < xc < right - TOL:
                        breaks.add(xc)
    line = []
    for b in sorted(breaks):
        here = envelope_value(fronts, b)
        line.append((b, here))
        after = [front_value(f, b) for f in fronts if f[-1][0] > b + TOL]
        if after and min(after) > here + TOL:  # a curve ends here; beyond it the next one's values apply
            line.append((b, min(after)))
    return line


def sweep_points(df: pd.DataFrame, y_col: str, x_col: str = schema.TARGET_COL, confidence: float = 0.95) -> pd.DataFrame:
    """One row per sweep point with the seeds' mean, std and t-interval of x and y, and `on_frontier`
    (the frontier of the point's method on its backbone and benchmark, over the means).

    Columns: backbone, benchmark, method, sweep_key, train_key, scale, the knob columns, n_seeds,
    seeds, x_mean, x_std, x_lo, x_hi, y_mean, y_std, y_lo, y_hi, on_frontier. A point of one seed has
    no std or interval (NaN).
    """
    knob_cols = [c for c in df.columns if c.startswith(schema.KNOB_PREFIX)]
    seeds = per_seed(df, [x_col, y_col])
    rows = []
    for key, g in seeds.groupby(POINT, sort=True):
        sx = summarize(g[x_col], confidence)
        sy = summarize(g[y_col], confidence)
        row = dict(zip(POINT, key))
        row["train_key"] = g["train_key"].iloc[0]
        row[schema.SCALE_COL] = g[schema.SCALE_COL].iloc[0]
        rows.append(row | {
            "n_seeds": sx.n, "seeds": ",".join(str(int(s)) for s in sorted(g["seed"])),
            "x_mean": sx.mean, "x_std": sx.std, "x_lo": sx.lo, "x_hi": sx.hi,
            "y_mean": sy.mean, "y_std": sy.std, "y_lo": sy.lo, "y_hi": sy.hi,
        })
    cols = POINT + ["train_key", schema.SCALE_COL, *knob_cols, "n_seeds", "seeds", "x_mean", "x_std", "x_lo", "x_hi",
                    "y_mean", "y_std", "y_lo", "y_hi", "on_frontier"]
    if not rows:
        return pd.DataFrame(columns=cols)
    points = pd.DataFrame(rows)
    knobs = df.drop_duplicates("sweep_key").set_index("sweep_key")[knob_cols] if knob_cols else None
    if knobs is not None:
        points = points.join(knobs, on="sweep_key")
    points["on_frontier"] = False
    for _, g in points.groupby(["backbone", "benchmark", "method"], sort=True):
        xs, ys = list(g["x_mean"]), list(g["y_mean"])
        fronts = run_fronts(xs, ys, list(g["train_key"]))
        own = {(x, y) for f in fronts for x, y in f}
        points.loc[g.index, "on_frontier"] = [(x, y) in own and y <= envelope_value(fronts, x) + TOL
                                              for x, y in zip(xs, ys)]
    points = points[cols]
    for c in ("x_std", "x_lo", "x_hi", "y_std", "y_lo", "y_hi"):
        points[c] = points[c].astype(float)
    return points.reset_index(drop=True)


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """The frontier rows of `sweep_points` output, ordered by x (pass@1) ascending within each method."""
    front = points[points["on_frontier"].astype(bool)]
    return front.sort_values(["backbone", "benchmark", "method", "x_mean", "y_mean"], kind="mergesort").reset_index(drop=True)
