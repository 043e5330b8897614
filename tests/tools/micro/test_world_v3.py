"""The micro world v3: committed files equal a regeneration, near/far by design, nothing read before is reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.data.loaders import load
from tools.micro import world as v2
from tools.micro import world_v3 as v3

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "assets" / "micro" / "data_v3"


@pytest.fixture(scope="module")
def earlier():
    return v3.earlier_world()


@pytest.fixture(scope="module")
def splits(earlier):
    return v3.generate(earlier=earlier)


@pytest.fixture(scope="module")
def report(splits, earlier):
    return v3.dedup_report_v3(splits, earlier)


def test_committed_files_equal_regeneration(splits):
    for key, records in splits.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        assert (DATA / f"{key}.jsonl").read_text(encoding="utf-8") == text, key
    meta = json.loads((DATA / "GENERATOR.json").read_text())
    assert meta["version"] == 3 and meta["counts"] == {k: len(v) for k, v in splits.items()}


def test_report_is_committed_and_has_no_violation(report):
    assert v3.dedup_violations_v3(report) == []
    assert json.loads((DATA / "GENERATOR.json").read_text())["dedup"] == json.loads(json.dumps(report))


def test_far_shares_no_template_fact_relation_or_verb_with_calibration(splits, report):
    for split in ("dev_far", "test_far"):
        for domain in ("math", "commonsense"):
            assert all(n == 0 for n in report["calibration_vs"][f"{domain} {split}"].values()), (domain, split)
        cal_templates = {v3.math_template(i["question"]) for i in splits["math/calibration"]}
        assert not {v3.math_template(i["question"]) for i in splits[f"math/{split}"]} & cal_templates
        relations = {v3._relation(r) for r in splits[f"commonsense/{split}"]}
        assert relations <= set(v3.FAR_RELATIONS) and len(relations) == len(v3.FAR_RELATIONS)
    assert {v3._relation(r) for r in splits["commonsense/calibration"]} == set(v3.NEAR_RELATIONS)


def test_near_is_calibration_templates_on_other_items(splits, report):
    for split in ("dev", "test"):
        n_math, n_cs = len(splits[f"math/{split}"]), len(splits[f"commonsense/{split}"])
        assert report["calibration_vs"][f"math {split}"]["items_with_a_calibration_template"] == n_math
        assert report["calibration_vs"][f"commonsense {split}"]["items_with_a_calibration_template"] == n_cs
        assert report["calibration_vs"][f"commonsense {split}"]["facts"] == 0
    for key, counts in report["exact"].items():
        assert all(n == 0 for n in counts.values()), key


def test_no_item_of_the_earlier_dev_or_test_split_is_reused(splits, earlier):
    read_math = {v2.mask_text(i["question"]) for s in ("dev", "test") for i in earlier[f"math/{s}"]}
    read_cs = v2.split_keys("commonsense", earlier["commonsense/dev"] + earlier["commonsense/test"])
    read_code = {p["prompt"] for s in ("dev", "test") for p in earlier[f"code/{s}"]}
    for split in v3.EVALUATED:
        assert not {v2.mask_text(i["question"]) for i in splits[f"math/{split}"]} & read_math
        assert not v2.split_keys("commonsense", splits[f"commonsense/{split}"]) & read_cs
    assert not {p["prompt"] for p in splits["code/test"]} & read_code
    assert all(p["task_id"].startswith("Micro/v3test/") for p in splits["code/test"])


def test_math_roles_and_fact_split():
    assert v3._math_role("add", ("buys",)) == "near"
    assert v3._math_role("add", ("wins",)) is None  # a near kind in a far phrasing is neither
    assert v3._math_role("sub_add", ("drops", "wins")) == "far"
    assert v3._math_role("difference", ()) == "far"
    assert v3._math_verbs("Tom gives away 3 of them.") == {"gives away"}
    for rel, subj, ans in v2.knowledge_facts():
        where = v3.fact_split_v3(rel, subj, ans)
        assert (where in ("dev_far", "test_far")) == (rel in v3.FAR_RELATIONS)
        if rel == "opposite":
            assert where == v3.fact_split_v3(rel, ans, subj)


def test_write_refuses_a_far_item_in_calibration(tmp_path, monkeypatch, splits):
    leaked = {k: list(v) for k, v in splits.items()}
    leaked["math/calibration"] = leaked["math/calibration"] + [leaked["math/dev_far"][0]]
    monkeypatch.setattr(v3, "generate", lambda *a, **k: leaked)
    with pytest.raises(RuntimeError, match="math dev_far"):
        v3.write(tmp_path)
    assert not any(tmp_path.iterdir())


def test_floors_are_recorded_for_every_evaluated_split():
    floors = json.loads((DATA / "GENERATOR.json").read_text())["floors"]
    for split in v3.EVALUATED:
        assert floors[f"math/{split}"]["exact_match"] >= 0.95
        assert floors[f"commonsense/{split}"]["accuracy"] >= 0.95
    assert set(floors) >= {"code/dev", "code/test"}


def test_files_load_through_the_project_loaders():
    for split in v3.RETAINED_SPLITS:
        assert len(load("math", str(DATA / "math"), split)) > 100
        assert len(load("choice", str(DATA / "commonsense"), split)) > 100
    assert len(load("code_problem", str(DATA / "code"), "test")) == 132
