"""KL at a matched coding requirement (EVALUATION.md, "Matched coding requirement").

For a requirement level c (pass@1 >= c), a method and a seed: the least retained KL among the
method's sweep points whose run with that seed meets c; "not reached" when none does. With
`interpolate`, the KL where the seed's frontier (pass@1 against KL; `analysis.pareto`) reaches c: per
training run, linearly between the two points of the run's curve (its post-hoc scales) around c, never
extrapolated (not reached above the curve's best pass@1; the curve's lowest KL below its least pass@1),
then the least over the method's runs, so a further trained point never raises a method's value and no line
joins two different runs. Without post-hoc scales each run is one point and the two readings agree. Then,
over seeds: mean, standard
deviation and a 95% t-interval of the seeds that reach c, and a paired comparison of ATLAS
against each other method over the seeds where both reach c.

Levels are absolute (`0.3`: pass@1 >= 0.3) or relative to the coding gain of a named reference sweep point
on a backbone (`gain:0.75`: pass@1 >= lo + 0.75 (hi - lo), with lo the base model's mean pass@1 on that backbone
and benchmark (an error without base runs), and hi the reference point's mean pass@1 over its seeds). The reference is
`METHOD[:KNOB=VALUE,...]` (default `lora`): that method's sweep point at scale 1 with those knob values, which
must be exactly one point. It depends on nothing else in the table, so adding or removing a method never moves a
level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import pandas as pd

from analysis import methods as M
from analysis import schema
from analysis.pareto import TOL, envelope_gap, envelope_value, per_seed, run_fronts
from analysis.stats import bootstrap_interval, holm, paired, summarize

DEFAULT_LEVELS = ("gain:0.5", "gain:0.75", "gain:0.9")
DEFAULT_REFERENCE = "lora"


@dataclass(frozen=True)
class Level:
    spec: str          # as given: "0.3" or "gain:0.75"
    kind: str          # "abs" or "gain"
    value: float

    @property
    def label(self) -> str:
        if self.kind == "gain":
            return f"{_pct(self.value)} of gain"
        return f"pass@1 >= {self.value:g}"


def _pct(f: float) -> str:
    return f"{100 * f:g}%"


def parse_level(spec: str) -> Level:
    """`0.3` (absolute pass@1) or `gain:0.75` (share of the coding gain over the base model)."""
    text = str(spec).strip()
    kind, _, number = text.rpartition(":")
    kind = kind or "abs"
    if kind not in ("abs", "gain"):
        raise ValueError(f"level {spec!r}: prefix {kind!r} unknown; use a number (0.3) or gain:FRACTION (gain:0.75)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"level {spec!r}: {number!r} is not a number") from None
    if not math.isfinite(value) or value < 0.0 or (kind == "abs" and value > 1.0):
        raise ValueError(f"level {spec!r}: {value} is outside " + ("[0, 1]" if kind == "abs" else "[0, inf)"))
    return Level(text, kind, value)


def parse_levels(specs: Sequence[str]) -> list[Level]:
    levels = []
    for spec in specs:
        for part in str(spec).split(","):
            if part.strip():
                levels.append(parse_level(part))
    if not levels:
        raise ValueError("no requirement levels given")
    seen = set()
    out = []
    for lv in levels:
        if (lv.kind, lv.value) not in seen:
            seen.add((lv.kind, lv.value))
            out.append(lv)
    return out


@dataclass(frozen=True)
class Reference:
    """The sweep point whose gain over the base model `gain:` levels are shares of: a method and knob values."""

    spec: str                           # as given: "lora" or "lora:train.steps=600"
    method: str
    knobs: tuple[tuple[str, str], ...]  # (knob name as in the records without the `knob/` prefix, value text)

    @property
    def label(self) -> str:
        shown = M.label(self.method) if self.method in M.LABELS else self.method
        return shown + (f" ({', '.join(f'{k}={v}' for k, v in self.knobs)})" if self.knobs else "")


def parse_reference(spec: "str | Reference") -> Reference:
    """`lora` or `lora:train.steps=600,rank=8` (knob names as in the records' knob columns)."""
    if isinstance(spec, Reference):
        return spec
    text = str(spec).strip()
    method, _, rest = text.partition(":")
    if not method.strip():
        raise ValueError(f"reference {spec!r}: give METHOD or METHOD:KNOB=VALUE,... (e.g. lora:train.steps=600)")
    knobs = []
    for part in rest.split(",") if rest.strip() else []:
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"reference {spec!r}: {part!r} is not KNOB=VALUE")
        knobs.append((key.strip(), value.strip()))
    return Reference(text, method.strip(), tuple(knobs))


