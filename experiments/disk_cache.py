"""Keyed, locked, atomic on-disk caches of statistics computed once and shared by every run of a sweep.

A cache entry is a folder `<root>/<prefix>-<slug>-<key[:24]>/` holding the statistic's files and a
`manifest.json` whose `key` field is the full key. `get_or_build` returns a complete entry for the
key, building it first when none exists: the build runs under an exclusive `fcntl` lock on
`<entry>.lock` (concurrent runs of a sweep build once; the others wait, then load), writes into a
temporary sibling folder and moves it into place with `os.replace`, so a reader never sees a
half-written entry and a crash mid-build leaves nothing under the final name.

The same protocol as the reference cache (`experiments.evaluation.reference_cache`); methods use it
for statistics of the frozen base such as EWC's Fisher.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

MANIFEST = "manifest.json"


def sha256_of(obj: Any) -> str:
    """sha256 of bytes, or of the canonical JSON of a JSON-able object (keys sorted)."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def entry_path(root: Path, prefix: str, label: str, key: str) -> Path:
    """`<root>/<prefix>-<slug of label>-<key[:24]>`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._")[-48:] or "entry"
    return Path(root) / f"{prefix}-{slug}-{key[:24]}"


def is_complete(path: Path, key: str) -> bool:
    """True when `path` holds a manifest written for exactly `key`."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[float]:
    """Hold an exclusive `fcntl` lock on `lock_path` (created if needed); yields the seconds spent waiting."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        t0 = time.perf_counter()
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - t0
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass
class CacheEntry:
    """A complete cache entry: its folder, manifest, and how it was obtained (`hit`, `build_s`, `lock_wait_s`)."""

    path: Path
    manifest: dict
    stats: dict = field(default_factory=dict)


def get_or_build(
    path: Path,
    key: str,
    build: Callable[[Path], Optional[dict]],
    components: Optional[dict] = None,
) -> CacheEntry:
    """The complete entry at `path` for `key`, built by `build(tmp_folder)` under the lock when missing.

    `build` writes its files into the folder it is given and may return extra manifest fields.
    The manifest records `key`, `components` (what the key hashes, for humans), `build_s` and
    `created`. An entry under `path` with another key is replaced.
    """
    path = Path(path)
    if is_complete(path, key):
        return CacheEntry(path, json.loads((path / MANIFEST).read_text()), {"hit": True, "lock_wait_s": 0.0})
    with exclusive_lock(path.parent / f"{path.name}.lock") as waited:
        if is_complete(path, key):  # another process built it while we waited
            return CacheEntry(path, json.loads((path / MANIFEST).read_text()), {"hit": True, "lock_wait_s": waited})
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            extra = build(tmp) or {}
            manifest = {"key": key, "components": components or {}, "build_s": time.perf_counter() - t0,
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
            (tmp / f"{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=1, default=str))
            os.replace(tmp / f"{MANIFEST}.tmp", tmp / MANIFEST)
            if path.exists():  # a stale or foreign entry under this name
                shutil.rmtree(path)
            os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return CacheEntry(path, manifest, {"hit": False, "lock_wait_s": waited})
