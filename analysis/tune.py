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

Equal budgets, enforced (`tune` refuses, naming the methods, unless told otherwise):

- **Same candidates and dev seeds.** Every tuned method has the same number of candidate points (its scale-1 sweep
  points on dev) and every candidate the same number of dev seeds, at least `min_seeds` (2 by default: one seed
  cannot tell a method's choice from its seed's luck). A method whose only candidate is the reference point is not
  tuned here (its point is the reference; e.g. LoRA in a preset that tunes other methods against micro_tune's
  reference): its seeds count, its candidate count does not.
- **No pick at the edge of its grid.** A method's grid is, per knob its records vary, the values its candidates take.
  A pick at the smallest or largest value of a knob means its best may lie beyond the grid: the least KL reaching a
  level (`high`, `low`), and equally the highest pass@1 (`high: not reached`, `fill`), which a step further along
  the knob may raise past the level. The grid must be extended first. `grid_edges` names the edge and suggests the
  next candidates beyond it, continuing the spacing next to the edge (geometric when the grid's steps are more even
  as ratios than as differences, arithmetic otherwise) inside the knob's bounds (`KNOB_BOUNDS`; `train.steps` never
  beyond the longest training among the dev records, the budget no method may exceed; an integer knob stays
  integral). An edge with nothing beyond it (the knob's bound: ATLAS's conditioning 1, steps at the budget) is not a
  grid artefact and passes, and so does the `reference` (fixed by the protocol, not chosen; the levels are its
  shares). `allow_edge` lets named methods through; their point files say so in a comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

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
    derived = _derived(firsts, varying, method)
    return ({r.sweep_key: r for r in points.itertuples()},
            {c: c[len(schema.KNOB_PREFIX):] for c in varying if c not in derived}, firsts)


def _derived(firsts: pd.DataFrame, varying: list[str], method: str) -> set[str]:
    """The varying knob columns a point file must not set: a knob whose configured value is null (resolved at run
    time, e.g. CorDA's alpha = rank) and whose recorded values follow another varying knob's across the candidates.
    Setting the resolved value would make another run id than the candidate's."""
    spec = registry.methods().get(method)
    out: set[str] = set()
    text = firsts[varying].astype(str)
    for col in varying:
        name = col[len(schema.KNOB_PREFIX):]
        if spec is None or name not in spec.values or spec.values[name] is not None:
            continue
        if any(other != col and other not in out and text.groupby(other)[col].nunique().max() == 1
               for other in varying):
            out.add(col)
    return out


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


# knob -> (low, high, low excluded, high excluded): the values a knob can take (None: unbounded); a knob not named
# here keeps the sign of its grid (>= 0 when every grid value is). `train.steps` is also capped by the budget.
KNOB_BOUNDS: dict[str, tuple[Optional[float], Optional[float], bool, bool]] = {
    "conditioning": (0.0, 1.0, False, False),   # ATLAS: 0 = plain LoRA ... 1 = full conditioning
    "epsilon": (0.0, 1.0, True, True),          # InfLoRA: a share of the spectrum's energy
    "rho": (0.0, 1.0, True, True),              # replay: a share of each micro-batch (1 would train on no target)
    "gate_quantile": (0.0, 1.0, True, True),
    "dropout": (0.0, 1.0, False, True),
    "train.steps": (0.0, None, True, False),
    "train.lr": (0.0, None, True, False),
    "rank": (1.0, None, False, False),
}


