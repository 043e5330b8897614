"""`rerun_before=<commit>`: records made by older code (or of unknown version) are run again from scratch, their
records kept under superseded/ where analysis does not read them; records of that commit or later are kept."""

import json

import pytest

from analysis.collect import find_records
from experiments import records
from experiments.rerun import resolve_commit, stale_reason, supersede
from suite_schema.layout import RECORD_NAME
from tests.conftest import run_cli, tiny_overrides

HEAD = records.git_output("rev-parse", "HEAD")
PARENT = records.git_output("rev-parse", "HEAD~1")
pytestmark = pytest.mark.skipif(not (HEAD and PARENT), reason="needs the project's git history (a clone, not an archive)")


def write_record(run_dir, sha, **extra):
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = {"run_id": "0123456789abcdef", "status": "complete", "provenance": {"git_sha": sha}, **extra}
    (run_dir / RECORD_NAME).write_text(json.dumps(rec))
    return rec


def test_which_records_count_as_older(tmp_path):
    assert resolve_commit("HEAD") == HEAD and resolve_commit("no-such-commit-xyz") is None
    assert stale_reason(tmp_path / "none", HEAD) is None  # nothing recorded: nothing to re-run
    cases = {PARENT: "older than", HEAD: None, "f" * 40: "does not know", None: "no code version"}
    for sha, expected in cases.items():
        write_record(tmp_path / "r", sha)
        reason = stale_reason(tmp_path / "r", HEAD)
        assert (reason is None) if expected is None else (expected in reason), (sha, reason)
    write_record(tmp_path / "r", HEAD)
    assert stale_reason(tmp_path / "r", PARENT) is None  # made by a later commit than asked: kept


def test_supersede_keeps_the_records_aside_and_removes_every_other_output(tmp_path):
    run = tmp_path / "runs" / "0123456789abcdef"
    write_record(run, PARENT)
    for rel in ("checkpoints/step_00000010.pt", "export/adapter.safetensors", "atlas.safetensors",
                "scales/0.5/record.json", ".hydra/config.yaml", "run.log"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("{}")
    dest = supersede(run)
    assert dest == run / "superseded" / PARENT[:12]
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "run.log", "superseded"]
    assert json.loads((dest / RECORD_NAME).read_text())["provenance"]["git_sha"] == PARENT
    assert (dest / "scales" / "0.5" / RECORD_NAME).is_file()
    found, bare = find_records([tmp_path / "runs"])
    assert found == [] and bare == [run]  # analysis reads no superseded record


@pytest.mark.parametrize("sha", ["../../elsewhere", "/tmp/abs", "--help", 12345, ["a"]])
def test_a_code_version_that_is_no_commit_sha_names_no_folder(tmp_path, sha):
    # A record may hold anything: its sha is not a path piece (nor an argument git reads as an option).
    run = tmp_path / "runs" / "0123456789abcdef"
    write_record(run, sha)
    assert stale_reason(run, HEAD) == "its record has no code version"
    dest = supersede(run)
    assert dest == run / "superseded" / "unknown" and (dest / RECORD_NAME).is_file()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob(RECORD_NAME)) == [
        "runs/0123456789abcdef/superseded/unknown/record.json"]


def test_records_set_aside_as_unreadable_go_with_the_superseded_ones(tmp_path):
    run = tmp_path / "0123456789abcdef"
    write_record(run, PARENT)
    for rel in ("record.json.unreadable-20260101T000000Z", "scales/0.5/record.json.unreadable-20260101T000000Z"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("[]")
    dest = supersede(run)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("record.json*")) == [
        "record.json", "record.json.unreadable-20260101T000000Z", "scales/0.5/record.json.unreadable-20260101T000000Z"]


@pytest.mark.slow
def test_a_run_made_by_older_code_is_made_again(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    args = ["method=lora", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache")]
    first = run_cli(args)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = next((tmp_path / "runs").rglob(RECORD_NAME)).parent
    rec = json.loads((run_dir / RECORD_NAME).read_text())
    rec["provenance"]["git_sha"] = PARENT  # as if an older commit had made it
    (run_dir / RECORD_NAME).write_text(json.dumps(rec))

    kept = run_cli([*args, f"rerun_before={PARENT}"])  # made by the commit asked for: kept
    assert kept.returncode == 0 and "skipped (nothing to do)" in kept.stdout
    again = run_cli([*args, "rerun_before=HEAD"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"older than {HEAD[:12]}" in again.stdout and "running it again from scratch" in again.stdout
    new = json.loads((run_dir / RECORD_NAME).read_text())
    assert new["status"] == "complete" and new["provenance"]["git_sha"] == HEAD
    assert new["train"]["resumed_from"] is None  # trained anew, not resumed from the older checkpoints
    assert json.loads((run_dir / "superseded" / PARENT[:12] / RECORD_NAME).read_text())["run_id"] == rec["run_id"]


@pytest.mark.slow
def test_an_unknown_commit_is_rejected_before_any_work(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    args = ["method=lora", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache")]
    bad = run_cli([*args, "rerun_before=no-such-commit-xyz"])
    assert bad.returncode == 2
    assert "rerun_before='no-such-commit-xyz' is not allowed: a commit of this checkout" in bad.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob(RECORD_NAME))


def test_what_rerun_before_asks_for(tmp_path):
    """The check the job and the sweep planner share: None never asks; a commit asks for records older than it."""
    from experiments.rerun import requested

    write_record(tmp_path / "run", PARENT)
    assert "older than" in requested("HEAD", tmp_path / "run")
    assert requested(PARENT, tmp_path / "run") is None and requested(None, tmp_path / "run") is None


def test_a_record_names_the_code_its_process_started_with(monkeypatch):
    """The code version is read once per process: a commit made while a run trains does not relabel its record."""
    monkeypatch.setattr(records, "_CODE_VERSION", None)
    answers = {("rev-parse", "HEAD"): PARENT, ("status", "--porcelain", "--untracked-files=no"): ""}
    monkeypatch.setattr(records, "git_output", lambda *args, cwd=None: answers[args[:3]])
    assert records.code_version() == (PARENT, False)
    answers[("rev-parse", "HEAD")] = HEAD  # committed meanwhile
    prov = records.provenance()
    assert (prov["git_sha"], prov["git_dirty"]) == (PARENT, False)
