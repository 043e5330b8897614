"""Re-checking a finished run's stored completions (`python -m experiments.evaluation.rescore`): the benchmark is
rebuilt from the record's config, every greedy completion is checked again in the sandbox, and each verdict that
changed is listed; a run without a complete record or stored completions is refused."""

from __future__ import annotations

import json

import pytest

from experiments.evaluation.rescore import main, rescore
from suite_schema.layout import CODE_SAMPLES_NAME, RECORD_NAME
from tests.conftest import REPO

COMMITTED = REPO / "docs" / "results" / "micro" / "records"


def _problems(n: int) -> list[dict]:
    lines = (REPO / "assets" / "micro" / "data" / "code" / "test.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def _run(tmp_path, completions: list[tuple[dict, str, str]]):
    """A run folder holding a committed micro record and `completions` as (problem, completion, stored status)."""
    record = json.loads(next(p for p in sorted(COMMITTED.glob(f"*/{RECORD_NAME}"))
                             if json.loads(p.read_text())["method"] == "lora").read_text())
    run = tmp_path / "run"
    run.mkdir()
    (run / RECORD_NAME).write_text(json.dumps(record))
    samples = [{"task_id": p["task_id"], "kind": "greedy", "index": i, "completion": text, "status": status,
                "reason": None} for i, (p, text, status) in enumerate(completions)]
    samples.append({**samples[0], "kind": "sample"})  # samples for pass@k are not re-checked
    (run / CODE_SAMPLES_NAME).write_text(json.dumps(samples))
    return run, record


@pytest.mark.sandbox
def test_stored_completions_are_checked_again_and_changed_verdicts_listed(tmp_path, capsys):
    right, wrong = _problems(2)
    run, record = _run(tmp_path, [(right, right["canonical_solution"], "passed"), (wrong, "    return None\n", "passed")])
    result = rescore(run)
    assert result["run_id"] == record["run_id"] and result["n"] == 2
    assert result["stored_pass@1"] == 1.0 and result["rechecked_pass@1"] == 0.5
    assert [(c["task_id"], c["old"], c["new"]) for c in result["changed"]] == [(wrong["task_id"], "passed", "failed")]
    assert main([str(run)]) == 0
    assert "re-checked 0.5000 (n=2); 1 verdicts flipped" in capsys.readouterr().out


def test_a_run_without_stored_completions_is_refused(tmp_path, capsys):
    run, _ = _run(tmp_path, [(_problems(1)[0], "    pass\n", "failed")])
    (run / CODE_SAMPLES_NAME).unlink()
    with pytest.raises(ValueError, match=f"no {CODE_SAMPLES_NAME}"):
        rescore(run)
    assert main([str(run)]) == 2 and "error:" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no complete record.json"):
        rescore(tmp_path / "elsewhere")


@pytest.mark.sandbox
def test_a_completion_whose_check_cannot_be_built_is_invalid_and_the_rest_is_checked(tmp_path):
    right, deep = _problems(2)
    nested = "    return " + "-" * 3000 + "1\n"  # the parser raises RecursionError
    run, _ = _run(tmp_path, [(right, right["canonical_solution"], "passed"), (deep, nested, "failed")])
    result = rescore(run)
    assert result["n"] == 2 and result["rechecked_pass@1"] == 0.5
    [changed] = result["changed"]
    assert (changed["task_id"], changed["old"], changed["new"]) == (deep["task_id"], "failed", "invalid")
    assert "could not be parsed: RecursionError" in changed["new_reason"]