@dataclass(frozen=True)
class Edge:
    """A chosen point at the smallest or largest value of a knob of its method's grid, with the next candidates
    beyond it (`beyond`; empty where the knob's bound is the edge: then `bound` says which)."""

    method: str
    role: str
    knob: str
    value: object
    side: str                       # "smallest" or "largest"
    grid: tuple
    spacing: str                    # "geometric" or "arithmetic"
    beyond: tuple
    bound: str
    knobs: tuple = ()               # the chosen point's knobs (`Choice.knobs`)

    @property
    def refused(self) -> bool:
        """Refused unless allowed: a chosen (not reference) pick with candidates left beyond the edge."""
        return self.role != "reference" and bool(self.beyond)

    def text(self) -> str:
        grid = ", ".join(_num(v) for v in self.grid)
        where = f"{self.knob}={self.value} is the {self.side} value of its grid [{grid}]"
        if self.beyond:
            return (f"{self.role} pick {where}; next candidates beyond it ({self.spacing}): "
                    f"{', '.join(_num(v) for v in self.beyond)}")
        return f"{self.role} pick {where}, the knob's bound ({self.bound}): nothing beyond"


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def grid_spacing(values: Sequence[float]) -> str:
    """"geometric" when a sorted grid's steps are more even as ratios than as differences (all values > 0), else
    "arithmetic". Two values are as even either way: geometric when they span a factor of 2 or more."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    arith = max(diffs) / min(diffs)
    if min(values) > 0:
        logs = [math.log(b / a) for a, b in zip(values, values[1:])]
        geo = max(logs) / min(logs)
        if geo < arith - 1e-9 or (abs(geo - arith) <= 1e-9 and values[-1] / values[0] >= 2 - 1e-9):
            return "geometric"
    return "arithmetic"


def next_beyond(values: Sequence[float], side: str, bounds: tuple = (None, None, False, False), integer: bool = False,
                n: int = 2) -> tuple[list, str]:
    """Up to `n` candidates beyond the `side` ("smallest" or "largest") end of a grid of distinct `values`, continuing
    the spacing next to that end (`grid_spacing`), and its spacing. A step that leaves `bounds` (low, high, low
    excluded, high excluded) lands on an included bound, or halves the distance to an excluded one; an integer knob
    rounds and stops where no new integer is left."""
    values = sorted(float(v) for v in values)
    spacing = grid_spacing(values)
    lo, hi, lo_open, hi_open = bounds
    up = side == "largest"
    prev, cur = (values[-2], values[-1]) if up else (values[1], values[0])
    bound, bound_open = (hi, hi_open) if up else (lo, lo_open)

    def inside(x: float) -> bool:
        if lo is not None and (x < lo or (lo_open and x <= lo)):
            return False
        return hi is None or not (x > hi or (hi_open and x >= hi))

    out: list = []
    while len(out) < n:
        nxt = cur * (cur / prev) if spacing == "geometric" else cur + (cur - prev)
        if not inside(nxt):
            if bound is None:
                break
            if not bound_open and cur != bound:
                nxt = float(bound)
            elif bound_open:
                nxt = (cur + bound) / 2
            else:
                break
        nxt = float(round(nxt)) if integer else float(f"{nxt:.4g}")
        if nxt == cur or not inside(nxt) or (integer and nxt in values):
            break
        out.append(int(nxt) if integer else nxt)
        prev, cur = cur, nxt
    return out, spacing


def _bounds(knob: str, grid: Sequence[float], budget: Optional[float]) -> tuple:
    lo, hi, lo_open, hi_open = KNOB_BOUNDS.get(knob, (0.0 if min(grid) >= 0 else None, None, False, False))
    if knob == "train.steps" and budget is not None:
        hi, hi_open = budget, False
    return lo, hi, lo_open, hi_open


def _bound_text(knob: str, side: str, bounds: tuple, budget: Optional[float]) -> str:
    lo, hi, _, _ = bounds
    if knob == "train.steps" and side == "largest" and budget is not None:
        return f"{_num(int(budget))} steps, the longest training among the dev records: the budget"
    value = hi if side == "largest" else lo
    return f"{knob} {'<=' if side == 'largest' else '>='} {_num(value)}" if value is not None else "no new value"


def grid_edges(df: pd.DataFrame, choices: dict[tuple[str, str], list[Choice]]) -> dict[tuple[str, str], list[Edge]]:
    """Per dev group: every chosen point (but the reference) at the smallest or largest value of a numeric knob its
    method's candidates vary, with the next candidates beyond it (module docstring)."""
    out = {}
    for (bb, bench), chosen in choices.items():
        g = df[(df["backbone"] == bb) & (df["benchmark"] == bench) & (df[schema.SCALE_COL] == 1.0)]
        steps = pd.to_numeric(g.get(f"{TRAIN_PREFIX}steps", pd.Series(dtype=float)), errors="coerce").dropna()
        budget = float(steps.max()) if len(steps) else None
        found = []
        for c in chosen:
            if c.role == "reference":
                continue
            gm = g[g["method"] == c.method]
            rows, names, firsts = _points(gm, c.method)
            grid_knobs = [_knobs(firsts, k, names, c.method) for k in rows]
            for name, value in c.knobs:
                grid = sorted({v for knobs in grid_knobs for n, v in knobs if n == name and _numeric(v)})
                if len(grid) < 2 or not _numeric(value) or value not in (grid[0], grid[-1]):
                    continue
                side = "smallest" if value == grid[0] else "largest"
                bounds = _bounds(name, grid, budget)
                integer = isinstance(_default(c.method, name), int) and not isinstance(_default(c.method, name), bool)
                beyond, spacing = next_beyond(grid, side, bounds, integer)
                found.append(Edge(c.method, c.role, name, value, side, tuple(grid), spacing, tuple(beyond),
                                  "" if beyond else _bound_text(name, side, bounds, budget), c.knobs))
        out[(bb, bench)] = found
    return out


