"""Re-running runs made by older code: `rerun_before=<commit>`.

The run id hashes the config, not the code, so a record made by older method code is found and reused
as it is. With `rerun_before=<commit>` a run whose record (complete, interrupted or failed) was made by a
commit that is an ancestor of <commit>, by a commit this checkout does not know, or by code of unknown
version, is run again from scratch: its records move to `<run_dir>/superseded/<sha12>/` (kept for reference;
analysis does not read them) and every other output of the earlier attempt (checkpoints, exports, method
statistics, post-hoc scale records) is removed, so nothing computed by the older code is resumed or reused.
A record made by <commit> itself or by a later commit is kept.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from experiments import records
from experiments.run_lock import LOCK_NAME
from suite_schema import layout

#: What a re-run keeps in the run directory: Hydra's files of this launch, the run's log, earlier superseded records
#: and the run's lock file (held by this launch: removing it would let another launch lock a new file).
KEEP = (".hydra", "run.log", layout.SUPERSEDED_DIR, LOCK_NAME)
#: A commit sha as git writes it (SHA-1 or SHA-256, abbreviated to at least 7 digits).
SHA = re.compile(r"[0-9a-f]{7,64}")


def resolve_commit(commit: str) -> Optional[str]:
    """The full sha of `commit` (a sha, tag or branch of this checkout), or None when git cannot resolve it."""
    return records.git_output("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")


def recorded_sha(record: dict) -> str | None:
    """The record's `provenance.git_sha` where it is a commit sha (hex digits), else None: a record may hold anything,
    and the sha names a folder (`superseded/<sha12>`) and is handed to git."""
    sha = records.part(record, "provenance").get("git_sha")
    return sha if isinstance(sha, str) and SHA.fullmatch(sha) else None


def stale_reason(run_dir: Path, commit: str) -> Optional[str]:
    """Why the record in `run_dir` counts as made by code older than `commit` (a full sha), or None when it does
    not (no record, or made by `commit` or a later commit)."""
    record = records.read_record(run_dir)
    if record is None:
        return None
    sha = recorded_sha(record)
    if sha is None:
        return "its record has no code version"
    if sha == commit:
        return None
    if records.git_output("cat-file", "-e", f"{sha}^{{commit}}") is None:
        return f"its record was made by commit {sha[:12]}, which this checkout does not know"
    if records.git_output("merge-base", "--is-ancestor", sha, commit) is not None:
        return f"its record was made by commit {sha[:12]}, older than {commit[:12]}"
    return None


def requested(rerun_before: Optional[str], run_dir: Path) -> Optional[str]:
    """Why `rerun_before` (the config's value; None = never) asks for the run in `run_dir` to be made again, or
    None (no such request, or its record is not older)."""
    if rerun_before is None:
        return None
    return stale_reason(run_dir, resolve_commit(str(rerun_before)) or str(rerun_before))


def supersede(run_dir: Path) -> Path:
    """Move the run's records (its own and every post-hoc scale's, with any set aside as unreadable) to
    `<run_dir>/superseded/<sha12>/` (`unknown` where the record names no commit sha) and remove every other output
    of it except `KEEP`; return the folder the records went to."""
    run_dir = Path(run_dir)
    sha = (recorded_sha(records.read_record(run_dir) or {}) or "unknown")[:12]
    dest = run_dir / layout.SUPERSEDED_DIR / sha
    n = 1
    while dest.exists():
        n += 1
        dest = run_dir / layout.SUPERSEDED_DIR / f"{sha}-{n}"
    dest.mkdir(parents=True)
    found = [p for pattern in (f"{layout.RECORD_NAME}*", f"{layout.SCALES_DIR}/*/{layout.RECORD_NAME}*")
             for p in sorted(run_dir.glob(pattern))]
    for path in found:
        target = dest / path.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.replace(target)
    for entry in sorted(run_dir.iterdir()):
        if entry.name in KEEP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return dest
