"""The ledger of test-split reads: one line in `<run_root>/test_reads.jsonl` (`suite_schema.layout.TEST_READS_NAME`)
for every evaluation on the test split, so a report can count how often each method's test numbers were looked at.

`log_read` is called when a run's evaluation STARTS reading the test split, before any metric is computed: a run
that crashes or is killed while evaluating has still read the split, and its line is already there. A dev-split
evaluation appends nothing. The line is appended atomically: one `os.write` of one whole line to a file opened with
`O_APPEND`, under an exclusive `flock` on that file, so concurrent jobs (SLURM array tasks sharing a run root) never
interleave; a kill leaves either the whole line or none. Should a line ever be cut short anyway (a full disk, a
crashed NFS client), the next append starts on a new line, and `analysis.read_ledger` skips and reports the torn one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from suite_schema import layout


def content_hash(benchmark: Any) -> str:
    """sha256 of the evaluation items of a benchmark's split as the run loaded them: its target problems and each
    retained domain's evaluation items (and far items, where a domain has them), as canonical JSON (sorted keys,
    domains by name). Item order counts; reading them again with the same data and config gives the same hash.
    Hundreds of small items: milliseconds."""
    content = {"split": benchmark.split, "target": benchmark.target_eval,
               "retained": {name: dom.evaluation for name, dom in sorted(benchmark.retained.items())}}
    far = {name: dom.far for name, dom in sorted(benchmark.retained.items()) if getattr(dom, "far", None)}
    if far:  # absent without far items, so the earlier world's hashes are unchanged
        content["retained_far"] = far
    blob = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def ledger_line(*, run_id: str, method: str, knobs: dict, train: dict, seed: int, backbone: str, benchmark: str,
                split: str, scales: Iterable[float], content_sha256: str, git_sha: Any, git_dirty: Any) -> dict:
    """One ledger line with every `layout.TEST_READ_FIELDS` key, stamped now (UTC)."""
    line = {"time": datetime.now(timezone.utc).isoformat(), "git_sha": git_sha, "git_dirty": git_dirty,
            "run_id": run_id, "method": method, "knobs": knobs, "train": train, "seed": seed, "backbone": backbone,
            "benchmark": benchmark, "split": split, "scales": [float(a) for a in scales],
            "content_sha256": content_sha256}
    assert tuple(line) == layout.TEST_READ_FIELDS
    return line


def append_line(path: Path, line: dict) -> None:
    """Append `line` as one JSON line to `path` (created if missing): one `os.write` under an exclusive `flock`; when
    the file does not end with a newline (a torn line), the write starts with one so the new line stays whole."""
    data = json.dumps(line, sort_keys=False, ensure_ascii=True, separators=(",", ":"), default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = "\n" + data
            raw = data.encode("ascii")
            written = os.write(fd, raw)
            if written != len(raw):
                raise OSError(f"{path}: wrote {written} of {len(raw)} bytes of a test-read line")
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def log_read(run_root: Path, line: dict) -> Path:
    """Append a test-split read to `<run_root>/test_reads.jsonl`; returns the ledger's path."""
    path = Path(run_root) / layout.TEST_READS_NAME
    append_line(path, line)
    return path