@dataclass(frozen=True)
class NewCandidate:
    """One candidate of an extension round: its method, the values of every knob its method's grid varies, and why
    it is there (`beyond ...`: past a refused edge; `beside ...`: between a pick and the grid value next to it)."""

    method: str
    knobs: tuple[tuple[str, object], ...]
    why: str


def between(a: float, b: float, spacing: str, integer: bool = False) -> Optional[float]:
    """The value halfway between `a` and `b` in a grid's spacing (the geometric mean on a geometric grid, else the
    arithmetic mean), rounded as `next_beyond` rounds; None where rounding leaves no value strictly between them."""
    mid = math.sqrt(a * b) if spacing == "geometric" else (a + b) / 2
    mid = float(round(mid)) if integer else float(f"{mid:.4g}")
    if not min(a, b) < mid < max(a, b):
        return None
    return int(mid) if integer else mid


def extension_round(df: pd.DataFrame, choices: dict[tuple[str, str], list[Choice]],
                    edges: dict[tuple[str, str], list[Edge]], allow_edge: Sequence[str] = (),
                    max_halvings: int = 4) -> dict[tuple[str, str], list[NewCandidate]]:
    """Per dev group, the next tuning round after a refusal, equal for every tuned method (a method with more than
    one candidate): each gets `n` new candidates, `n` the most that a refused method (one with a refused edge that
    `allow_edge` does not name) has beyond its edges. A refused method first takes those; every method then fills up
    with values beside its picks (the reference excepted: the protocol fixes it), in their order: halfway, in its
    grid's spacing, between the pick and the grid value below it, then above it, along each numeric knob, the other
    knobs at the pick's values; the new values then count as grid values and the halving repeats (at most
    `max_halvings` times) until `n` are found. Empty where nothing is refused."""
    out: dict[tuple[str, str], list[NewCandidate]] = {}
    for group, chosen in choices.items():
        bb, bench = group
        refused = [e for e in edges.get(group, []) if e.refused and e.method not in allow_edge]
        beyond: dict[str, list[NewCandidate]] = {}
        for e in refused:
            for value in e.beyond:
                knobs = tuple((k, value if k == e.knob else v) for k, v in e.knobs)
                if all(c.knobs != knobs for c in beyond.get(e.method, [])):
                    beyond.setdefault(e.method, []).append(NewCandidate(e.method, knobs, f"beyond: {e.text()}"))
        n = max((len(v) for v in beyond.values()), default=0)
        if n == 0:
            out[group] = []
            continue
        g = df[(df["backbone"] == bb) & (df["benchmark"] == bench) & (df[schema.SCALE_COL] == 1.0)]
        found: list[NewCandidate] = []
        for method in dict.fromkeys(c.method for c in chosen):
            rows, names, firsts = _points(g[g["method"] == method], method)
            if len(rows) < 2:
                continue
            existing = {_knobs(firsts, k, names, method) for k in rows}
            new = list(beyond.get(method, []))[:n]
            seen = existing | {c.knobs for c in new}
            grids = {name: sorted({v for knobs in existing for k, v in knobs if k == name and _numeric(v)})
                     for name in names.values()}
            spacing = {name: grid_spacing(grid) for name, grid in grids.items() if len(grid) >= 2}
            picks = [c for c in chosen if c.method == method and c.role != "reference"]
            for _ in range(max_halvings):
                for c in picks:
                    for name, value in c.knobs:
                        if name not in spacing or not _numeric(value):
                            continue
                        grid, default = grids[name], _default(method, name)
                        integer = isinstance(default, int) and not isinstance(default, bool)
                        below = [v for v in grid if v < value]
                        above = [v for v in grid if v > value]
                        sides = (("below", below[-1] if below else None), ("above", above[0] if above else None))
                        for side, other in sides:
                            mid = None if other is None else between(value, other, spacing[name], integer)
                            if mid is None or len(new) >= n:
                                continue
                            if isinstance(default, float):
                                mid = float(mid)
                            knobs = tuple((k, mid if k == name else v) for k, v in c.knobs)
                            if knobs not in seen:
                                seen.add(knobs)
                                new.append(NewCandidate(method, knobs, f"beside the {c.role} pick {knob_text(c.knobs)} "
                                                        f"({side}, {spacing[name]})"))
                for name in grids:
                    grids[name] = sorted(set(grids[name]) | {v for c in new for k, v in c.knobs if k == name})
                if len(new) >= n:
                    break
            found += new
        out[group] = found
    return out


