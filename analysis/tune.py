"""Equal tuning budget: each method's sweep points for an evaluation preset, chosen from its dev-split records.

A tuning preset (`micro_tune`) trains every method at the same number of points along the knob its authors name,
seed by seed, and evaluates them on the dev split. From those records, per method (scale-1 points of one backbone
and dev benchmark), with the levels of `analysis.matched` on dev (`low` and `high` shares of the reference point's
dev gain over the base model):

1. the **high** point: the least mean retained KL among the points whose mean pass@1 reaches the `high` level; if
   none does, the point with the highest mean pass@1 (the method cannot reach it on dev). The reference point's own
   method takes the reference point here instead: the levels of the evaluation preset are shares of that point's
   gain, so it must be run there, and counting it as one of its method's points keeps every method's budget at `n`
   (the reference reaches every level up to 1 by definition);
2. then, until `n` points are chosen: the least-KL point not chosen yet among those reaching the `low` level,
   then the highest-pass@1 point not chosen yet.

Every method gets min(n, its grid size) points, all chosen by this one rule on dev data; the evaluation preset's
post-hoc scales extend each point's front downwards. The chosen points are written as `conf/point` files that set
the knobs varied in the method's grid (`train.steps` -> `train: {steps: ...}`, any other knob -> `method: {...}`).

How firm a choice is (`stability`): a point's dev pass@1 and the levels are means over a finite set of problems,
so a point within `z` standard errors of a level could fall on either side of it on a re-run (other float rounding,
another seed) or on the test split. The rule is applied twice more, once with every such close point counted as
reaching its level and once as not reaching it; a method whose chosen points under either reading differ from the
measured choice is `close`, and that other choice is named. Standard errors are binomial over problems, sqrt(p (1 - p) / (problems x seeds)),
for the point and for the level (the share of the reference's and the base's errors), combined in quadrature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis import matched as MT
from analysis import methods as M
from analysis import schema
from analysis.collect import collect, thread_counts, threads_text
from analysis.pareto import per_seed
from suite_schema import registry

TRAIN_PREFIX = f"{schema.KNOB_PREFIX}train."


@dataclass(frozen=True)
class Choice:
    """One chosen point: its method, the knob values varied in the method's grid, and its dev figures."""

    method: str
    knobs: tuple[tuple[str, object], ...]   # (knob column without the `knob/` prefix, value)
    pass1: float                            # mean dev pass@1 over seeds
    kl: float                               # mean dev retained KL over seeds
    n_seeds: int
    role: str                               # "high" (reaches the high level), "high: not reached", "reference",
                                            # "low", "fill"


def dev_groups(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(backbone, benchmark) groups of dev-split records (benchmark `<name>@dev`); records of any other split are
    never read. ValueError when there is no dev group."""
    benches = sorted(set(zip(df["backbone"], df["benchmark"])))
    dev = [(b, c) for b, c in benches if str(c).endswith("@dev")]
    if not dev:
        raise ValueError(f"tuning reads dev-split records only, and there are none among {[f'{b}/{c}' for b, c in benches]} "
                         "(the tuning presets set benchmark.split=dev)")
    return dev


@dataclass(frozen=True)
class Stability:
    """How firm one method's choice is (module docstring): `close` when counting its close points (within `z`
    standard errors of a level) as reaching or as missing it changes the chosen points; `alternative` is then the
    choice that differs from the measured one (the knobs of each point, in order)."""

    method: str
    close: bool
    close_points: tuple[str, ...]           # "knob=value (high level, -0.4 SE)" for every close point
    alternative: tuple[tuple[tuple[str, object], ...], ...]


@dataclass(frozen=True)
class _Group:
    """One dev group's scale-1 records, its two levels and their standard errors, and the reference's sweep key."""

    key: tuple[str, str]
    records: pd.DataFrame
    levels: tuple[float, float]
    level_se: tuple[float, float]
    reference_key: str


def pass1_se(p: float, problems: float) -> float:
    """Binomial standard error of a pass@1 mean over `problems` problem evaluations (problems x seeds); with several
    samples per problem it bounds the error from above."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / problems) if problems > 0 else float("nan")


def _problems(g: pd.DataFrame) -> float:
    """Problem evaluations behind a set of scale-1 records (n_problems summed over their seeds)."""
    col = "target/n_problems"
    return float(per_seed(g, [col])[col].sum()) if col in g.columns and len(g) else 0.0


