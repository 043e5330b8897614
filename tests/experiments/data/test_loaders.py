"""The real loaders on the real datasets in ../shared/data, and their failure modes."""

import gzip
import json
import os
import re

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


# -- a damaged data file is a DataError naming the file and where in it (run.py: one line, exit code 2)
INSTRUCTIONS = [{"instruction": f"task {i}", "response": f"answer {i}"} for i in range(3)]


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


FIRST_LINE = len(_jsonl(INSTRUCTIONS[:1]))  # bytes


@pytest.mark.parametrize("name, content, message", [
    ("train.json", json.dumps(INSTRUCTIONS, indent=1).encode()[:-12],
     "train.json:12: not a valid JSON list (Unterminated string starting at: column 15; a truncated copy?)"),
    ("train.jsonl.gz", gzip.compress(_jsonl(INSTRUCTIONS))[:30],
     "train.jsonl.gz: the gzip data ends early: the file's 30 bytes stop before its end-of-stream marker"),
    ("train.jsonl.gz", _jsonl(INSTRUCTIONS), "train.jsonl.gz: not readable as gzip (Not a gzipped file"),
    ("train.jsonl", _jsonl(INSTRUCTIONS[:1]) + b'{"instruction": "caf\xe9", "response": "x"}\n',
     f"train.jsonl:2: not UTF-8 text (byte {FIRST_LINE + 20}: invalid continuation byte)"),
    ("train.jsonl.gz", gzip.compress(_jsonl(INSTRUCTIONS[:1]) + b'{"instruction": "\xff"}\n'),
     f"train.jsonl.gz:2: not UTF-8 text (byte {FIRST_LINE + 17} of the decompressed data: invalid start byte)"),
    ("train.jsonl", _jsonl(INSTRUCTIONS[:2]) + b"[1, 2]\n",
     "train.jsonl:3: a record must be a JSON object, not a JSON array ([1, 2])"),
    ("train.json", json.dumps([*INSTRUCTIONS, "text"]).encode(),
     "train.json: item 4: a record must be a JSON object, not a JSON string ('text')"),
], ids=["truncated-json-list", "truncated-gz", "not-gz", "invalid-utf8", "invalid-utf8-in-gz", "list-line",
        "string-item"])
def test_a_damaged_data_file_names_the_file_and_where(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}/{message}")):
        load_code_instructions(str(tmp_path), "train")


def test_a_record_missing_a_key_names_its_file_and_line(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(_jsonl(INSTRUCTIONS) + b'\n{"instruction": "no answer"}\n')
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}/train.jsonl:5: a code instruction record lacks")):
        load_code_instructions(str(tmp_path), "train")


def test_an_mbpp_record_that_cannot_be_converted_names_its_item(tmp_path):
    (tmp_path / "test.json").write_text(json.dumps([{"task_id": 11, "test_list": ["assert f(1) == 1"]}]))
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}/test.json: item 1: an MBPP record that cannot be "
                                                  "converted (KeyError")):
        load_code_problems(str(tmp_path), "test")


@pytest.mark.parametrize("make, what", [
    (lambda p: p.mkdir(), "is a folder, not a data file"),
    (lambda p: os.mkfifo(p), "is not a regular file (a FIFO, socket or device)"),
    (lambda p: p.symlink_to(p), "is a symbolic link that leads nowhere (dangling, or a loop)"),
], ids=["folder", "fifo", "symlink-loop"])
def test_a_data_path_that_is_not_a_file_says_what_it_is(tmp_path, make, what):
    make(tmp_path / "train.jsonl")
    with pytest.raises(DataError, match=re.escape(f"split 'train': file '{tmp_path}/train.jsonl' {what}")):
        load_code_instructions(str(tmp_path), "train")
    with pytest.raises(DataError, match=re.escape(f"split 'train': file '{tmp_path}/train.jsonl' {what}")):
        load_code_instructions(str(tmp_path), "train", files={"train": "train.jsonl"})
    if what.startswith("is not"):  # the source itself: a FIFO is not taken for a folder
        with pytest.raises(DataError, match=re.escape(f"local data path '{tmp_path}/train.jsonl' {what}")):
            load_code_instructions(str(tmp_path / "train.jsonl"), "train")