class Refused(ValueError):
    """`tune` will not write points: unequal budgets or picks at the edge of their grid (one line per method)."""


def budget_check(df: pd.DataFrame, reference: "str | MT.Reference", min_seeds: int = 2) -> list[str]:
    """The lines of a refusal when the dev records do not give every tuned method the same number of candidates and
    every candidate the same number of dev seeds, at least `min_seeds` (module docstring); [] when they do."""
    if min_seeds < 1:
        raise ValueError(f"min dev seeds {min_seeds}: at least 1")
    lines = []
    for bb, bench in dev_groups(df):
        g = df[(df["backbone"] == bb) & (df["benchmark"] == bench) & (df[schema.SCALE_COL] == 1.0)]
        ref_key = MT.reference_point(df, bb, bench, reference)
        counts = {}
        for method in M.ordered(g["method"]):
            if method == M.BASE:
                continue
            seeds = per_seed(g[g["method"] == method], [schema.TARGET_COL, schema.KL_MEAN_COL])
            per_point = seeds.groupby("sweep_key")["seed"].nunique()
            counts[method] = (len(per_point), sorted({int(n) for n in per_point}), set(per_point.index) == {ref_key})
        candidates = {n for n, _, reference_only in counts.values() if not reference_only}
        seed_counts = {n for _, ns, _ in counts.values() for n in ns}
        problems = (["unequal numbers of candidates"] if len(candidates) > 1 else []) + \
                   (["unequal numbers of dev seeds"] if len(seed_counts) > 1 else []) + \
                   ([f"fewer than {min_seeds} dev seeds"] if seed_counts and min(seed_counts) < min_seeds else [])
        if problems:
            lines.append(f"{bb}/{bench}: {'; '.join(problems)} (every tuned method needs the same number of candidates, "
                         f"each evaluated at the same number of dev seeds, at least {min_seeds}; --min-dev-seeds "
                         "lowers it for a smoke test):")
            for method, (n, ns, reference_only) in counts.items():
                seeds_text = f"{ns[0]}-{ns[-1]}" if len(ns) > 1 else str(ns[0])
                lines.append(f"  {method}: {n} candidate(s)"
                             + (" (the reference only: not tuned, not counted)" if reference_only else "")
                             + f", {seeds_text} dev seed(s) per candidate")
    return lines


