"""The real loaders on the real datasets in ../shared/data, and their failure modes."""

import json

import pytest

from experiments.data.loaders import (
    DataError,
    load_choice,
    load_code_instructions,
    load_code_problems,
    load_math,
    resolve_local_file,
)


def test_gsm8k_local(shared_data):
    train = load_math(str(shared_data / "gsm8k"), "train")
    test = load_math(str(shared_data / "gsm8k"), "test")
    assert (len(train), len(test)) == (7473, 1319)
    assert all(item["answer"].split("####")[-1].strip() for item in test)


def test_commonsenseqa_local(shared_data):
    files = {"train": "train_rand_split.jsonl", "validation": "dev_rand_split.jsonl"}
    dev = load_choice(str(shared_data / "commonsenseqa"), "validation", files=files)
    assert len(dev) == 1221
    first = dev[0]
    assert first["labels"] == ["A", "B", "C", "D", "E"] and len(first["choices"]) == 5
    assert first["choices"][first["answer_index"]] == "bank"  # answerKey A of the first dev record


def test_commonsenseqa_hub_layout_normalises_like_local():
    hub = {"id": "x", "question": "Where?", "choices": {"label": ["A", "B"], "text": ["here", "there"]}, "answerKey": "B"}
    from experiments.data.loaders import normalise_choice

    assert normalise_choice(hub) == {"id": "x", "question": "Where?", "choices": ["here", "there"],
                                     "labels": ["A", "B"], "answer_index": 1}


def test_humaneval_local(shared_data):
    problems = load_code_problems(str(shared_data / "humaneval"), "test", files={"test": "HumanEval.jsonl.gz"})
    assert len(problems) == 164
    assert problems[0]["task_id"] == "HumanEval/0" and problems[0]["entry_point"] == "has_close_elements"


def test_mbpp_local_converted_to_humaneval_format(shared_data):
    problems = load_code_problems(str(shared_data / "mbpp" / "sanitized-mbpp.json"), "test")
    assert len(problems) == 427
    assert {"task_id", "prompt", "canonical_solution", "test", "entry_point"} <= set(problems[0])


def test_code_instructions_local(shared_data):
    items = load_code_instructions(str(shared_data / "gpteacher_codegen" / "codegen-instruct.json"), "train")
    assert len(items) == 4535
    assert set(items[0]) == {"instruction", "input", "response"} and items[0]["response"]


def test_missing_local_path_names_the_path(tmp_path):
    with pytest.raises(DataError, match="local data path .*nowhere.* does not exist"):
        load_math(str(tmp_path / "nowhere"), "test")


def test_missing_split_lists_present_files(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(DataError, match=r"no file for split 'test'.*present: \['train.jsonl'\]"):
        resolve_local_file(str(tmp_path), "test")


def test_empty_dataset_is_an_error(tmp_path):
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(DataError, match="split 'test' is empty"):
        load_math(str(tmp_path), "test")


def test_wrong_schema_names_missing_keys(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(DataError, match=r"lacks \['question', 'answer'\]"):
        load_math(str(tmp_path), "test")
