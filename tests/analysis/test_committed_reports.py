"""The committed micro reproductions (docs/results/micro, docs/results/micro_extended): each report is what
`python -m analysis report` makes of its committed records, and micro's records are the full micro_main preset."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from analysis.report import check_report
from tests.conftest import REPO

RESULTS = Path("docs/results/micro")
RECORDS, REPORT = RESULTS / "records", RESULTS / "report"
REFERENCE = "lora:train.steps=300"  # LoRA at its defaults when these records were made (commit 0eac144)


@pytest.mark.parametrize("folder,reference", [(RESULTS, REFERENCE), (Path("docs/results/micro_extended"), "lora")])
def test_committed_micro_report_matches_a_rerun_over_its_records(monkeypatch, folder, reference):
    monkeypatch.chdir(REPO)  # the report names its records by these relative paths
    records, report = folder / "records", folder / "report"
    assert (report / "index.md").is_file() and records.is_dir()
    diffs = check_report([str(records)], report, reference=reference)
    # Figures are byte-identical only for the same matplotlib and font versions; tables, data and the
    # index must match exactly, and every figure must be there.
    assert [d for d in diffs if not d.startswith("differs: figures/")] == []
    figures = sorted((report / "figures").iterdir())
    assert any(p.name.startswith("pareto_micro_mean") for p in figures)


def test_committed_records_are_the_whole_micro_main_preset():
    records = [json.loads(p.read_text()) for p in sorted((REPO / RECORDS).rglob("record.json"))]
    assert len(records) == 54 and all(r["status"] == "complete" for r in records)
    per_method = Counter(r["method"] for r in records)
    assert per_method == {"atlas": 9, "base": 3, "lora": 6, "olora": 6, "replay": 6, "ewc": 6, "lwf": 6,
                          "corda": 6, "inflora": 6}
    assert Counter(r["seed"] for r in records) == {0: 18, 1: 18, 2: 18}
    assert {r["backbone"] for r in records} == {"micro"}
    # Provenance: one committed code version, not edited while the sweep ran.
    assert len({r["provenance"]["git_sha"] for r in records}) == 1
    assert not any(r["provenance"]["git_dirty"] for r in records)
