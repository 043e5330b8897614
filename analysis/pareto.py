"""Sweep points with their spread over seeds, and Pareto frontiers of coding performance against retained KL.

A sweep point is (method, backbone, benchmark, knob values without the seed); its seeds give a
mean and a 95% t-interval of pass@1 and of the retained KL. A point is on its method's frontier
when no other point of the method has pass@1 at least as high and KL at least as low with one
of them strictly better (frontier over the sweep-point means).
"""

from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from analysis import schema
from analysis.stats import summarize

GROUP = ["backbone", "benchmark"]
POINT = ["backbone", "benchmark", "method", "sweep_key"]


DOMAIN_ORDER = ("math", "commonsense")


def domains(df: pd.DataFrame) -> list[str]:
    """Retained domain names present in the table: math, commonsense, then any other in sorted order."""
    out = set()
    for col in df.columns:
        parts = col.split("/")
        if len(parts) == 3 and parts[0] == "retained" and parts[2] == "kl_token_mean":
            out.add(parts[1])
    return sorted(out, key=lambda d: (DOMAIN_ORDER.index(d) if d in DOMAIN_ORDER else len(DOMAIN_ORDER), d))


def kl_column(domain: Optional[str]) -> str:
    """The KL column of one retained domain, or the mean over domains for None / 'mean'."""
    return schema.KL_MEAN_COL if domain in (None, "mean") else f"retained/{domain}/kl_token_mean"


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
        mask = frontier_mask(list(g["x_mean"]), list(g["y_mean"]))
        points.loc[g.index, "on_frontier"] = mask
    points = points[cols]
    for c in ("x_std", "x_lo", "x_hi", "y_std", "y_lo", "y_hi"):
        points[c] = points[c].astype(float)
    return points.reset_index(drop=True)


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """The frontier rows of `sweep_points` output, ordered by x (pass@1) ascending within each method."""
    front = points[points["on_frontier"].astype(bool)]
    return front.sort_values(["backbone", "benchmark", "method", "x_mean", "y_mean"], kind="mergesort").reset_index(drop=True)