def _groups(df: pd.DataFrame, reference: "str | MT.Reference", n_points: int, low: float, high: float) -> list[_Group]:
    if n_points < 1:
        raise ValueError(f"points {n_points}: at least 1")
    if not 0.0 <= low <= high:
        raise ValueError(f"levels low {low}, high {high}: need 0 <= low <= high")
    out = []
    for bb, bench in dev_groups(df):
        g = df[(df["backbone"] == bb) & (df["benchmark"] == bench) & (df[schema.SCALE_COL] == 1.0)]
        lo, hi = MT.gain_range(df, bb, bench, reference)
        ref_key = MT.reference_point(df, bb, bench, reference)
        base = g[g["method"] == M.BASE]
        se_lo = pass1_se(lo, _problems(base)) if len(base) else 0.0
        se_hi = pass1_se(hi, _problems(g[g["sweep_key"] == ref_key]))
        level_se = tuple(math.hypot(share * se_hi, (1.0 - share) * se_lo) for share in (low, high))
        out.append(_Group((bb, bench), g, (lo + low * (hi - lo), lo + high * (hi - lo)), level_se, ref_key))
    return out


def _methods(group: _Group):
    for method in M.ordered(group.records["method"]):
        if method != M.BASE:
            gm = group.records[group.records["method"] == method]
            yield method, gm, (group.reference_key if group.reference_key in set(gm["sweep_key"]) else None)


def choose_points(df: pd.DataFrame, reference: "str | MT.Reference", n_points: int, low: float = 0.5,
                  high: float = 0.9) -> dict[tuple[str, str], list[Choice]]:
    """Per dev group (backbone, benchmark): every trained method's chosen points, in the order chosen."""
    out = {}
    for group in _groups(df, reference, n_points, low, high):
        out[group.key] = [c for method, gm, first in _methods(group)
                          for c in _choose(gm, method, n_points, *group.levels, first)]
    return out


def stability(df: pd.DataFrame, reference: "str | MT.Reference", n_points: int, low: float = 0.5,
              high: float = 0.9, z: float = 1.0) -> dict[tuple[str, str], list[Stability]]:
    """Per dev group: how firm each trained method's choice is when its points and the levels are known only to
    within `z` standard errors (module docstring)."""
    out = {}
    for group in _groups(df, reference, n_points, low, high):
        found = []
        for method, gm, first in _methods(group):
            rows, names, firsts = _points(gm, method)
            measured = _order(rows, first, n_points, *group.levels)
            margins: dict[str, list[str]] = {}
            close: set[tuple[str, str]] = set()
            for k, r in rows.items():
                for level, level_se, label in zip(group.levels, group.level_se, ("low", "high")):
                    combined = math.hypot(pass1_se(r.pass1, r.problems), level_se)
                    if combined > 0 and abs(r.pass1 - level) < z * combined:
                        close.add((k, label))
                        margins.setdefault(k, []).append(f"{label} level, {(r.pass1 - level) / combined:+.1f} SE")
            optimistic = _order(rows, first, n_points, *group.levels, lenient=frozenset(close))
            pessimistic = _order(rows, first, n_points, *group.levels, strict=frozenset(close))
            keys = [[k for k, _ in o] for o in (measured, optimistic, pessimistic)]
            other = next((o for o in keys[1:] if o != keys[0]), None)
            knobs = {k: _knobs(firsts, k, names, method) for k in rows}
            found.append(Stability(
                method, other is not None,
                tuple(f"{knob_text(knobs[k])} ({'; '.join(m)})" for k, m in margins.items()),
                tuple(knobs[k] for k in other) if other is not None else ()))
        out[group.key] = found
    return out


def _points(g: pd.DataFrame, method: str):
    """({sweep key: row with pass1, kl, n (seeds), problems}, {knob column: knob name}, first record per key)."""
    seeds = per_seed(g, [schema.TARGET_COL, schema.KL_MEAN_COL])
    points = seeds.groupby("sweep_key").agg(pass1=(schema.TARGET_COL, "mean"), kl=(schema.KL_MEAN_COL, "mean"),
                                            n=("seed", "count")).reset_index()
    points["problems"] = [_problems(g[g["sweep_key"] == k]) for k in points["sweep_key"]]
    knob_cols = [c for c in g.columns if c.startswith(schema.KNOB_PREFIX)]
    firsts = g.drop_duplicates("sweep_key").set_index("sweep_key")
    varying = [c for c in knob_cols if firsts[c].astype(str).nunique() > 1]
    return ({r.sweep_key: r for r in points.itertuples()}, {c: c[len(schema.KNOB_PREFIX):] for c in varying},
            firsts)


