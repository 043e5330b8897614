"""The test-read ledger in the report (analysis.read_ledger): found in or above the record folders, reads counted per
method, a read at a knob value the records do not have or at another commit flagged, a torn last line skipped and
reported, and "no test-read ledger" where there is none."""

import json
from datetime import datetime, timezone

import pytest
from analysis_synth import record, write

from analysis.collect import collect
from analysis.read_ledger import find_ledgers, flags, index_lines, read_ledgers
from analysis.report import write_report
from suite_schema import layout


def ledger_line(rec: dict, **kw) -> dict:
    """The line the runtime appends when the run of record `rec` starts reading the test split."""
    line = {"time": datetime(2026, 1, 1, tzinfo=timezone.utc).isoformat(),
            "git_sha": rec["provenance"]["git_sha"], "git_dirty": rec["provenance"]["git_dirty"],
            "run_id": rec["run_id"], "method": rec["method"], "knobs": rec["knobs"],
            "train": {k: rec["config"]["train"][k] for k in layout.TRAIN_KNOBS}, "seed": rec["seed"],
            "backbone": rec["backbone"], "benchmark": rec["benchmark"], "split": "test", "scales": [1.0],
            "content_sha256": "0" * 64}
    line.update(kw)
    assert tuple(line) == layout.TEST_READ_FIELDS
    return line


def write_ledger(path, lines, torn: bytes = b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in lines) + torn)


@pytest.fixture
def folder(tmp_path):
    """A committed result folder: records/ with LoRA (2 seeds) and the base, the ledger next to records/: LoRA's
    final reads, one at a step count no record has, one at an earlier commit, the base's read, and a torn last line."""
    lora = [record("lora", s, 0.3, steps=300) for s in (0, 1)]
    base = record("base", 0, 0.1, knobs={})
    for rec in (*lora, base):
        write(tmp_path / "records", rec)
    lines = [ledger_line(lora[0]), ledger_line(lora[1]), ledger_line(base),
             ledger_line(lora[0], run_id="early", train={"steps": 100, "lr": 1e-3}),
             ledger_line(lora[1], run_id="old", git_sha="0123456789abcdef", time="2025-12-01T00:00:00+00:00")]
    write_ledger(tmp_path / layout.TEST_READS_NAME, lines, torn=b'{"time": "2026-01-02T00:0')
    return tmp_path


def test_the_ledger_next_to_records_is_found_and_a_torn_last_line_is_skipped_and_reported(folder):
    assert find_ledgers([folder / "records"]) == [folder / layout.TEST_READS_NAME]
    assert find_ledgers([folder / "records", folder]) == [folder / layout.TEST_READS_NAME]  # each once
    ledger = read_ledgers([folder / "records"])
    assert len(ledger.reads) == 5
    [problem] = ledger.problems
    assert "line 6: torn last line" in problem and "skipped" in problem


def test_a_read_at_a_knob_value_the_records_lack_or_at_another_commit_is_flagged(folder):
    table = collect([folder / "records"]).table
    flagged = {read["run_id"]: why for read, why in flags(read_ledgers([folder]).reads, table)}
    assert set(flagged) == {"early", "old"}
    assert "none of the report's records is at" in flagged["early"]
    assert "read at commit 0123456789ab; the records at that point were made at abc" in flagged["old"]


def test_a_dirty_read_of_a_clean_point_is_flagged(folder):
    rec = record("lora", 0, 0.3, steps=300)
    [(_, why)] = flags([ledger_line(rec, git_dirty=True)], collect([folder / "records"]).table)
    assert "(uncommitted changes)" in why


@pytest.mark.slow
def test_the_report_counts_reads_per_method_and_lists_the_flagged_and_skipped(folder):
    index = (write_report([str(folder / "records")], folder / "report", levels=["0.2"]).folder
             / "index.md").read_text()
    assert "## Test reads" in index
    assert "5 test-split reads" in index and "2 flagged" in index
    assert "| lora | 4 | 2 | 1 |" in index and "| base | 1 | 0 | 1 |" in index
    assert "lora run `early` seed 0: read at a point (knobs) none of the report's records is at" in index
    assert "lora run `old` seed 1: read at commit 0123456789ab" in index
    assert "line 6: torn last line" in index


def test_without_a_ledger_the_index_says_so(tmp_path):
    write(tmp_path / "records", record("lora", 0, 0.3))
    (tmp_path / ".git").mkdir()  # the search stops at a repository's root
    assert read_ledgers([tmp_path / "records"]) is None
    text = "\n".join(index_lines(None, collect([tmp_path / "records"]).table, str))
    assert "No test-read ledger (`test_reads.jsonl`) in or above the record folders given." in text
