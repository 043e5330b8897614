"""A run directory's files: the partial files a killed writer leaves (the suite's own names, in its own folders
only), and records that cannot be read, or are not this run's, moved aside instead of crashing a launch or being
overwritten."""

import json

import pytest

from analysis.collect import find_records
from experiments import records
from suite_schema.layout import RECORD_NAME

RUN_ID = "0123456789abcdef"
COMPLETE = {"run_id": RUN_ID, "status": "complete"}


def test_partial_files_are_the_suites_own_names_in_the_folders_it_writes(tmp_path):
    run = tmp_path / RUN_ID
    partial = [".record.json.k2j4_x.tmp", "atlas.tmp", ".corda_eigens.pt.tmp-4242", ".acts.safetensors.tmp",
               "checkpoints/.step_00000004.pt.abcd.tmp", "export/atlas.tmp", "scales/0.5/.record.json.q.tmp"]
    kept = ["record.json", "notes/draft.tmp", "data/sub/shard.tmp-3", "checkpoints/old/.step_2.pt.x.tmp",
            "results.tmp-final", "checkpoints/step_00000004.pt", "export/adapter.safetensors"]
    for rel in partial + kept:
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("x")
    assert [str(p.relative_to(run)) for p in records.partial_files(run)] == sorted(partial)
    assert records.partial_files(tmp_path / "absent") == []


UNREADABLE = {
    "a JSON array": (b"[1, 2]", "it holds a JSON array, not an object"),
    "invalid UTF-8": (b'{"run_id": "\xff\xfe"}', "not UTF-8"),
    "truncated JSON": (json.dumps(COMPLETE).encode()[:20], "not JSON"),
    "a directory": (None, "Is a directory"),
    "another run's record": (json.dumps({**COMPLETE, "run_id": "fedcba9876543210"}).encode(),
                             "the record of run id 'fedcba9876543210'"),
    "an unknown status": (json.dumps({**COMPLETE, "status": "paused"}).encode(), "its status 'paused' is none of"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_record_that_is_not_this_runs_is_moved_aside_not_overwritten(tmp_path, case):
    content, why = UNREADABLE[case]
    run = tmp_path / "runs" / RUN_ID
    run.mkdir(parents=True)
    if content is None:
        (run / RECORD_NAME).mkdir()
    else:
        (run / RECORD_NAME).write_bytes(content)
    (run / ".hydra").mkdir()
    # Reading never raises: a launch, the sweep planner and its summary take it for no complete record.
    if case not in ("another run's record", "an unknown status"):
        assert records.read_record(run) is None
    assert not records.is_complete(run, RUN_ID)

    moved = records.set_aside_unreadable(run, RUN_ID)
    assert len(moved) == 1 and why in moved[0][1], moved
    dest = moved[0][0]
    assert dest.parent == run and dest.name.startswith(f"{RECORD_NAME}.unreadable-")
    assert not (run / RECORD_NAME).exists()
    assert (dest.is_dir() if content is None else dest.read_bytes() == content)  # kept as it was
    assert find_records([tmp_path / "runs"]) == ([], [run])  # analysis reads no record set aside
    assert records.set_aside_unreadable(run, RUN_ID) == []  # nothing left to move


def test_a_readable_record_of_this_run_stays_and_a_bad_scale_record_is_moved_aside(tmp_path):
    run = tmp_path / RUN_ID
    (run / "scales" / "0.5").mkdir(parents=True)
    for status in ("complete", "failed", "interrupted", "running"):
        (run / RECORD_NAME).write_text(json.dumps({**COMPLETE, "status": status}))
        assert records.set_aside_unreadable(run, RUN_ID) == []
    (run / "scales" / "0.5" / RECORD_NAME).write_text(json.dumps({"run_id": f"{RUN_ID}@0.5", "status": "complete"}))
    assert records.set_aside_unreadable(run, RUN_ID) == []
    (run / "scales" / "0.5" / RECORD_NAME).write_text("{")
    [(dest, why)] = records.set_aside_unreadable(run, RUN_ID)
    assert dest.parent == run / "scales" / "0.5" and "not JSON" in why
    assert (run / RECORD_NAME).is_file()


def test_two_records_set_aside_in_the_same_second_both_stay(tmp_path):
    run = tmp_path / RUN_ID
    run.mkdir()
    for text in ("[1]", "[2]"):
        (run / RECORD_NAME).write_text(text)
        records.set_aside_unreadable(run, RUN_ID)
    kept = sorted(p.read_text() for p in run.glob(f"{RECORD_NAME}.unreadable-*"))
    assert kept == ["[1]", "[2]"]


def test_parts_of_a_record_of_another_shape_read_as_empty():
    assert records.part({"process": "pid 3"}, "process") == {}
    assert records.part({"process": {"pid": 3}}, "process") == {"pid": 3}
    assert records.part(None, "process") == {}


def test_a_checkout_changed_only_by_run_outputs_runs_its_commit_s_code(tmp_path):
    """A run root inside the checkout with its records committed: the next runs rewrite tracked records, append to the
    test-read ledger and the protocol's chunk log; none of that is code, so the records stay `git_dirty: false`. A
    changed source file, or a file of another name in a run folder, makes them dirty."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    files = {"run.py": "code", "results/runs/abc/record.json": "{}", "results/runs/abc/code_samples.json": "[]",
             "results/runs/abc/retained_samples.json": "[]", "results/runs/test_reads.jsonl": "",
             "results/runs/protocol.jsonl": "", "results/runs/abc/notes.txt": "n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    assert records.changed_code(tmp_path) is False
    for rel in [r for r in files if r.startswith("results/") and not r.endswith("notes.txt")]:
        (tmp_path / rel).write_text(files[rel] + "\n{\"appended\": 1}")
    (tmp_path / "results/runs/new/record.json").parent.mkdir()
    (tmp_path / "results/runs/new/record.json").write_text("{}")  # untracked
    assert records.changed_code(tmp_path) is False
    (tmp_path / "results/runs/abc/notes.txt").write_text("changed")
    assert records.changed_code(tmp_path / "results") is True  # from a subfolder too: the whole checkout counts
    git("checkout", "--", "results/runs/abc/notes.txt")
    (tmp_path / "run.py").write_text("other code")
    assert records.changed_code(tmp_path) is True
    assert records.changed_code(tmp_path.parent / "no-such-checkout") is None
