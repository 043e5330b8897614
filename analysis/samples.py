"""What a method changed, item by item: a deterministic sample of one run's stored outputs per method.

A run directory (the folder of its `record.json`) holds `code_samples.json` (every code completion with its sandbox
verdict) and, for runs made since they are stored, `retained_samples.json` (per retained item the base and the
adapted answer or choice). Per backbone, benchmark and method, one run is shown (`sample_run`): the primary level's
chosen sweep point on the lowest seed reaching it, else the lowest seed's scale-1 run; from it, up to `n` changed
items per retained set and domain and up to `n` code completions, passed and failed alternating.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from analysis import methods as M
from analysis.pareto import DOMAIN_ORDER
from analysis.schema import SCALE_COL
from suite_schema import layout
from suite_schema.retained_samples import read_retained_samples

DEFAULT_SAMPLES = 5
NOT_RECORDED = "not recorded for this run (made before retained samples were stored)"
CODE_NOT_RECORDED = "not recorded for this run (made before code completions were stored)"
NOT_A_FOLDER = "not stored for runs read from W&B (only run folders keep their samples)"


def check_samples(n) -> None:
    """ValueError `samples=<n> is not allowed: ...` unless `n` is a whole number >= 0 (items shown per group)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"samples={n!r} is not allowed: a whole number >= 0 of items shown per method and group")


def read_code_samples(run_dir: Path) -> Optional[list[dict]]:
    """The run's `code_samples.json` (one dict per completion), or None when the run has none."""
    path = Path(run_dir) / layout.CODE_SAMPLES_NAME
    if not path.is_file():
        return None
    return _json_list(path)


def _json_list(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({' '.join(str(exc).split())})") from None
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ValueError(f"{path}: not a JSON list of objects")
    return data


@dataclass
class RetainedGroup:
    set: str
    domain: str
    kind: str
    n_items: int
    n_changed: int
    shown: list[dict]


@dataclass
class MethodSamples:
    backbone: str
    benchmark: str
    method: str
    run_id: str
    seed: int
    scale: float
    source: str
    why: str                                  # how this run was chosen
    retained: list[RetainedGroup] = field(default_factory=list)
    retained_note: Optional[str] = None       # why no retained samples are shown
    code: list[dict] = field(default_factory=list)
    code_counts: dict = field(default_factory=dict)  # kind -> (passed, total)
    code_note: Optional[str] = None


def retained_groups(items: list[dict], n: int) -> list[RetainedGroup]:
    """Per retained set (near first) and domain (the tables' order): item and changed counts and the first `n` changed
    items by index."""
    by: dict[tuple[str, str], list[dict]] = {}
    for it in items:
        by.setdefault((str(it.get("set", "near")), str(it.get("domain", "?"))), []).append(it)
    out = []
    def order(key: tuple[str, str]) -> tuple:
        s, dom = key
        return s != "near", s, DOMAIN_ORDER.index(dom) if dom in DOMAIN_ORDER else len(DOMAIN_ORDER), dom

    for (s, dom), group in sorted(by.items(), key=lambda kv: order(kv[0])):
        group = sorted(group, key=lambda it: int(it.get("index", 0)))
        moved = [it for it in group if it["changed"]]
        out.append(RetainedGroup(s, dom, str(group[0].get("kind", "math")), len(group), len(moved), moved[:n]))
    return out


def code_sample(samples: list[dict], n: int) -> list[dict]:
    """Up to `n` completions, greedy ones first, passed and failed alternating (each in file order)."""
    ordered = sorted(samples, key=lambda s: s.get("kind") != "greedy")  # stable: keeps file order within a kind
    passed = [s for s in ordered if s.get("status") == "passed"]
    failed = [s for s in ordered if s.get("status") != "passed"]
    out = []
    while len(out) < n and (passed or failed):
        for pool in (passed, failed):
            if pool and len(out) < n:
                out.append(pool.pop(0))
    return out


def sample_run(runs: pd.DataFrame, matched_seed: pd.DataFrame, level_spec: str) -> tuple[pd.Series, str]:
    """The run of one method on one backbone and benchmark (`runs`) whose samples are shown, and why: the sweep
    point `level_spec` chose on the lowest seed reaching it (`matched_seed`), else the lowest seed at scale 1 (any
    scale when none is at 1); ties by record path."""
    m = matched_seed
    if len(m):
        m = m[(m["level_spec"] == level_spec) & m["reached"].astype(bool)].sort_values("seed")
    for _, r in m.iterrows():
        hit = runs[(runs["sweep_key"] == r["sweep_key"]) & (runs["seed"] == r["seed"])].sort_values("source")
        if len(hit):
            return hit.iloc[0], f"the point chosen at `{level_spec}` on seed {int(r['seed'])}"
    at_one = runs[runs[SCALE_COL] == 1.0] if SCALE_COL in runs.columns else runs
    pool = at_one if len(at_one) else runs
    row = pool.sort_values(["seed", "source"]).iloc[0]
    return row, f"seed {int(row['seed'])}" + (" at scale 1" if len(at_one) else "")


def method_samples(runs: pd.DataFrame, matched_seed: pd.DataFrame, level_spec: str,
                   n: int = DEFAULT_SAMPLES) -> list[MethodSamples]:
    """Per backbone, benchmark and method (in the tables' order): one run's sample of changed retained items and
    code completions (`sample_run`, `retained_groups`, `code_sample`), or a note saying why there is none."""
    check_samples(n)
    out = []
    if runs.empty:
        return out
    for (bb, bench), g in runs.groupby(["backbone", "benchmark"], sort=True):
        for method in M.ordered(g["method"].unique()):
            gm = g[g["method"] == method]
            ms = matched_seed[(matched_seed["backbone"] == bb) & (matched_seed["benchmark"] == bench)
                              & (matched_seed["method"] == method)] if len(matched_seed) else matched_seed
            row, why = sample_run(gm, ms, level_spec)
            out.append(_fill(MethodSamples(bb, bench, method, str(row["run_id"]), int(row["seed"]),
                                           float(row.get(SCALE_COL, 1.0)), str(row["source"]), why), n))
    return out


def _fill(s: MethodSamples, n: int) -> MethodSamples:
    if s.source.startswith("wandb:"):
        s.retained_note = s.code_note = NOT_A_FOLDER
        return s
    run_dir = Path(s.source).parent
    try:
        items = read_retained_samples(run_dir)
        if items is None:
            s.retained_note = NOT_RECORDED
        else:
            s.retained = retained_groups(items, n)
    except ValueError as exc:
        s.retained_note = str(exc)
    try:
        code = read_code_samples(run_dir)
        if code is None:
            s.code_note = CODE_NOT_RECORDED
        else:
            s.code = code_sample(code, n)
            for kind in sorted({str(c.get("kind")) for c in code}):
                of = [c for c in code if str(c.get("kind")) == kind]
                s.code_counts[kind] = (sum(c.get("status") == "passed" for c in of), len(of))
    except ValueError as exc:
        s.code_note = str(exc)
    return s


def value_text(value: Any) -> str:
    """A stored answer as text (None as an em dash)."""
    return "—" if value is None else str(value)
