"""Checkpoints carry their sha256; a broken one is never resumed, a killed writer leaves nothing a resume takes."""

import hashlib
import os

import pytest
import torch

from experiments import checkpoints as C
from experiments import records


def state(step: int) -> dict:
    return {"step": step, "method": {"w": torch.full((4, 4), float(step))}, "optimizer": {}, "scheduler": {},
            "stream": {"epoch": 0, "offset": step}, "rng": {}, "losses": [1.0] * step, "tokens_seen": step,
            "train_seconds": 0.1}


def test_each_checkpoint_has_its_checksum_and_pruning_takes_both(tmp_path):
    for step in (1, 2, 3):
        C.save_checkpoint(tmp_path, step, state(step), keep=2)
    folder = tmp_path / C.CHECKPOINT_DIR
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_00000002.pt", "step_00000002.pt.sha256", "step_00000003.pt", "step_00000003.pt.sha256"]
    newest = folder / "step_00000003.pt"
    assert (folder / "step_00000003.pt.sha256").read_text() == \
        f"{hashlib.sha256(newest.read_bytes()).hexdigest()}  step_00000003.pt\n"  # `sha256sum -c` format
    assert oct(newest.stat().st_mode & 0o777) == oct(records.file_mode())
    path, resumed = C.resume(tmp_path)
    assert path == newest and torch.equal(resumed["method"]["w"], state(3)["method"]["w"])


def test_a_writer_killed_after_the_checksum_leaves_nothing_a_resume_takes(tmp_path, monkeypatch):
    """The checksum file is written before the checkpoint takes its final name: a writer stopped between the two
    leaves a checksum without a checkpoint (and a temporary file, which a launch removes): resumed from the step
    before, and the next save removes the lone checksum."""
    C.save_checkpoint(tmp_path, 1, state(1), keep=2)
    real_replace = os.replace

    def killed(src, dst):
        if str(dst).endswith("step_00000002.pt"):
            raise KeyboardInterrupt  # stands for the kill: nothing after this line runs
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        C.save_checkpoint(tmp_path, 2, state(2), keep=2)
    monkeypatch.setattr(os, "replace", real_replace)
    folder = tmp_path / C.CHECKPOINT_DIR
    assert (folder / "step_00000002.pt.sha256").exists() and not (folder / "step_00000002.pt").exists()
    assert C.resume(tmp_path)[0].name == "step_00000001.pt"
    C.save_checkpoint(tmp_path, 3, state(3), keep=2)
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_00000001.pt", "step_00000001.pt.sha256", "step_00000003.pt", "step_00000003.pt.sha256"]


def test_a_checkpoint_written_before_checksums_is_resumed_when_it_loads(tmp_path, caplog):
    older, newer = C.checkpoint_path(tmp_path, 1), C.checkpoint_path(tmp_path, 2)
    older.parent.mkdir(parents=True)
    torch.save(state(1), older)
    torch.save(state(2), newer)
    newer.write_bytes(newer.read_bytes()[:100])
    assert C.checkpoint_problem(older) is None and C.checkpoint_problem(newer).startswith("cannot be read (")
    with caplog.at_level("WARNING", logger="suite.train"):
        assert C.newest_intact(tmp_path) == older
    assert len(caplog.records) == 1 and f"checkpoint {newer} is broken: cannot be read (" in caplog.text
    assert C.resume(tmp_path)[1]["step"] == 1
    assert [p.name.split("-")[0] for p in (older.parent / C.BROKEN_DIR).iterdir()] == ["step_00000002"]


def test_a_checkpoint_that_lost_its_checksum_file_is_not_taken_for_an_older_one(tmp_path, caplog):
    C.save_checkpoint(tmp_path, 1, state(1), keep=2)
    C.save_checkpoint(tmp_path, 2, state(2), keep=2)
    C.checksum_path(C.checkpoint_path(tmp_path, 2)).unlink()
    with caplog.at_level("WARNING", logger="suite.train"):
        assert C.resume(tmp_path)[0].name == "step_00000001.pt"
    broken = C.checkpoint_path(tmp_path, 2)
    assert f"checkpoint {broken} is broken: its checksum file is missing; moved to" in caplog.text


def test_a_run_start_reads_the_newest_checkpoint_s_bytes_once_to_verify_them(tmp_path, monkeypatch):
    """`newest_intact` (before anything loads) and `resume` (the training loop) check the same file: a large checkpoint
    is hashed once, unless it changed in between."""
    C.save_checkpoint(tmp_path, 1, state(1), keep=2)
    hashed = []
    real = C.file_sha256
    monkeypatch.setattr(C, "file_sha256", lambda path: hashed.append(path) or real(path))
    assert C.newest_intact(tmp_path) == C.resume(tmp_path)[0] == C.checkpoint_path(tmp_path, 1)
    assert hashed == [C.checkpoint_path(tmp_path, 1)]
    C.save_checkpoint(tmp_path, 1, state(1), keep=2)  # written again: another file
    C.resume(tmp_path)
    assert len(hashed) == 2


def test_a_load_that_runs_out_of_memory_does_not_set_the_checkpoint_aside(tmp_path, monkeypatch):
    C.save_checkpoint(tmp_path, 1, state(1), keep=2)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(C.torch, "load", no_memory)
    with pytest.raises(MemoryError):
        C.resume(tmp_path)
    assert C.checkpoint_paths(tmp_path) == [C.checkpoint_path(tmp_path, 1)]
    assert not (tmp_path / C.CHECKPOINT_DIR / C.BROKEN_DIR).exists()
