"""Gather result records into one table: from run directories (recursively) and optionally from W&B.

Only complete, well-formed records become rows. Everything else is listed in `Collection.skipped`
with the reason: failed runs with their error message, interrupted and running runs, run
directories without a record, malformed files (unparseable JSON, missing keys, wrong types) and
duplicates of a run id already taken from another place.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import pandas as pd
from tqdm.auto import tqdm

from analysis import schema
from suite_schema import layout
from suite_schema.layout import find_records

# W&B run states -> record status.
WANDB_STATES = {
    "finished": layout.STATUS_COMPLETE,
    "running": layout.STATUS_RUNNING,
    "pending": layout.STATUS_RUNNING,
    "preempting": layout.STATUS_INTERRUPTED,
    "preempted": layout.STATUS_INTERRUPTED,
    "crashed": layout.STATUS_FAILED,
    "failed": layout.STATUS_FAILED,
    "killed": layout.STATUS_FAILED,
}


_RUN_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class Skipped:
    """A run left out of the table and why."""

    source: str
    kind: str             # failed | interrupted | running | no record | malformed | duplicate
    reason: str
    run_id: Optional[str] = None
    method: Optional[str] = None
    seed: Optional[int] = None


@dataclass
class Collection:
    """The table of complete runs (one row per run id) and the runs left out."""

    table: pd.DataFrame
    skipped: list[Skipped] = field(default_factory=list)
    n_sources: int = 0    # record files and W&B runs read

    def skipped_frame(self) -> pd.DataFrame:
        cols = ["source", "kind", "reason", "run_id", "method", "seed"]
        return pd.DataFrame([asdict(s) for s in self.skipped], columns=cols)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.skipped:
            out[s.kind] = out.get(s.kind, 0) + 1
        return dict(sorted(out.items()))


@dataclass
class _Entry:
    source: str
    local: bool
    record: Optional[dict]
    problem: Optional[str]


def _one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _read(path: Path) -> _Entry:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return _Entry(source, True, None, f"cannot read: {_one_line(exc)}")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return _Entry(source, True, None, f"unparseable JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    return _Entry(source, True, record, layout.validate(record))


def _unwrap_config(config: Any) -> dict:
    """W&B config as a plain mapping (values may come wrapped as {'value': v, 'desc': ...})."""
    config = dict(config or {})
    out = {}
    for key, value in config.items():
        if key.startswith("_wandb"):
            continue
        if isinstance(value, dict) and set(value) <= {"value", "desc"} and "value" in value:
            value = value["value"]
        out[key] = value
    return out


def unflatten(flat: dict, sep: str = "/") -> dict:
    """{'a/b': 1, 'c': {'d': 2}} -> {'a': {'b': 1}, 'c': {'d': 2}} (nested values merged)."""
    out: dict = {}
    for key, value in flat.items():
        parts = str(key).split(sep)
        node = out
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        if isinstance(value, dict):
            value = unflatten(value, sep)
            existing = node.get(parts[-1])
            if isinstance(existing, dict):
                existing.update(value)
                continue
        node[parts[-1]] = value
    return out


def _summary_of(run: Any) -> dict:
    summary = getattr(run, "summary_metrics", None)
    if isinstance(summary, dict):
        return dict(summary)
    summary = getattr(run, "summary", None) or {}
    raw = getattr(summary, "_json_dict", None)
    return dict(raw if isinstance(raw, dict) else summary)


def record_from_wandb(run: Any) -> dict:
    """A record built from a W&B run: id, state, config (the run's resolved config), and the summary
    fields `metrics/...` and `cost/...` (flat W&B keys or nested mappings)."""
    config = _unwrap_config(getattr(run, "config", None))
    summary = unflatten(_summary_of(run))
    state = str(getattr(run, "state", ""))
    status = WANDB_STATES.get(state, state)
    method_cfg = config.get("method") if isinstance(config.get("method"), dict) else {}

    def name_of(group: str) -> Any:
        node = config.get(group)
        return node.get("name") if isinstance(node, dict) else node

    record: dict[str, Any] = {
        "schema_version": 1,
        "run_id": getattr(run, "id", None),
        "status": status,
        "method": method_cfg.get("name"),
        "backbone": name_of("backbone"),
        "benchmark": name_of("benchmark"),
        "seed": config.get("seed"),
        "knobs": {k: v for k, v in method_cfg.items() if k != "_target_"},
        "config": config,
        "metrics": summary.get("metrics"),
        "cost": summary.get("cost"),
        "train": None,
        "provenance": {},
    }
    if "scale" in summary:
        record["scale"] = summary["scale"]
    if status == layout.STATUS_FAILED:
        record["error"] = {"type": "wandb", "message": f"W&B run state {state!r} (the error message is in the run's logs)"}
    return record


def _read_wandb(paths: Sequence[str], api: Any) -> list[_Entry]:
    if not paths:
        return []
    if api is None:
        # here, not at the top: only --wandb needs it, and wandb takes a second to import
        import wandb

        api = wandb.Api()
    out = []
    for path in paths:
        for run in api.runs(path):
            source = f"wandb:{path}/{getattr(run, 'id', '?')}"
            try:
                record = record_from_wandb(run)
            except Exception as exc:  # a W&B run in an unexpected shape is listed, never fatal
                out.append(_Entry(source, False, None, f"cannot read W&B run: {_one_line(exc)}"))
                continue
            out.append(_Entry(source, False, record, layout.validate(record)))
    return sorted(out, key=lambda e: e.source)


def _skip_of(entry: _Entry, kind: str, reason: str) -> Skipped:
    rec = entry.record if isinstance(entry.record, dict) else {}
    run_id = rec.get("run_id") if isinstance(rec.get("run_id"), str) else None
    method = rec.get("method") if isinstance(rec.get("method"), str) else None
    seed = rec.get("seed") if layout.is_int(rec.get("seed")) else None
    return Skipped(entry.source, kind, reason, run_id, method, seed)


def _reason_not_complete(record: dict) -> tuple[str, str]:
    status = record["status"]
    if status == layout.STATUS_FAILED:
        err = record.get("error") if isinstance(record.get("error"), dict) else {}
        etype = err.get("type") or "error"
        message = err.get("message")
        return status, _one_line(f"{etype}: {message}" if message else f"{etype} (no error message recorded)")
    if status == layout.STATUS_INTERRUPTED:
        info = record.get("interrupted") if isinstance(record.get("interrupted"), dict) else {}
        step = info.get("step")
        why = info.get("reason")
        text = "interrupted" + (f" at step {step}" if step is not None else "") + (f": {why}" if why else "")
        return status, _one_line(text + " (incomplete; resume it to finish)")
    return status, "still running (incomplete)"


#: The skip kind of a complete duplicate whose metrics differ from the record used: the same science measured
#: twice with different results (a changed harness, nondeterminism, an edited record) is worth a look.
DISAGREEING = "duplicate, disagrees"


def _disagreement(used: dict, other: dict) -> Optional[str]:
    """How a complete duplicate's metrics differ from the used record's, or None when they agree (or either is
    not complete)."""
    if used.get("status") != layout.STATUS_COMPLETE or other.get("status") != layout.STATUS_COMPLETE:
        return None
    a, b = used.get("metrics"), other.get("metrics")
    if a == b:
        return None

    def fig(m: Any, *path: str) -> str:
        for key in path:
            m = m.get(key) if isinstance(m, dict) else None
        return f"{m:.4g}" if isinstance(m, (int, float)) else "?"

    return (f"its metrics differ from the used record's (pass@1 {fig(b, 'target', 'pass@1')} vs "
            f"{fig(a, 'target', 'pass@1')}, retained KL {fig(b, 'retained_kl_mean')} vs {fig(a, 'retained_kl_mean')})")


def _end_time(entry: _Entry) -> str:
    prov = entry.record.get("provenance") if isinstance(entry.record, dict) else None
    value = prov.get("end_time") if isinstance(prov, dict) else None
    return value if isinstance(value, str) else ""


def collect(
    dirs: Sequence[str | os.PathLike] = (),
    wandb_paths: Sequence[str] = (),
    api: Any = None,
    progress: bool = False,
) -> Collection:
    """Read every record under `dirs` and every run of the W&B projects `wandb_paths` ("entity/project").

    `api` replaces `wandb.Api()` (anything with `.runs(path)` yielding objects with `id`, `state`,
    `config` and `summary_metrics` or `summary`). Duplicate run ids keep one record: a complete one
    before any other, a local file before W&B, then the latest `provenance.end_time`, then the
    first source in sorted order; the others are listed as duplicates.
    """
    record_paths, bare_dirs = find_records(dirs)
    # A bar on a terminal only: off one its redraws would pile up in the file, and reading records is quick (the
    # report prints its counts as a plain line).
    entries = [_read(p) for p in tqdm(record_paths, desc="records", unit="record",
                                      disable=not progress or not record_paths or not _on_terminal(sys.stderr))]
    entries += _read_wandb(list(wandb_paths), api)

    skipped: list[Skipped] = []
    by_id: dict[str, list[_Entry]] = {}
    for entry in entries:
        if entry.problem is not None:
            skipped.append(_skip_of(entry, "malformed", entry.problem))
            continue
        by_id.setdefault(entry.record["run_id"], []).append(entry)

    rows = []
    for run_id in sorted(by_id):
        group = sorted(by_id[run_id], key=lambda e: e.source)
        group.sort(key=_end_time, reverse=True)
        group.sort(key=lambda e: not e.local)
        group.sort(key=lambda e: e.record["status"] != layout.STATUS_COMPLETE)
        keep, rest = group[0], group[1:]
        for other in rest:
            what = f"{other.record['status']} record" if other.record["status"] != keep.record["status"] else "record"
            reason = f"{what} of run id {run_id} also at {keep.source}, which is used"
            differs = _disagreement(keep.record, other.record)
            skipped.append(_skip_of(other, DISAGREEING if differs else "duplicate",
                                    f"{reason}; {differs}" if differs else reason))
        if keep.record["status"] == layout.STATUS_COMPLETE:
            rows.append(schema.to_row(keep.record, keep.source))
        else:
            kind, reason = _reason_not_complete(keep.record)
            skipped.append(_skip_of(keep, kind, reason))

    for d in bare_dirs:
        skipped.append(Skipped(str(d), "no record", "run directory without record.json (still running, or killed "
                               "before any record was written)", d.name if _RUN_ID.fullmatch(d.name) else None, None, None))

    skipped.sort(key=lambda s: (s.kind, s.source))
    return Collection(table=make_table(rows), skipped=skipped, n_sources=len(entries))


FIRST_COLUMNS = ("run_id", "method", "backbone", "benchmark", "seed", schema.SCALE_COL, "sweep_key", "train_key")


def make_table(rows: Iterable[dict]) -> pd.DataFrame:
    """Rows as a DataFrame with a stable column order (identity, knobs, metrics, costs, provenance)."""
    rows = list(rows)
    cols: set[str] = set()
    for r in rows:
        cols.update(r)
    first = [c for c in FIRST_COLUMNS if c in cols or not rows]
    rank = {"knob/": 0, "target/": 1, schema.KL_MEAN_COL: 2, "retained/": 3, "cost/": 4, "train/": 5}

    def order(c: str) -> tuple:
        for prefix, r in rank.items():
            if c.startswith(prefix):
                return (r, c)
        return (9, c)

    rest = sorted((c for c in cols if c not in first), key=order)
    df = pd.DataFrame(rows, columns=first + rest)
    if len(df):
        df = df.sort_values(["backbone", "benchmark", "method", "sweep_key", "seed", "run_id"], kind="mergesort")
    return df.reset_index(drop=True)


def thread_counts(table: pd.DataFrame) -> dict[int, int]:
    """Intra-op thread count -> how many rows of a record table were trained with it (`cost.threads`; records from
    before that field have none and are not counted). The count changes the order of float sums, so runs of one
    config made with different counts differ by rounding that training amplifies (docs/slurm.md)."""
    if "cost/threads" not in table.columns:
        return {}
    counts = table["cost/threads"].dropna().astype(int).value_counts().sort_index()
    return {int(t): int(n) for t, n in counts.items()}


def machine_counts(table: pd.DataFrame) -> dict[str, int]:
    """Machine (CPU model / vector ISA / CUDA device, `provenance.machine`) -> how many rows of a record table were
    made on it; records from before that field are not counted. Float kernels differ between machines, so one config
    run on two of them differs by rounding that training amplifies."""
    if "provenance/machine" not in table.columns:
        return {}
    counts = table["provenance/machine"].dropna().value_counts().sort_index()
    return {str(m): int(n) for m, n in counts.items()}


def threads_text(counts: dict[int, int], unit: str = "records") -> str:
    """'2 intra-op thread(s)' for one count, '1 thread(s): 20 records, 2 thread(s): 13 records' for several."""
    if len(counts) == 1:
        return f"{next(iter(counts))} intra-op thread(s)"
    return ", ".join(f"{t} thread(s): {n} {unit}" for t, n in counts.items())


def _column_for_file(series: pd.Series) -> pd.Series:
    """An object column with mixed value types as text (parquet stores one type per column)."""
    if series.dtype != object:
        return series
    types = {type(v) for v in series if v is not None and not (isinstance(v, float) and v != v)}
    if len(types) <= 1:
        return series
    return series.map(lambda v: None if v is None else (json.dumps(v) if not isinstance(v, str) else v))


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the table as parquet (`.parquet`/`.pq`) or CSV (anything else)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = df.apply(_column_for_file)
    if path.suffix in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False, lineterminator="\n")
    return path


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a table written by `write_table`."""
    path = Path(path)
    if path.suffix in (".parquet", ".pq"):
        return pd.read_parquet(path)
    return pd.read_csv(path)


def _on_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
