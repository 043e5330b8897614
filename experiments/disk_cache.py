"""Keyed, locked, atomic on-disk caches of statistics computed once and shared by every run of a sweep.

A cache entry is a folder `<root>/<prefix>-<slug>-<key[:24]>/` holding the statistic's files and a
`manifest.json`, written last, whose `key` field is the full key, whose `files` field holds the
sha256 of every other file and whose `manifest_sha256` field the sha256 of the manifest's own other fields.
Every load verifies them (`check_entry`): an entry whose files or manifest are missing, truncated or altered is
reported in one line naming its path and rebuilt under the lock, never read.
`get_or_build` returns a complete entry for the
key, building it first when none exists: the build runs under an exclusive `fcntl` lock on
`<entry>.lock` (concurrent runs of a sweep build once; the others wait, then load), writes into a
temporary sibling folder `.<entry>.tmp-<pid>` and moves it into place with `os.replace`, so a reader never sees
a half-written entry and a crash mid-build leaves nothing under the final name; the next build removes the
temporary folders of processes that are gone (`remove_dead_builds`).

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
#: The manifest's field holding the sha256 of the canonical JSON of its other fields (`seal`).
MANIFEST_DIGEST = "manifest_sha256"
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


def seal(manifest: dict) -> dict:
    """`manifest` as JSON stores it (a JSON round trip), with `MANIFEST_DIGEST`: the sha256 of its other fields'
    canonical JSON. What a load reads from a manifest is thereby covered as its files are by `files`."""
    body = json.loads(json.dumps(manifest, default=str))
    body.pop(MANIFEST_DIGEST, None)
    return {**body, MANIFEST_DIGEST: sha256_of(body)}


def write_manifest(folder: Path, manifest: dict, indent: Optional[int] = None) -> dict:
    """Write `seal(manifest)` as `<folder>/manifest.json` (through a temporary name); return it."""
    sealed = seal(manifest)
    tmp = Path(folder) / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(sealed, indent=indent))
    os.replace(tmp, Path(folder) / MANIFEST)
    return sealed


#: `check_entry` results that are not problems: the entry is usable, or there is none for this key.
OK, ABSENT = "ok", "absent"


def check_entry(path: Path, key: str) -> str:
    """`OK` when `path` holds an entry for exactly `key` whose files and manifest match their checksums; `ABSENT`
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
    digest = manifest.pop(MANIFEST_DIGEST, None)
    if digest is None:
        return f"no checksum of its own in {MANIFEST} (written before manifests were verified)"
    if digest != sha256_of(manifest):
        return f"{MANIFEST} does not match its checksum (edited or altered)"
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


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_BUILD_FOLDER = re.compile(r"^\.(?P<entry>.+)\.tmp-(?P<pid>\d+)$")


def remove_dead_builds(root: Path) -> list[Path]:
    """Remove the temporary folders `.<entry>.tmp-<pid>` under `root` that a killed build left: those whose process
    is gone and whose entry's lock is free (no build of that entry runs, here or on another machine); return them."""
    removed = []
    for tmp in sorted(Path(root).glob(".*.tmp-*")):
        match = _BUILD_FOLDER.match(tmp.name)
        if not (match and tmp.is_dir()) or pid_alive(int(match["pid"])):
            continue
        with try_lock(Path(root) / f"{match['entry']}.lock") as held:
            if held:
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
                log.info("removed %s, the unfinished build of a process that is gone", tmp)
    return removed


@contextmanager
def try_lock(lock_path: Path) -> Iterator[bool]:
    """Try to take an exclusive `fcntl` lock on `lock_path` without waiting; yields whether it is held."""
    with open(lock_path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


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
    `files` (the checksums) and `manifest_sha256` (`seal`). An entry under `path` with another key, or a broken
    one, is replaced.
    """
    path = Path(path)
    if usable(path, key, "cache entry"):
        return CacheEntry(path, json.loads((path / MANIFEST).read_text()), {"hit": True, "lock_wait_s": 0.0})
    remove_dead_builds(path.parent)
    with exclusive_lock(path.parent / f"{path.name}.lock") as waited:
        if is_complete(path, key):  # another process built it while we waited
            return CacheEntry(path, json.loads((path / MANIFEST).read_text()), {"hit": True, "lock_wait_s": waited})
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            extra = build(tmp) or {}
            manifest = write_manifest(tmp, {
                "key": key, "components": components or {}, "build_s": time.perf_counter() - t0,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra, "files": file_checksums(tmp)}, indent=1)
            if path.exists():  # a stale or foreign entry under this name
                shutil.rmtree(path)
            os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return CacheEntry(path, manifest, {"hit": False, "lock_wait_s": waited})
