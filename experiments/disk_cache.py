"""Keyed, locked, atomic on-disk caches of statistics computed once and shared by every run of a sweep.

A cache entry is a folder `<root>/<prefix>-<slug>-<key[:24]>/` holding the statistic's files and a
`manifest.json`, written last, whose `key` field is the full key and whose `files` field holds the
sha256 of every other file. Every load verifies them (`check_entry`): an entry whose files are missing,
truncated or altered is reported in one line naming its path and rebuilt under the lock, never read.
`get_or_build` returns a complete entry for the
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
import logging
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

MANIFEST = "manifest.json"
log = logging.getLogger("suite.cache")


def sha256_of(obj: Any) -> str:
    """sha256 of bytes, or of the canonical JSON of a JSON-able object (keys sorted)."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def entry_path(root: Path, prefix: str, label: str, key: str) -> Path:
    """`<root>/<prefix>-<slug of label>-<key[:24]>`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._")[-48:] or "entry"
    return Path(root) / f"{prefix}-{slug}-{key[:24]}"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but the manifest, by path relative to it (sorted). Files added to an
    entry after it was built (e.g. lm-eval's base numbers next to the reference cache) are not part of it."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")}


#: `check_entry` results that are not problems: the entry is usable, or there is none for this key.
OK, ABSENT = "ok", "absent"


def check_entry(path: Path, key: str) -> str:
    """`OK` when `path` holds an entry for exactly `key` whose files match their manifest checksums; `ABSENT`
    when there is no entry there (or one for another key); otherwise a one-line description of what is wrong."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        return ABSENT
    try:
        manifest = json.loads(manifest_path.read_text())
        stored_key = manifest["key"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST} ({type(exc).__name__})"
    if stored_key != key:
        return ABSENT
    expected = manifest.get("files")
    if not isinstance(expected, dict):
        return "no file checksums in its manifest (written before entries were verified)"
    for name, digest in sorted(expected.items()):
        if not (path / name).is_file():
            return f"{name} is missing"
        if file_sha256(path / name) != digest:
            return f"{name} does not match its checksum (truncated or altered)"
    return OK


def is_complete(path: Path, key: str) -> bool:
    """True when `path` holds a verified entry for exactly `key` (see `check_entry`)."""
    return check_entry(path, key) == OK


def usable(path: Path, key: str, what: str) -> bool:
    """`is_complete`, reporting a broken entry in one warning line naming its path (the caller rebuilds it)."""
    status = check_entry(path, key)
    if status not in (OK, ABSENT):
        log.warning("%s %s is broken: %s; rebuilding it", what, path, status)
    return status == OK


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
    The manifest records `key`, `components` (what the key hashes, for humans), `build_s`, `created` and
    `files` (the checksums). An entry under `path` with another key, or a broken one, is replaced.
    """
    path = Path(path)
    if usable(path, key, "cache entry"):
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
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra, "files": file_checksums(tmp)}
            (tmp / f"{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=1, default=str))
            os.replace(tmp / f"{MANIFEST}.tmp", tmp / MANIFEST)
            if path.exists():  # a stale or foreign entry under this name
                shutil.rmtree(path)
            os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return CacheEntry(path, manifest, {"hit": False, "lock_wait_s": waited})
