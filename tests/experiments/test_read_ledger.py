"""The ledger of test-split reads (experiments.read_ledger): a test-split run appends its one line with the fields the
contract names, and the report counts it; a dev run appends nothing; appends of concurrent processes never
interleave; an append after a torn line starts on a line of its own; the split's content hash is stable."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from analysis.collect import collect
from analysis.read_ledger import index_lines, read_ledgers
from experiments import read_ledger
from suite_schema import layout
from tests.conftest import REPO, run_cli, tiny_overrides


def _benchmark(code=("def f(): pass",), math=("1+1?",)):
    return SimpleNamespace(split="test", target_eval=[{"prompt": p, "suite": "c"} for p in code],
                           retained={"math": SimpleNamespace(evaluation=[{"question": q, "answer": "2"} for q in math])})


def _line(**kw):
    fields = dict(run_id="r1", method="lora", knobs={"name": "lora", "rank": 8}, train={"steps": 6, "lr": 1e-3},
                  seed=0, backbone="micro", benchmark="micro", split="test", scales=[1.0], content_sha256="c",
                  git_sha="a" * 40, git_dirty=False)
    return read_ledger.ledger_line(**{**fields, **kw})


def test_the_content_hash_is_stable_and_changes_with_the_items():
    first = read_ledger.content_hash(_benchmark())
    assert first == read_ledger.content_hash(_benchmark()) and len(first) == 64
    assert first != read_ledger.content_hash(_benchmark(math=("1+2?",)))
    assert first != read_ledger.content_hash(_benchmark(code=("def g(): pass",)))


def test_a_line_carries_every_field_of_the_contract(tmp_path):
    path = read_ledger.log_read(tmp_path, _line())
    assert path == tmp_path / layout.TEST_READS_NAME
    [line] = [json.loads(s) for s in path.read_text().splitlines()]
    assert tuple(line) == layout.TEST_READ_FIELDS and layout.ledger_line_problem(line) is None


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / layout.TEST_READS_NAME
    read_ledger.log_read(tmp_path, _line(run_id="r1"))
    with open(path, "ab") as fh:
        fh.write(b'{"time":"2026-')  # a write cut short
    read_ledger.log_read(tmp_path, _line(run_id="r2"))
    lines = path.read_text().split("\n")
    assert lines[1] == '{"time":"2026-' and json.loads(lines[2])["run_id"] == "r2" and lines[3] == ""


APPENDER = """
import sys
from pathlib import Path
from experiments.read_ledger import ledger_line, log_read
who, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    log_read(Path(sys.argv[3]), ledger_line(run_id=f"{who}-{i}", method="lora", knobs={"name": "lora", "pad": who * 40000},
             train={}, seed=0, backbone="b", benchmark="m", split="test", scales=[1.0], content_sha256="c",
             git_sha="a", git_dirty=False))
"""


@pytest.mark.slow
def test_concurrent_appenders_never_interleave(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(who), "60", str(tmp_path)], cwd=REPO)
             for who in range(4)]
    assert [p.wait(timeout=240) for p in procs] == [0] * 4
    data = (tmp_path / layout.TEST_READS_NAME).read_bytes()
    assert data.endswith(b"\n")
    lines = [json.loads(raw) for raw in data.split(b"\n")[:-1]]  # every line whole JSON
    assert sorted(r["run_id"] for r in lines) == sorted(f"{w}-{i}" for w in range(4) for i in range(60))
    assert all(r["knobs"]["pad"] == r["run_id"].split("-")[0] * 40000 for r in lines)


@pytest.mark.slow
def test_a_test_split_run_appends_its_line_and_a_dev_run_appends_nothing(tiny_backbone_dir, tiny_benchmark_dir,
                                                                         tmp_path):
    root = tmp_path / "runs"
    args = ["method=base", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, root, tmp_path / "cache")]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = root / layout.TEST_READS_NAME
    [line] = [json.loads(s) for s in ledger.read_text().splitlines()]
    [record_path] = root.glob(f"*/{layout.RECORD_NAME}")
    record = json.loads(record_path.read_text())
    assert tuple(line) == layout.TEST_READ_FIELDS
    assert line["run_id"] == record["run_id"] and line["method"] == "base" and line["knobs"] == record["knobs"]
    assert line["backbone"] == record["backbone"] and line["benchmark"] == record["benchmark"] == "micro_v3"
    assert (line["git_sha"], line["git_dirty"]) == (record["provenance"]["git_sha"], record["provenance"]["git_dirty"])
    assert line["split"] == "test" and line["scales"] == [1.0] and line["seed"] == 0
    assert line["train"] == {k: record["config"]["train"][k] for k in layout.TRAIN_KNOBS}
    assert len(line["content_sha256"]) == 64 and line["time"] <= record["provenance"]["end_time"]

    # The report counts the read; made at the records' own point and commit, it is not flagged.
    text = "\n".join(index_lines(read_ledgers([root]), collect([root]).table, str))
    assert "1 test-split reads" in text and "0 flagged" in text and "| base | 1 | 0 | 1 |" in text

    again = run_cli(args)  # complete: skipped, nothing read
    assert again.returncode == 0, again.stderr[-3000:]
    dev = run_cli(["method=base", "benchmark.split=dev",
                   *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, root, tmp_path / "cache")])
    assert dev.returncode == 0, dev.stderr[-3000:]
    assert len(list(root.glob(f"*/{layout.RECORD_NAME}"))) == 2
    assert ledger.read_text().splitlines() == [json.dumps(line, separators=(",", ":"))]