def _same(cell, text: str) -> bool:
    try:
        return float(cell) == float(text)
    except (TypeError, ValueError):
        return str(cell) == text


def _points_text(g: pd.DataFrame) -> str:
    """The sweep points of `g` by the knobs that differ between them."""
    knob_cols = [c for c in g.columns if c.startswith(schema.KNOB_PREFIX)]
    first = g.drop_duplicates("sweep_key")
    varying = [c for c in knob_cols if first[c].astype(str).nunique() > 1]
    if not varying:
        return f"{len(first)} point(s)"
    return "; ".join(sorted(", ".join(f"{c[len(schema.KNOB_PREFIX):]}={r[c]}" for c in varying)
                            for _, r in first.iterrows()))


def reference_point(df: pd.DataFrame, backbone: str, benchmark: str, reference: "str | Reference") -> str:
    """The sweep key of the reference point on one backbone and benchmark (scale 1). ValueError, naming the
    candidates, when no point or several points match."""
    ref = parse_reference(reference)
    g = df[(df["backbone"] == backbone) & (df["benchmark"] == benchmark) & (df["method"] == ref.method)]
    where = f"on {backbone}/{benchmark}"
    if g.empty:
        raise ValueError(f"reference {ref.spec!r}: no complete {ref.method} runs {where}; gain levels are shares of "
                         "its gain over the base model (name another point with --reference, or use absolute levels)")
    g = g[g[schema.SCALE_COL] == 1.0]
    pick = g
    for key, value in ref.knobs:
        col = schema.KNOB_PREFIX + key
        if col not in pick.columns:
            known = sorted(c[len(schema.KNOB_PREFIX):] for c in g.columns if c.startswith(schema.KNOB_PREFIX))
            raise ValueError(f"reference {ref.spec!r}: no knob {key!r} in the records; knobs: {known}")
        pick = pick[[_same(c, value) for c in pick[col]]]
    keys = sorted(pick["sweep_key"].unique())
    if len(keys) == 1:
        return keys[0]
    found = "no point" if not keys else f"{len(keys)} points"
    points = _points_text(g)
    example = points.split("; ")[0] if "=" in points else "KNOB=VALUE"
    raise ValueError(f"reference {ref.spec!r}: {found} of {ref.method} at scale 1 {where} match; its points there: "
                     f"{points}. Name one, e.g. --reference {ref.method}:{example.replace(' ', '')}")


def _split_of(benchmark: str) -> str:
    name, at, split = str(benchmark).partition("@")
    return split if at else "test"


def base_pass1(df: pd.DataFrame, backbone: str, benchmark: str) -> float:
    """The base model's mean pass@1 over its runs on one backbone and benchmark. ValueError, saying how to add them
    (the backbone's name without a `--split-incomparable` suffix), when there are none: a gain level's requirement
    would otherwise be read from a made-up 0."""
    g = df[(df["backbone"] == backbone) & (df["benchmark"] == benchmark) & (df["method"] == M.BASE)]
    if g.empty:
        split = _split_of(benchmark)
        raise ValueError(f"no complete {M.BASE} runs on {backbone}/{benchmark}: gain levels are shares of the coding "
                         f"gain over the base model's pass@1; add its records (python run.py method={M.BASE} "
                         f"backbone={str(backbone).partition(' [')[0]} benchmark={str(benchmark).partition('@')[0]}"
                         + (f" benchmark.split={split}" if split != "test" else "")
                         + ") or use absolute levels (e.g. --levels 0.3 0.4)")
    return float(g[schema.TARGET_COL].mean())