def candidates_frame(df: pd.DataFrame, choices: dict[tuple[str, str], list[Choice]],
                     edges: dict[tuple[str, str], list[Edge]], allow_edge: Sequence[str] = ()) -> pd.DataFrame:
    """Every dev candidate (scale-1 sweep point) per method, the base included, so a choice can be audited: its
    varied knobs, seeds, dev pass@1 and retained KL (mean, sample standard deviation over seeds, per-seed values in
    seed order), the role it was chosen in (empty: not chosen) and, for a chosen point at its grid's edge, what
    happened to it."""
    cols = ["backbone", "benchmark", "method", "knobs", "seeds", "n_seeds", "pass@1", "pass@1_sd", "pass@1_per_seed",
            "kl", "kl_sd", "kl_per_seed", "chosen", "edge"]
    rows = []
    for (bb, bench), chosen in choices.items():
        g = df[(df["backbone"] == bb) & (df["benchmark"] == bench) & (df[schema.SCALE_COL] == 1.0)]
        roles = {(c.method, knob_text(c.knobs)): c.role for c in chosen}  # text: a NaN knob still matches
        notes: dict[tuple, list[str]] = {}
        for e in edges.get((bb, bench), []):
            what = ("allowed (--allow-edge)" if e.method in allow_edge else "refused") if e.refused else \
                   "the knob's bound"
            notes.setdefault((e.method, knob_text(e.knobs)), []).append(
                f"{e.knob} {e.side} ({what}" + (f"; beyond: {', '.join(_num(v) for v in e.beyond)})" if e.beyond
                                                else ")"))
        methods = M.ordered(g["method"])
        for method in [m for m in methods if m == M.BASE] + [m for m in methods if m != M.BASE]:
            gm = g[g["method"] == method]
            _, names, firsts = _points(gm, method)
            seeds = per_seed(gm, [schema.TARGET_COL, schema.KL_MEAN_COL]).sort_values("seed")
            found = []
            for key, sd in seeds.groupby("sweep_key", sort=False):
                knobs = _knobs(firsts, key, names, method)
                p1, kl = sd[schema.TARGET_COL], sd[schema.KL_MEAN_COL]
                found.append({"backbone": bb, "benchmark": bench, "method": method, "knobs": knob_text(knobs),
                              "seeds": ",".join(str(int(x)) for x in sd["seed"]), "n_seeds": len(sd),
                              "pass@1": float(p1.mean()), "pass@1_sd": float(p1.std()) if len(sd) > 1 else float("nan"),
                              "pass@1_per_seed": "; ".join(f"{v:.4f}" for v in p1),
                              "kl": float(kl.mean()), "kl_sd": float(kl.std()) if len(sd) > 1 else float("nan"),
                              "kl_per_seed": "; ".join(f"{v:.4f}" for v in kl),
                              "chosen": roles.get((method, knob_text(knobs)), "" if method != M.BASE else "base"),
                              "edge": "; ".join(notes.get((method, knob_text(knobs)), [])), "_order": _sort_key(knobs)})
            rows += sorted(found, key=lambda r: r["_order"])
    frame = pd.DataFrame(rows, columns=cols + ["_order"])
    return frame.drop(columns="_order")


def _sort_key(knobs: tuple) -> tuple:
    return tuple((0, float(v), "") if _numeric(v) else (1, 0.0, str(v)) for _, v in knobs)


def knob_lines(knobs: tuple[tuple[str, object], ...]) -> list[str]:
    """A point file's value lines: `method: {...}` for method knobs, `train: {...}` for `train.<key>` knobs."""
    groups = {"method": {k: v for k, v in knobs if not k.startswith("train.")},
              "train": {k[len("train."):]: v for k, v in knobs if k.startswith("train.")}}
    return [f"{key}: " + "{" + ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) + "}"
            for key, d in groups.items() if d]


