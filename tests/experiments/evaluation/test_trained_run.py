"""Loading a finished run back (`experiments.evaluation.trained_run`): a record made before a later key existed is
read with the value the run computed with, not today's default, and a method without that key gets none."""

import json

import pytest

from experiments.evaluation.trained_run import config_of, load_run
from tests.conftest import REPO

RESULTS = REPO / "docs/results/micro"


def _record(folder: str, method: str, has_filter_keys: bool) -> dict:
    for path in sorted((RESULTS / folder).glob("*/record.json")):
        record = json.loads(path.read_text())
        if record["method"] == method and ("filter_members" in record["config"]["method"]) == has_filter_keys:
            return record
    raise AssertionError(f"no {method} record in {folder}")


def test_a_record_from_before_the_filter_keys_is_loaded_with_the_earlier_filters():
    record = _record("retune/records", "atlas", has_filter_keys=False)  # made before the keys existed
    typed = config_of(record)
    assert typed.method.filter_members == "kmeans" and typed.method.filter_basis is None
    today = _record("records", "atlas", has_filter_keys=True)
    typed = config_of(today)
    assert typed.method.filter_members == "assigned" and typed.method.filter_basis == 32


def test_a_method_without_the_later_keys_gets_none_of_them():
    typed = config_of(_record("records", "lora", has_filter_keys=False))
    assert "filter_members" not in typed.method and "filter_basis" not in typed.method


def test_a_run_without_a_complete_record_or_an_export_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no complete record.json"):
        load_run(tmp_path)
    (tmp_path / "record.json").write_text(json.dumps({"run_id": "x", "status": "complete", "config": {}}))
    with pytest.raises(ValueError, match="no export/"):
        load_run(tmp_path)