def reference_pass1(df: pd.DataFrame, backbone: str, benchmark: str,
                    reference: "str | Reference" = DEFAULT_REFERENCE) -> float:
    """The reference point's pass@1 on one backbone and benchmark: the mean over its seeds (each seed's runs
    averaged first), as measured (`gain_range` raises it to the base's when lower)."""
    key = reference_point(df, backbone, benchmark, reference)
    g = df[(df["backbone"] == backbone) & (df["benchmark"] == benchmark) & (df["sweep_key"] == key)]
    return float(per_seed(g, [schema.TARGET_COL])[schema.TARGET_COL].mean())


def gain_range(df: pd.DataFrame, backbone: str, benchmark: str,
               reference: "str | Reference" = DEFAULT_REFERENCE) -> tuple[float, float]:
    """(lo, hi) of pass@1 on one backbone and benchmark: the base model's mean (`base_pass1`; ValueError without base
    runs) and the reference point's mean over its seeds (`reference_pass1`), not below lo."""
    hi = reference_pass1(df, backbone, benchmark, reference)
    lo = base_pass1(df, backbone, benchmark)
    return lo, max(lo, hi)


def requirement(level: Level, lo: float, hi: float) -> float:
    """The absolute pass@1 requirement of `level` given the gain range (lo, hi) (`gain_range`; unused for an
    absolute level)."""
    return level.value if level.kind == "abs" else lo + level.value * (hi - lo)


def threshold(level: Level, df: pd.DataFrame, backbone: str, benchmark: str,
              reference: "str | Reference" = DEFAULT_REFERENCE) -> float:
    """The absolute pass@1 requirement of `level` on one backbone and benchmark."""
    if level.kind == "abs":
        return level.value
    return requirement(level, *gain_range(df, backbone, benchmark, reference))


@dataclass(frozen=True)
class SeedReading:
    """One seed's reading at a requirement: whether a point meets it, the KL there (NaN when not reached), the
    chosen measured point (its pass@1 and sweep key; with interpolation the least-KL point meeting the level) and
    whether the KL was interpolated, and across which pass@1 gap (`bracket_gap`: between the two measured points of
    a run's curve it was read between, `pareto.envelope_gap`; NaN for a measured point's KL)."""

    reached: bool
    kl: float
    pass1: float
    sweep_key: Optional[str]
    interpolated: bool
    bracket_gap: float = float("nan")


def read_seed(xs: Sequence[float], ys: Sequence[float], keys: Sequence[str], train_keys: Sequence, c: float,
              interpolate: bool, fronts: Optional[list] = None) -> SeedReading:
    """The matched KL of one method on one seed at pass@1 requirement `c`, from its measured points: pass@1 `xs`,
    KL `ys` (nats per token), sweep keys `keys` and training runs `train_keys` (in sweep-key order). Without
    interpolation the least KL among the points meeting `c`; with it, the frontier's value at `c`
    (`envelope_value` over the runs' curves, `run_fronts`; `fronts` passes them in when already built)."""
    meets = [i for i in range(len(xs)) if xs[i] >= c - TOL]
    if not meets:
        return SeedReading(False, float("nan"), float("nan"), None, False)
    best = min(meets, key=lambda i: (ys[i], -xs[i], keys[i]))
    if not interpolate:
        return SeedReading(True, ys[best], xs[best], keys[best], False)
    # `best` meets c, so its run reaches c and the value exists
    fronts = run_fronts(xs, ys, list(train_keys)) if fronts is None else fronts
    value, gap = envelope_value(fronts, c), envelope_gap(fronts, c)
    return SeedReading(True, value, xs[best], keys[best], value != ys[best], float("nan") if gap is None else gap)