def knob_text(knobs: tuple[tuple[str, object], ...]) -> str:
    """A point's knobs as `name=value, ...` (the printed tables)."""
    return ", ".join(f"{name}={value}" for name, value in knobs)


def _knobs(firsts: pd.DataFrame, key: str, names: dict, method: str) -> tuple[tuple[str, object], ...]:
    return tuple((name, _plain(firsts.at[key, c], _default(method, name))) for c, name in names.items())


def _order(rows: dict, reference_key: Optional[str], n_points: int, c_low: float, c_high: float,
           lenient: frozenset = frozenset(), strict: frozenset = frozenset()) -> list[tuple[str, str]]:
    """The rule of the module docstring over one method's points: [(sweep key, role)]. A (sweep key, "low" or
    "high") pair in `lenient` counts as reaching that level, one in `strict` as missing it, whatever its pass@1 (the
    stability check's two readings)."""
    def reaches(k: str, label: str, level: float) -> bool:
        if (k, label) in lenient:
            return True
        return (k, label) not in strict and rows[k].pass1 >= level - MT.TOL

    order: list[tuple[str, str]] = []
    reach_high = [k for k in rows if reaches(k, "high", c_high)]
    if reference_key is not None:
        order.append((reference_key, "reference"))
    elif reach_high:
        order.append((min(reach_high, key=lambda k: (rows[k].kl, -rows[k].pass1, k)), "high"))
    elif rows:
        order.append((max(rows, key=lambda k: (rows[k].pass1, -rows[k].kl, k)), "high: not reached"))
    while len(order) < min(n_points, len(rows)):
        taken = {k for k, _ in order}
        low_ok = [k for k in rows if k not in taken and reaches(k, "low", c_low)]
        if low_ok:
            order.append((min(low_ok, key=lambda k: (rows[k].kl, -rows[k].pass1, k)), "low"))
        else:
            rest = [k for k in rows if k not in taken]
            order.append((max(rest, key=lambda k: (rows[k].pass1, -rows[k].kl, k)), "fill"))
    return order


def _choose(g: pd.DataFrame, method: str, n_points: int, c_low: float, c_high: float,
            reference_key: Optional[str] = None) -> list[Choice]:
    rows, names, firsts = _points(g, method)
    return [Choice(method, _knobs(firsts, k, names, method), float(rows[k].pass1), float(rows[k].kl), int(rows[k].n),
                   role) for k, role in _order(rows, reference_key, n_points, c_low, c_high)]


def _plain(value, default=None):
    """A knob cell as a plain Python scalar of the type its configured default has. The table stores a knob column
    as floats when some method lacks the knob (rank 32 reads 32.0), and the run id hashes the composed values as
    written (`conditioning: 1` and `conditioning: 1.0` are two run ids), so a knob whose default is a float is
    written as a float and an integral value of any other knob as an integer: the point's run is then the same run
    as the tuned one, or as the method's default run where the values agree."""
    value = value.item() if hasattr(value, "item") else value
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _default(method: str, knob: str):
    """The configured default of `knob`: `train.<key>` from conf/train/default.yaml, any other from the method
    registry's values of `method`; None where there is none."""
    if knob.startswith("train."):
        return registry.group_values("train", "default").get(knob[len("train."):])
    spec = registry.methods().get(method)
    return None if spec is None else spec.values.get(knob)


