"""Which runs a report may compare: within one group of its tables (a backbone and benchmark, `tables.group_label`),
every run must share the split evaluated, the benchmark's version (`schema.benchmark_version`), the backbone's weights
(`schema.backbone_version`) and the evaluation sizes (code problems, retained items per near and far domain).

`check` refuses a table where they differ, naming the first difference in one line; with `split=True` it instead
makes each combination a group of its own, its backbone label suffixed with what differs (`micro [30 code problems
/ 40 commonsense items / 40 math items]`). Post-hoc scale records share their training run's evaluation, so they
never differ here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis import schema

SPLIT_FLAG = "--split-incomparable"


def _n(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "?"
    return str(int(value))


def _domain_sizes(row: pd.Series, prefix: str) -> tuple[tuple[str, str], ...]:
    doms = sorted({c.split("/")[1] for c in row.index if c.startswith(prefix + "/") and c.endswith("/kind")
                   and pd.notna(row[c])})
    return tuple((d, _n(row.get(f"{prefix}/{d}/n"))) for d in doms)


def eval_sizes(row: pd.Series) -> tuple:
    """(code problems, ((near domain, items), ...), ((far domain, items), ...)) of one run; '?' where not recorded."""
    return (_n(row.get("target/n_problems")), _domain_sizes(row, "retained"), _domain_sizes(row, "retained_far"))


def sizes_text(sizes: tuple, short: bool = False) -> str:
    """`132 code problems / 250 commonsense items / 250 math items / far: 129 commonsense items`; `short`: numbers
    only (`132 / 250 / 250 / far: 129`)."""
    problems, near, far = sizes
    parts = [problems if short else f"{problems} code problems"]
    parts += [n if short else f"{n} {d} items" for d, n in near]
    parts += [("far: " if i == 0 else "") + (n if short else f"{n} {d} items") for i, (d, n) in enumerate(far)]
    return " / ".join(parts)


def first_difference(a: str, b: str) -> str:
    """The first key path (dotted, keys sorted) where two canonical JSON objects differ; '' when one is not an
    object."""
    x, y = json.loads(a), json.loads(b)
    path: list[str] = []
    while isinstance(x, dict) and isinstance(y, dict):
        key = next((k for k in sorted(set(x) | set(y)) if x.get(k, ABSENT) != y.get(k, ABSENT)), None)
        if key is None:
            break
        path.append(key)
        x, y = x.get(key, ABSENT), y.get(key, ABSENT)
    return ".".join(path)


def value_at(text: str, path: str) -> str:
    """The value at a dotted key path of a canonical JSON object, as short text (`<absent>` where it has none)."""
    v = json.loads(text)
    for key in path.split(".") if path else []:
        v = v.get(key, ABSENT) if isinstance(v, dict) else ABSENT
    shown = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return shown if len(shown) <= 60 else shown[:57] + "..."


ABSENT = "<absent>"
#: (what differs, as the error names it; the value of a run; the label of a group split off by it).
ASPECTS: tuple[tuple[str, Callable[[pd.Series], object], Callable[[object], str]], ...] = (
    ("split", lambda r: r["split"], lambda v: f"split {v}"),
    ("benchmark version (config.benchmark)", lambda r: r[schema.BENCHMARK_VERSION_COL],
     lambda v: f"benchmark {_digest(v)[:8]}"),
    ("backbone weights (config.backbone)", lambda r: r[schema.BACKBONE_VERSION_COL],
     lambda v: "weights " + ", ".join(f"{k}={x}" for k, x in sorted(json.loads(v).items()))),
    ("evaluation sizes", eval_sizes, sizes_text),
)


def _digest(text: str) -> str:
    return hashlib.sha256(str(text).encode()).hexdigest()


def _where(source: str) -> str:
    """A run's folder (a record file's parent), or its W&B source."""
    return source if source.startswith("wandb:") else str(Path(source).parent)


def _values(table: pd.DataFrame, value_of) -> pd.Series:
    return pd.Series([value_of(r) for _, r in table.iterrows()], index=table.index, dtype=object)


def _message(name: str, values: pd.Series, g: pd.DataFrame, where: str) -> str:
    """One line: the values that differ, most runs first (at most three), each with its run count and one run."""
    counts = values.map(str).value_counts(sort=False)
    first_of = {str(v): v for v in values}
    order = sorted(counts.index, key=lambda v: (-int(counts[v]), v))
    path = first_difference(order[0], order[1]) if name.startswith(("benchmark", "backbone")) else ""
    parts = []
    for i, key in enumerate(order[:3]):
        v = first_of[key]
        if name == "evaluation sizes":
            text = sizes_text(v, short=i > 0)
        elif name == "split":
            text = str(v)
        else:
            text = value_at(key, path)
        run = g.loc[values.map(str)[values.map(str) == key].index[0], "source"]
        parts.append(f"{text} ({int(counts[key])} runs, e.g. {_where(str(run))})")
    at = f" at {path}" if path else ""
    more = f" and {len(order) - 3} more" if len(order) > 3 else ""
    return (f"runs on {where} differ in {name}{at}: {' vs '.join(parts)}{more}; report them separately or pass "
            f"{SPLIT_FLAG}")


def check(table: pd.DataFrame, split: bool = False) -> pd.DataFrame:
    """`table` (complete runs, `schema.to_row` columns) when every (backbone, benchmark) group agrees on each of
    `ASPECTS`. Otherwise ValueError naming the first difference, or with `split` a copy in which each combination is a
    group of its own: its backbone suffixed `[what differs]`, its sweep and training keys made distinct."""
    from analysis.tables import group_label  # here: tables imports the analysis stack, this module stays light

    if table.empty:
        return table
    out = table.copy()
    changed = False
    for (bb, bench), g in table.groupby(["backbone", "benchmark"], sort=True):
        labels = pd.Series([""] * len(g), index=g.index, dtype=object)
        for name, value_of, label_of in ASPECTS:
            values = _values(g, value_of)
            if values.map(str).nunique() < 2:
                continue
            if not split:
                raise ValueError(_message(name, values, g, group_label(bb, bench)))
            labels = labels + values.map(lambda v: label_of(v) + "; ")
        if not (labels != "").any():
            continue
        changed = True
        suffix = labels.map(lambda t: f" [{t.rstrip('; ')}]")
        out.loc[g.index, "backbone"] = bb + suffix
        for col in ("sweep_key", "train_key"):
            out.loc[g.index, col] = [_digest(f"{k}|{s}")[:16] for k, s in zip(g[col], suffix)]
    return out if changed else table
