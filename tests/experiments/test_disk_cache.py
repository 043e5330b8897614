"""Keyed disk cache: built once, then a hit without building; a failed build leaves nothing; another key replaces."""

import json

import pytest

from experiments import disk_cache


def test_build_then_hit_then_rebuild_for_another_key(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "data.txt").write_text(f"build {len(calls)}")
        return {"n": len(calls)}

    path = disk_cache.entry_path(tmp_path, "stat", "tiny/model x", "ab" * 32)
    assert path.name == f"stat-tiny_model_x-{'ab' * 12}"
    first = disk_cache.get_or_build(path, "k1", build, {"what": 1})
    assert not first.stats["hit"] and first.manifest["n"] == 1 and first.manifest["components"] == {"what": 1}
    second = disk_cache.get_or_build(path, "k1", build)
    assert second.stats["hit"] and len(calls) == 1 and (path / "data.txt").read_text() == "build 1"
    third = disk_cache.get_or_build(path, "k2", build)  # same folder name, another key: replaced
    assert not third.stats["hit"] and (path / "data.txt").read_text() == "build 2"
    assert json.loads((path / disk_cache.MANIFEST).read_text())["key"] == "k2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, f"{path.name}.lock"]


def test_failed_build_leaves_nothing_behind(tmp_path):
    def boom(folder):
        (folder / "half.txt").write_text("partial")
        raise RuntimeError("boom")

    path = tmp_path / "entry"
    with pytest.raises(RuntimeError, match="boom"):
        disk_cache.get_or_build(path, "k", boom)
    assert not path.exists() and not disk_cache.is_complete(path, "k")
    assert [p.name for p in tmp_path.iterdir()] == ["entry.lock"]


@pytest.mark.parametrize("damage", ["alter", "truncate", "delete", "manifest", "edited", "old", "unsealed"])
def test_a_broken_entry_is_reported_and_rebuilt_never_read(tmp_path, damage, caplog):
    """Files are checked against the checksums the manifest holds (written last), the manifest against its own:
    any damage is named in one warning line with the entry's path, and the entry is rebuilt instead of returned."""
    calls = []

    def build(folder):
        calls.append(1)
        (folder / "data.bin").write_bytes(bytes(range(256)) * 8)
        (folder / "sub").mkdir()
        (folder / "sub" / "more.txt").write_text("fisher")

    path = tmp_path / "entry"
    disk_cache.get_or_build(path, "k", build)
    manifest = json.loads((path / disk_cache.MANIFEST).read_text())
    assert set(manifest["files"]) == {"data.bin", "sub/more.txt"} and disk_cache.check_entry(path, "k") == "ok"
    (path / "added_later.json").write_text("{}")  # a file added after the build is not part of the entry
    assert disk_cache.check_entry(path, "k") == "ok"
    data = path / "data.bin"
    if damage == "alter":  # same size, one byte changed
        raw = bytearray(data.read_bytes()); raw[100] ^= 0xFF; data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:300])
    elif damage == "delete":
        (path / "sub" / "more.txt").unlink()
    elif damage == "manifest":
        (path / disk_cache.MANIFEST).write_text('{"key": "k", "files": {"data')
    elif damage == "edited":  # valid JSON, key and file checksums intact, what a load reads changed
        manifest["components"] = {"edited": True}; (path / disk_cache.MANIFEST).write_text(json.dumps(manifest))
    elif damage == "old":  # an entry written before checksums existed
        manifest.pop("files"); (path / disk_cache.MANIFEST).write_text(json.dumps(manifest))
    else:  # an entry written before manifests were checked
        manifest.pop("manifest_sha256"); (path / disk_cache.MANIFEST).write_text(json.dumps(manifest))
    problem = disk_cache.check_entry(path, "k")
    if damage == "edited":
        assert problem == "manifest.json does not match its checksum (edited or altered)"
    assert problem not in ("ok", "absent") and not disk_cache.is_complete(path, "k")
    with caplog.at_level("WARNING", logger="suite.cache"):
        entry = disk_cache.get_or_build(path, "k", build)
    assert not entry.stats["hit"] and len(calls) == 2 and disk_cache.check_entry(path, "k") == "ok"
    assert [r.getMessage() for r in caplog.records] == [f"cache entry {path} is broken: {problem}; rebuilding it"]


def test_a_later_build_removes_what_killed_builds_left_but_never_a_live_one(tmp_path):
    """A build killed outright (SIGKILL) leaves its temporary folder `.<entry>.tmp-<pid>`; the next build removes
    those of processes that are gone, not one of a live process, nor one whose entry's lock is held (a build of it
    running elsewhere)."""
    import fcntl
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    leftovers = {name: tmp_path / name for name in
                 (f".entry.tmp-{dead_pid}", f".busy.tmp-{dead_pid}", f".other.tmp-{os.getpid()}")}
    for folder in leftovers.values():
        folder.mkdir()
        (folder / "half.bin").write_bytes(b"x" * 100)
    with open(tmp_path / "busy.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        disk_cache.get_or_build(tmp_path / "entry", "k", lambda folder: {"n": (folder / "data.txt").write_text("ok")})
    assert not leftovers[f".entry.tmp-{dead_pid}"].exists()
    assert leftovers[f".busy.tmp-{dead_pid}"].is_dir() and leftovers[f".other.tmp-{os.getpid()}"].is_dir()
    assert (tmp_path / "entry" / "data.txt").read_text() == "ok"