def point_text(choice: Choice, level_text: str, threads: Optional[dict[int, int]] = None,
               notes: Sequence[str] = ()) -> str:
    """The conf/point file of one chosen point; `threads` (from `thread_counts`) adds how the dev records were
    trained, which a re-run must match to reproduce the choice exactly; each of `notes` is one more comment line
    (a pick let through at the edge of its grid)."""
    lines = ["# @package _global_",
             f"# Chosen on the dev split by `python -m analysis tune` ({choice.role}: {level_text}): {choice.method} at "
             f"dev pass@1 {choice.pass1:.4f}, retained KL {choice.kl:.4f} (mean of {choice.n_seeds} seed(s)).",
             "defaults:", f"  - override /method: {choice.method}"]
    if threads:
        lines.insert(2, f"# Dev records trained with {threads_text(threads)} (`cost.threads`); other thread counts "
                        "round differently and can choose otherwise near a level.")
    at = lines.index("defaults:")
    lines[at:at] = [f"# {note}" for note in notes]
    return "\n".join(lines + knob_lines(choice.knobs)) + "\n"


def write_prefixed(texts: Sequence[tuple[str, str]], out: Path, prefix: str) -> list[Path]:
    """Write each (method, file text) as `<out>/<prefix>_<method>_<i>.yaml` (i counting per method); earlier files
    of this prefix that are not rewritten are removed, so a preset globbing `<prefix>_*` reads exactly these."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    counts: dict[str, int] = {}
    for method, text in texts:
        counts[method] = counts.get(method, 0) + 1
        path = out / f"{prefix}_{method}_{counts[method]}.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    for stale in sorted(out.glob(f"{prefix}_*.yaml")):
        if stale not in written:
            stale.unlink()
    return written


def write_points(choices: dict[tuple[str, str], list[Choice]], out: Path, prefix: str, level_text: str,
                 threads: Optional[dict[int, int]] = None, notes: Optional[dict[Choice, list[str]]] = None) -> list[Path]:
    """Write `<out>/<prefix>_<method>_<i>.yaml` for every choice (one dev group only), with `notes` of a choice as
    comment lines (`write_prefixed`)."""
    if len(choices) != 1:
        raise ValueError(f"points are written for one dev group at a time; the records hold {sorted(choices)}")
    return write_prefixed([(c.method, point_text(c, level_text, threads, (notes or {}).get(c, ())))
                           for c in next(iter(choices.values()))], out, prefix)


def write_extension(new: Sequence[NewCandidate], out: Path, prefix: str) -> list[Path]:
    """Write `<out>/<prefix>_<method>_<i>.yaml` for every candidate of an extension round (one dev group), each
    commented with why it is there (`write_prefixed`)."""
    def text(c: NewCandidate) -> str:
        lines = ["# @package _global_",
                 f"# Extension candidate (dev split), named by `python -m analysis tune` after a refusal: {c.why}.",
                 "defaults:", f"  - override /method: {c.method}"]
        return "\n".join(lines + knob_lines(c.knobs)) + "\n"
    return write_prefixed([(c.method, text(c)) for c in new], out, prefix)


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


class Tuned(NamedTuple):
    """What `tune` found: the choices (`choices_frame`), the point files written, the stability check
    (`stability_frame`), the records' thread counts (`thread_counts`), every chosen point at its grid's edge (the
    refused ones let through by `allow_edge`), the dev candidates (`candidates_frame`) and where that table was
    written (None: not written)."""

    choices: pd.DataFrame
    written: list[Path]
    stability: pd.DataFrame
    threads: dict[int, int]
    edges: list[Edge]
    candidates: pd.DataFrame
    candidates_path: Optional[Path]


def edge_note(edge: Edge) -> str:
    """The point file's comment for a pick let through at the edge of its grid."""
    return f"At the edge of its grid, let through by `--allow-edge {edge.method}`: {edge.text()}."