def per_seed_matched(
    df: pd.DataFrame,
    levels: Sequence[Level],
    y_col: str = schema.KL_MEAN_COL,
    interpolate: bool = False,
    methods: Optional[Sequence[str]] = None,
    reference: "str | Reference" = DEFAULT_REFERENCE,
) -> pd.DataFrame:
    """One row per (backbone, benchmark, level, method, seed): `reached`, `kl` (NaN when not reached),
    and the chosen sweep point (`sweep_key`, its `pass@1`; with interpolation the nearest frontier point
    at or above the level). Seeds are those the method ran on that backbone and benchmark. `bracket_gap`: with
    interpolation, the pass@1 gap between the two measured points of a run's curve the KL was read between
    (`pareto.envelope_gap`); NaN where it is a measured point's KL or the level is not reached.
    """
    cols = ["backbone", "benchmark", "level", "level_spec", "threshold", "method", "seed", "reached", "kl",
            "pass@1", "sweep_key", "interpolated", "bracket_gap"]
    seeds_tab = per_seed(df, [schema.TARGET_COL, y_col])
    rows = []
    for (bb, bench), g in seeds_tab.groupby(["backbone", "benchmark"], sort=True):
        names = M.ordered(g["method"]) if methods is None else [m for m in M.ordered(g["method"]) if m in methods]
        for level in levels:
            c = threshold(level, df, bb, bench, reference)
            for method in names:
                gm = g[g["method"] == method]
                for seed, gs in gm.groupby("seed", sort=True):
                    gs = gs.sort_values("sweep_key", kind="mergesort")
                    r = read_seed(list(gs[schema.TARGET_COL]), list(gs[y_col]), list(gs["sweep_key"]),
                                  list(gs["train_key"]), c, interpolate)
                    rows.append({"backbone": bb, "benchmark": bench, "level": level.label, "level_spec": level.spec,
                                 "threshold": c, "method": method, "seed": int(seed), "reached": r.reached,
                                 "kl": r.kl, "pass@1": r.pass1, "sweep_key": r.sweep_key,
                                 "interpolated": r.interpolated, "bracket_gap": r.bracket_gap})
    return pd.DataFrame(rows, columns=cols)


WIDEST_COLS = ["backbone", "benchmark", "n_bracketed", "widest_gap", "method", "level", "level_spec", "seed"]


