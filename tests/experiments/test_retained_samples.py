"""`suite_schema.retained_samples`: the entries a run stores of its retained answers, and the torch-free reader."""

import json
import subprocess
import sys

import pytest

from suite_schema import retained_samples as RS
from suite_schema.layout import RETAINED_SAMPLES_NAME
from tests.conftest import REPO

MATH = [{"question": "What is 1 + 2?", "answer": "#### 3"}, {"question": "What is 2 + 2?", "answer": "#### 4"}]
CHOICE = [{"id": "c1", "question": "Where do you sleep?", "choices": ["bedroom", "ocean"], "answer_index": 0},
          {"id": "", "question": "What swims?", "choices": ["fish", "car", "rock"], "answer_index": 0}]


def samples():
    return (RS.math_samples("near", "math", MATH, ["3", "4"], ["3", None], ["3", "5"], [" 3", "so 5"], ["x 3", ""])
            + RS.choice_samples("near", "commonsense", CHOICE, [0, 2], [0, 1], [1, 2], [0, 2])
            + RS.math_samples("far", "math", MATH[:1], ["3"], [None], [None], ["no number"]))


def test_entries_mark_changed_answers_and_raw_choice_flips():
    s = samples()
    assert [(e["set"], e["domain"], e["index"], e["changed"]) for e in s] == [
        ("near", "math", 0, False), ("near", "math", 1, True),
        ("near", "commonsense", 0, False), ("near", "commonsense", 1, True), ("far", "math", 0, False)]
    assert s[1] == {"set": "near", "domain": "math", "kind": "math", "index": 1, "id": None, "prompt": "What is 2 + 2?",
                    "gold": "4", "base_answer": None, "adapted_answer": "5", "base_text": "", "adapted_text": "so 5",
                    "changed": True}
    # The normalised choice flipped on item 0 but the raw one did not: not changed. An empty id is no id.
    assert (s[2]["id"], s[2]["base_choice_norm"], s[2]["adapted_choice_norm"], s[2]["changed"]) == ("c1", 1, 0, False)
    assert s[3]["id"] is None and s[3]["choices"] == ["fish", "car", "rock"] and s[3]["gold"] == 0
    assert s[4]["base_text"] is None  # no base texts given
    assert all(RS.entry_problem(e) is None for e in s)
    with pytest.raises(ValueError, match="adapted_texts has 1 entries for 2 items"):
        RS.math_samples("near", "math", MATH, ["3", "4"], ["3", "4"], ["3", "4"], ["3"])
    with pytest.raises(ValueError, match="set='mid' is not allowed: one of near, far"):
        RS.choice_samples("mid", "commonsense", CHOICE, [0, 0], [0, 0], [0, 0], [0, 0])


def test_changed_samples_filters_by_domain_and_set_and_limits():
    s = samples() + RS.choice_samples("far", "commonsense", CHOICE[:1], [0], [1], [0], [0])
    assert [(e["set"], e["domain"]) for e in RS.changed_samples(s)] == [
        ("near", "math"), ("near", "commonsense"), ("far", "commonsense")]
    assert [e["set"] for e in RS.changed_samples(s, domain="commonsense")] == ["near", "far"]
    assert [e["domain"] for e in RS.changed_samples(s, set="far")] == ["commonsense"]
    assert RS.changed_samples(s, domain="math", set="far") == []
    assert RS.changed_samples(s, limit=1) == RS.changed_samples(s)[:1] and RS.changed_samples(s, limit=0) == []
    with pytest.raises(ValueError, match="set='all' is not allowed"):
        RS.changed_samples(s, set="all")
    with pytest.raises(ValueError, match="limit=-1 is not allowed"):
        RS.changed_samples(s, limit=-1)


def test_reader_returns_the_stored_entries_none_without_a_file_and_names_a_bad_one(tmp_path):
    assert RS.read_retained_samples(tmp_path) is None
    (tmp_path / RETAINED_SAMPLES_NAME).write_text(json.dumps(samples()))
    assert RS.read_retained_samples(tmp_path) == samples()
    assert RS.read_retained_samples(str(tmp_path)) == samples()
    for content, problem in [
        ("{", "cannot be read"),
        (json.dumps({"a": 1}), "holds a dict, not a list"),
        (json.dumps([samples()[0], {"set": "near"}]), "entry 1: an entry lacks domain"),
        (json.dumps([{**samples()[0], "kind": "code"}]), "entry 0: kind 'code' is not one of math, choice"),
        (json.dumps([{k: v for k, v in samples()[2].items() if k != "choices"}]), "a choice entry lacks choices"),
        (json.dumps([{**samples()[0], "changed": 1}]), "changed is 1, not true or false"),
    ]:
        (tmp_path / RETAINED_SAMPLES_NAME).write_text(content)
        with pytest.raises(ValueError, match=problem) as err:
            RS.read_retained_samples(tmp_path)
        assert str(tmp_path / RETAINED_SAMPLES_NAME) in str(err.value)


def test_the_reader_imports_no_torch_and_nothing_of_the_runtime():
    code = ("import json, sys; import suite_schema.retained_samples\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'experiments'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