def tune(dirs: Sequence[str], reference: str, n_points: int, low: float = 0.5, high: float = 0.9,
         out: Optional[Path] = None, prefix: str = "micro_main", z: float = 1.0, allow_edge: Sequence[str] = (),
         min_seeds: int = 2, candidates_dir: Optional[Path] = None,
         extension_prefix: Optional[str] = None) -> Tuned:
    """Collect dev records from `dirs`, choose every method's points, refuse (`Refused`) unequal budgets and picks at
    the edge of their grid that `allow_edge` does not name (module docstring), and (with `out`) write their point
    files and, next to them or in `candidates_dir`, the dev candidates as `<prefix>_candidates.csv`. A refusal at an
    edge names the extension round (`extension_round`); with `out` and `extension_prefix` it writes that round's
    point files as `<extension_prefix>_<method>_<i>.yaml` (and still refuses)."""
    table = collect(dirs).table
    if table.empty:
        raise ValueError(f"no complete records under {list(dirs)}")
    table = table[~table["method"].isin(earlier_definitions(table))]  # a point is chosen for a method that runs today
    choices = choose_points(table, reference, n_points, low, high)
    tuned = {c.method for cs in choices.values() for c in cs}
    unknown = sorted(set(allow_edge) - tuned)
    if unknown:
        raise ValueError(f"--allow-edge {' '.join(unknown)}: no such tuned method (tuned: {', '.join(sorted(tuned))})")
    lines = budget_check(table, reference, min_seeds)
    edges = grid_edges(table, choices)
    refused = [e for es in edges.values() for e in es if e.refused and e.method not in allow_edge]
    if refused:
        lines.append("picks at the edge of their grid (extend the grid beyond the edge and tune again, or let a "
                     "method through with --allow-edge METHOD):")
        for method in dict.fromkeys(e.method for e in refused):
            lines.append(f"  {method}: " + "; ".join(e.text() for e in refused if e.method == method))
        rounds = extension_round(table, choices, edges, allow_edge)
        for (bb, bench), new in rounds.items():
            per_method: dict[str, list[str]] = {}
            for c in new:
                per_method.setdefault(c.method, []).append(knob_text(c.knobs))
            n = max(len(v) for v in per_method.values())
            lines.append(f"the extension round on {bb}/{bench} ({n} new candidate(s) for every tuned method: beyond "
                         "the edge where refused, else beside the picks):")
            lines += [f"  {method}: " + " | ".join(texts)
                      + (f" (only {len(texts)}: no more values beside its picks)" if len(texts) < n else "")
                      for method, texts in per_method.items()]
        if out is not None and extension_prefix:
            if len(rounds) != 1:
                raise ValueError(f"extension points are written for one dev group at a time; the records hold "
                                 f"{sorted(rounds)}")
            lines += [f"wrote {path}" for path in write_extension(next(iter(rounds.values())), Path(out),
                                                                  extension_prefix)]
    if lines:
        raise Refused("tune refuses:\n" + "\n".join(lines))
    level_text = (f"levels {low:g} and {high:g} of the dev gain of {MT.parse_reference(reference).spec} over the "
                  "base model")
    threads = thread_counts(table)
    notes: dict[Choice, list[str]] = {}
    for group, es in edges.items():
        for e in es:
            if e.refused:
                c = next(c for c in choices[group] if (c.method, c.role, c.knobs) == (e.method, e.role, e.knobs))
                notes.setdefault(c, []).append(edge_note(e))
    written = write_points(choices, Path(out), prefix, level_text, threads, notes) if out is not None else []
    candidates = candidates_frame(table, choices, edges, allow_edge)
    folder = Path(candidates_dir) if candidates_dir is not None else (Path(out) if out is not None else None)
    path = None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{prefix}_candidates.csv"
        candidates.to_csv(path, index=False, lineterminator="\n", float_format="%.6g")
    return Tuned(choices_frame(choices), written, stability_frame(stability(table, reference, n_points, low, high, z)),
                 threads, [e for es in edges.values() for e in es], candidates, path)