def point_text(choice: Choice, level_text: str, threads: Optional[dict[int, int]] = None) -> str:
    """The conf/point file of one chosen point; `threads` (from `thread_counts`) adds how the dev records were
    trained, which a re-run must match to reproduce the choice exactly."""
    method_knobs = {k: v for k, v in choice.knobs if not k.startswith("train.")}
    train_knobs = {k[len("train."):]: v for k, v in choice.knobs if k.startswith("train.")}

    def block(d: dict) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) + "}"

    lines = ["# @package _global_",
             f"# Chosen on the dev split by `python -m analysis tune` ({choice.role}: {level_text}): {choice.method} at "
             f"dev pass@1 {choice.pass1:.4f}, retained KL {choice.kl:.4f} (mean of {choice.n_seeds} seed(s)).",
             "defaults:", f"  - override /method: {choice.method}"]
    if threads:
        lines.insert(2, f"# Dev records trained with {threads_text(threads)} (`cost.threads`); other thread counts "
                        "round differently and can choose otherwise near a level.")
    if method_knobs:
        lines.append(f"method: {block(method_knobs)}")
    if train_knobs:
        lines.append(f"train: {block(train_knobs)}")
    return "\n".join(lines) + "\n"


def write_points(choices: dict[tuple[str, str], list[Choice]], out: Path, prefix: str, level_text: str,
                 threads: Optional[dict[int, int]] = None) -> list[Path]:
    """Write `<out>/<prefix>_<method>_<i>.yaml` for every choice (one dev group only); earlier files of this
    prefix that are not rewritten are removed, so a preset globbing `<prefix>_*` reads exactly these."""
    if len(choices) != 1:
        raise ValueError(f"points are written for one dev group at a time; the records hold {sorted(choices)}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    counts: dict[str, int] = {}
    for choice in next(iter(choices.values())):
        counts[choice.method] = counts.get(choice.method, 0) + 1
        path = out / f"{prefix}_{choice.method}_{counts[choice.method]}.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(point_text(choice, level_text, threads))
        tmp.replace(path)
        written.append(path)
    for stale in sorted(out.glob(f"{prefix}_*.yaml")):
        if stale not in written:
            stale.unlink()
    return written


def choices_frame(choices: dict[tuple[str, str], list[Choice]]) -> pd.DataFrame:
    """The choices as a table (backbone, benchmark, method, role, knobs, dev pass@1, dev KL, seeds)."""
    rows = [{"backbone": bb, "benchmark": bench, "method": c.method, "role": c.role,
             "knobs": knob_text(c.knobs), "pass@1": c.pass1, "kl": c.kl, "n_seeds": c.n_seeds}
            for (bb, bench), cs in choices.items() for c in cs]
    return pd.DataFrame(rows, columns=["backbone", "benchmark", "method", "role", "knobs", "pass@1", "kl", "n_seeds"])


def stability_frame(found: dict[tuple[str, str], list[Stability]]) -> pd.DataFrame:
    """The stability check as a table (backbone, benchmark, method, close, close_points, alternative)."""
    rows = [{"backbone": bb, "benchmark": bench, "method": st.method, "close": st.close,
             "close_points": "; ".join(st.close_points),
             "alternative": " | ".join(knob_text(knobs) for knobs in st.alternative)}
            for (bb, bench), sts in found.items() for st in sts]
    return pd.DataFrame(rows, columns=["backbone", "benchmark", "method", "close", "close_points", "alternative"])


def earlier_definitions(table: pd.DataFrame) -> list[str]:
    """The methods of `table` named with an earlier definition (`analysis.schema.defined_method`): no point is chosen
    for them, since no run can be made under that definition today."""
    return sorted(m for m in set(table["method"]) if "[" in m)


def tune(dirs: Sequence[str], reference: str, n_points: int, low: float = 0.5, high: float = 0.9,
         out: Optional[Path] = None, prefix: str = "micro_main",
         z: float = 1.0) -> tuple[pd.DataFrame, list[Path], pd.DataFrame, dict[int, int]]:
    """Collect dev records from `dirs`, choose every method's points, and (with `out`) write their point files;
    returns the choices, the files written, the stability check at `z` standard errors and the records' intra-op
    thread counts (`thread_counts`)."""
    table = collect(dirs).table
    if table.empty:
        raise ValueError(f"no complete records under {list(dirs)}")
    table = table[~table["method"].isin(earlier_definitions(table))]  # a point is chosen for a method that runs today
    choices = choose_points(table, reference, n_points, low, high)
    level_text = (f"levels {low:g} and {high:g} of the dev gain of {MT.parse_reference(reference).spec} over the "
                  "base model")
    threads = thread_counts(table)
    written = write_points(choices, Path(out), prefix, level_text, threads) if out is not None else []
    return (choices_frame(choices), written, stability_frame(stability(table, reference, n_points, low, high, z)),
            threads)