def widest_gaps(per_seed_df: pd.DataFrame, methods: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Per backbone and benchmark, over the rows of `per_seed_matched` (of `methods`, default all): `n_bracketed`, how
    many per-seed values were read between two measured points, and `widest_gap`, the widest pass@1 gap (share of
    problems) between such points, with the method, level and seed it belongs to (the first in the frame's order on a
    tie). Groups without such a value have n_bracketed 0 and NaN and None for the rest."""
    rows = []
    if methods is not None:
        per_seed_df = per_seed_df[per_seed_df["method"].isin(list(methods))]
    for (bb, bench), g in per_seed_df.groupby(["backbone", "benchmark"], sort=True):
        read = g[g["bracket_gap"].notna()]
        row = {"backbone": bb, "benchmark": bench, "n_bracketed": len(read), "widest_gap": float("nan"),
               "method": None, "level": None, "level_spec": None, "seed": None}
        if len(read):
            top = read.loc[read["bracket_gap"].idxmax()]
            row |= {"widest_gap": float(top["bracket_gap"]), "method": top["method"], "level": top["level"],
                    "level_spec": top["level_spec"], "seed": int(top["seed"])}
        rows.append(row)
    return pd.DataFrame(rows, columns=WIDEST_COLS)


SUMMARY_COLS = ["backbone", "benchmark", "level", "level_spec", "threshold", "method", "n_seeds", "n_reached",
                "mean", "std", "lo", "hi", "boot_lo", "boot_hi", "status"]


def summarize_matched(per_seed_df: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Over seeds, per (backbone, benchmark, level, method): how many seeds reach the level, and the mean,
    std, t-interval and percentile bootstrap interval (`analysis.stats.bootstrap_interval`) of their KL, over
    the reaching seeds only. `status`: reached (all seeds), partial, or not reached (no seed)."""
    rows = []
    keys = ["backbone", "benchmark", "level", "level_spec", "threshold", "method"]
    for key, g in per_seed_df.groupby(keys, sort=False):
        reached = g[g["reached"]]
        row = dict(zip(keys, key)) | {"n_seeds": len(g), "n_reached": len(reached)}
        if len(reached):
            s = summarize(reached["kl"], confidence)
            boot = bootstrap_interval(list(reached["kl"]), confidence) or (None, None)
            row |= {"mean": s.mean, "std": s.std, "lo": s.lo, "hi": s.hi, "boot_lo": boot[0], "boot_hi": boot[1]}
        else:
            row |= {"mean": None, "std": None, "lo": None, "hi": None, "boot_lo": None, "boot_hi": None}
        row["status"] = "reached" if len(reached) == len(g) else ("partial" if len(reached) else "not reached")
        rows.append(row)
    out = pd.DataFrame(rows, columns=SUMMARY_COLS)
    for c in ("mean", "std", "lo", "hi", "boot_lo", "boot_hi"):
        out[c] = out[c].astype(float)
    return out


COMPARE_COLS = ["backbone", "benchmark", "level", "level_spec", "threshold", "reference", "method", "n_pairs",
                "mean_diff", "lo", "hi", "boot_lo", "boot_hi", "t", "p_t", "wins", "losses", "p_sign",
                "only_reference", "only_method", "p_t_holm", "p_sign_holm"]


def compare(per_seed_df: pd.DataFrame, reference: str = M.REFERENCE, others: Optional[Sequence[str]] = None,
            confidence: float = 0.95) -> pd.DataFrame:
    """Paired comparison of `reference` against each other method, per backbone, benchmark and level.

    Pairs are the seeds where both reach the level; d = KL(reference) - KL(method), so a negative mean
    means the reference keeps retained outputs closer to the base. Reported: mean d, its t-interval and
    percentile bootstrap interval,
    the paired t statistic with its two-sided p (n - 1 degrees of freedom), the seeds where the
    reference is lower (wins) or higher (losses), and the exact two-sided sign-test p. Seeds where only
    one of the two reaches the level are counted in `only_reference` / `only_method`.
    `p_t_holm`, `p_sign_holm`: `p_t` and `p_sign` Holm-corrected (`analysis.stats.holm`), each over its family
    (`holm_by_family`).
    """
    rows = []
    keys = ["backbone", "benchmark", "level", "level_spec", "threshold"]
    for key, g in per_seed_df.groupby(keys, sort=False):
        ref = g[g["method"] == reference].set_index("seed")
        if ref.empty:
            continue
        names = [m for m in M.ordered(g["method"]) if m != reference and (others is None or m in others)]
        for method in names:
            oth = g[g["method"] == method].set_index("seed")
            common = sorted(set(ref.index) & set(oth.index))
            both = [s for s in common if ref.at[s, "reached"] and oth.at[s, "reached"]]
            only_ref = sum(1 for s in common if ref.at[s, "reached"] and not oth.at[s, "reached"])
            only_oth = sum(1 for s in common if oth.at[s, "reached"] and not ref.at[s, "reached"])
            a_kl, b_kl = [ref.at[s, "kl"] for s in both], [oth.at[s, "kl"] for s in both]
            p = paired(a_kl, b_kl, confidence)
            boot = bootstrap_interval([x - y for x, y in zip(a_kl, b_kl)], confidence) or (None, None)
            rows.append(dict(zip(keys, key)) | {
                "reference": reference, "method": method, "n_pairs": p.n, "mean_diff": p.mean_diff,
                "lo": p.lo, "hi": p.hi, "boot_lo": boot[0], "boot_hi": boot[1], "t": p.t, "p_t": p.p_t, "wins": p.wins, "losses": p.losses,
                "p_sign": p.p_sign, "only_reference": only_ref, "only_method": only_oth,
            })
    out = pd.DataFrame(rows, columns=COMPARE_COLS)
    for c in ("mean_diff", "lo", "hi", "boot_lo", "boot_hi", "t", "p_t", "p_sign"):
        out[c] = out[c].astype(float)
    for raw in ("p_t", "p_sign"):
        out[f"{raw}_holm"] = holm_by_family(out, raw)
    return out


def holm_by_family(comparisons: pd.DataFrame, column: str) -> pd.Series:
    """`column`'s p-values Holm-corrected (`analysis.stats.holm`) within each family: the (method, level) comparisons
    on one backbone and benchmark whose methods share a `analysis.methods.holm_family` (the methods outside the ATLAS
    family; ATLAS's variants). Missing p-values stay missing and count in no family."""
    adjusted = pd.Series(float("nan"), index=comparisons.index, dtype=float)
    if comparisons.empty:
        return adjusted
    family = comparisons["method"].map(M.holm_family).rename("family")
    for _, g in comparisons.groupby([comparisons["backbone"], comparisons["benchmark"], family], sort=False):
        adjusted[g.index] = [float("nan") if v is None else v for v in holm(list(g[column]))]
    return adjusted


DOMINANCE_COLS = ["backbone", "benchmark", "kl", "reference", "method", "seeds", "n_reference_points",
                  "reference_dominated", "n_method_points", "method_dominated", "share_reference_dominated",
                  "share_method_dominated"]


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether the (pass@1, KL) point `a` dominates `b`: pass@1 not lower, KL not higher, one of them strictly."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def dominance(df: pd.DataFrame, reference: str = M.REFERENCE, y_col: str = schema.KL_MEAN_COL,
              kl_name: str = "mean", methods: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Interpolation-free dominance of `reference` and each other method, per backbone and benchmark.

    A measured point is one sweep point (a trained run at one post-hoc scale) on one seed, as recorded: its pass@1
    (share of problems) and its `y_col` KL (nats per token), the mean of that seed's runs of the point (`per_seed`).
    Over the seeds both methods ran: `reference_dominated` of the reference's `n_reference_points` points are
    dominated (`dominates`) by a point of the method on the same seed, and `method_dominated` of the method's
    `n_method_points` by one of the reference's; the shares are these counts over the points (NaN without points).
    `kl`: `kl_name`, which KL `y_col` is.
    """
    pts = per_seed(df, [schema.TARGET_COL, y_col])
    rows = []
    for (bb, bench), g in pts.groupby(["backbone", "benchmark"], sort=True):
        ref = g[g["method"] == reference]
        if ref.empty:
            continue
        names = [m for m in M.ordered(g["method"]) if m not in (reference, M.BASE) and (methods is None or m in methods)]
        for method in names:
            oth = g[g["method"] == method]
            seeds = sorted(set(ref["seed"]) & set(oth["seed"]))
            counts = [0, 0, 0, 0]  # reference points, dominated; method points, dominated
            for seed in seeds:
                a = list(zip(ref[ref["seed"] == seed][schema.TARGET_COL], ref[ref["seed"] == seed][y_col]))
                b = list(zip(oth[oth["seed"] == seed][schema.TARGET_COL], oth[oth["seed"] == seed][y_col]))
                counts[0] += len(a)
                counts[1] += sum(any(dominates(q, p) for q in b) for p in a)
                counts[2] += len(b)
                counts[3] += sum(any(dominates(p, q) for p in a) for q in b)
            rows.append({"backbone": bb, "benchmark": bench, "kl": kl_name, "reference": reference, "method": method,
                         "seeds": len(seeds), "n_reference_points": counts[0], "reference_dominated": counts[1],
                         "n_method_points": counts[2], "method_dominated": counts[3],
                         "share_reference_dominated": counts[1] / counts[0] if counts[0] else float("nan"),
                         "share_method_dominated": counts[3] / counts[2] if counts[2] else float("nan")})
    return pd.DataFrame(rows, columns=DOMINANCE_COLS)
