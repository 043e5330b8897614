"""The ledger of test-split reads (`suite_schema.layout.TEST_READS_NAME`), as `analysis report` reads it.

The runtime appends one line per evaluation on the test split when the evaluation starts reading it (so a crashed
run's read is counted). Here: find the ledger in or above each record folder given (a committed result folder keeps
it next to `records/`), read it (a torn last line, one without its newline, is skipped and reported; so is any line
that is no ledger line), count the reads per method and flag every read made before that method's final point or
code: a read whose (method, knobs, train steps and lr) is none of the points the report's records are at, or whose
commit (git sha and dirty flag) is none of the commits of the records at that point.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis import methods as M
from analysis import schema
from suite_schema import layout


@dataclass
class Ledger:
    """The reads of one or more ledger files and the lines skipped, with why."""

    paths: list[str] = field(default_factory=list)
    reads: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _shown(path: Path) -> str:
    """`path` relative to the working directory when inside it (reports name it as their command does), else absolute."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def find_ledgers(dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The ledger in or above each of `dirs` (a record file: its folder): the nearest one, looking no higher than the
    first folder holding `.git`. Each ledger once, sorted."""
    found: set[Path] = set()
    for d in dirs:
        here = Path(d).resolve()
        if here.is_file():
            here = here.parent
        for folder in (here, *here.parents):
            if (folder / layout.TEST_READS_NAME).is_file():
                found.add(folder / layout.TEST_READS_NAME)
                break
            if (folder / ".git").exists():
                break
    return sorted(found, key=str)


def read_file(path: Path, into: Optional[Ledger] = None) -> Ledger:
    """Every ledger line of `path`; a torn last line (no trailing newline) and lines that are not ledger lines are
    skipped and listed in `problems`."""
    ledger = into if into is not None else Ledger()
    shown = _shown(Path(path))
    ledger.paths.append(shown)
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            ledger.problems.append(f"{shown} line {number}: not JSON ({exc}); skipped")
            continue
        problem = layout.ledger_line_problem(line)
        if problem:
            ledger.problems.append(f"{shown} line {number}: not a ledger line ({problem}); skipped")
            continue
        ledger.reads.append(line)
    if torn.strip():
        ledger.problems.append(f"{shown} line {len(lines) + 1}: torn last line ({len(torn)} bytes without a newline: "
                               "a write cut short); skipped")
    return ledger


def read_ledgers(dirs: Sequence[str | os.PathLike]) -> Optional[Ledger]:
    """The reads of every ledger in or above `dirs` (`find_ledgers`); None when there is none."""
    paths = find_ledgers(dirs)
    if not paths:
        return None
    ledger = Ledger()
    for path in paths:
        read_file(path, ledger)
    return ledger


def method_of(read: dict) -> str:
    """The method a read counts for, named as the records' table names it (`schema.defined_method`)."""
    return schema.defined_method(read["method"], read["knobs"])


def train_key_of(read: dict) -> str:
    """The `train_key` of the point a read was made at (`schema.sweep_key` at scale 0, as the records' rows)."""
    knobs = schema.knobs_of({"knobs": read["knobs"], "config": {"train": read.get("train") or {}}})
    benchmark = read["benchmark"]
    split = read.get("split")
    if split and not benchmark.endswith(f"@{split}"):
        benchmark = layout.benchmark_label(benchmark, split)
    return schema.sweep_key(method_of(read), read["backbone"], benchmark, knobs, 0.0)


def _commit(sha, dirty) -> tuple[str, Optional[bool]]:
    missing = sha is None or (isinstance(sha, float) and pd.isna(sha))
    return ("unknown" if missing else str(sha),
            bool(dirty) if isinstance(dirty, (bool, int)) and not pd.isna(dirty) else None)


def _commit_text(commit: tuple[str, Optional[bool]]) -> str:
    sha, dirty = commit
    return sha[:12] + (" (uncommitted changes)" if dirty else " (dirty flag unknown)" if dirty is None else "")


def flags(reads: Sequence[dict], table: pd.DataFrame) -> list[tuple[dict, str]]:
    """(read, why) for every read made before its method's final point or code: no complete record of `table` is at
    the read's point (method, knobs, train steps and lr, backbone, benchmark), or none at that point was made at the
    read's commit."""
    out = []
    keys = table["train_key"] if "train_key" in table.columns else pd.Series([], dtype=object)
    for read in reads:
        key = train_key_of(read)
        at = table[keys == key]
        if at.empty:
            out.append((read, "read at a point (knobs) none of the report's records is at"))
            continue
        commits = {_commit(s, d) for s, d in zip(at.get("provenance/git_sha", [None] * len(at)),
                                                  at.get("provenance/git_dirty", [None] * len(at)))}
        mine = _commit(read.get("git_sha"), read.get("git_dirty"))
        if mine not in commits:
            out.append((read, f"read at commit {_commit_text(mine)}; the records at that point were made at "
                              + ", ".join(_commit_text(c) for c in sorted(commits, key=str))))
    return out


def index_lines(ledger: Optional[Ledger], table: pd.DataFrame, md) -> list[str]:
    """The report's `## Test reads` section: the reads per method, each flagged read, each skipped line."""
    lines = ["## Test reads", ""]
    if ledger is None:
        return lines + [f"No test-read ledger (`{layout.TEST_READS_NAME}`) in or above the record folders given.", ""]
    flagged = flags(ledger.reads, table)
    lines.append(f"Ledger: {', '.join(f'`{md(p)}`' for p in ledger.paths)}: {len(ledger.reads)} test-split reads "
                 f"(one per evaluation on the test split, logged when it starts); {len(flagged)} flagged (made before "
                 "the method's final point or code).")
    lines.append("")
    if ledger.reads:
        per = pd.Series([method_of(r) for r in ledger.reads])
        bad = pd.Series([method_of(r) for r, _ in flagged], dtype=object)
        contents = {}
        for r in ledger.reads:
            contents.setdefault(method_of(r), set()).add(r.get("content_sha256"))
        lines += ["| Method | Test reads | Flagged | Split contents read |", "|:---|---:|---:|---:|"]
        for method in M.ordered(per.unique()):
            lines.append(f"| {md(method)} | {int((per == method).sum())} | {int((bad == method).sum())} "
                         f"| {len(contents[method])} |")
        lines.append("")
    if flagged:
        lines += ["Flagged reads:", ""]
        for read, why in sorted(flagged, key=lambda f: (str(f[0].get("time")), str(f[0].get("run_id")))):
            lines.append(f"- {md(read.get('time'))} {md(method_of(read))} run `{md(read.get('run_id'))}` seed "
                         f"{md(read.get('seed'))}: {md(why)}")
        lines.append("")
    if ledger.problems:
        lines += ["Skipped ledger lines:", ""] + [f"- {md(p)}" for p in ledger.problems] + [""]
    return lines
