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
