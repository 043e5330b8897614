"""Loaders for every dataset the suite reads, from a local path or by Hugging Face hub name.

The same function reads the real datasets (GSM8K, CommonsenseQA, HumanEval, MBPP, code instruction
sets) and the project's generated micro benchmark, which is written in those datasets' formats.
Each loader returns a list of normalised dicts (schemas in `experiments.prompts`):

- `load_math`:              {"question", "answer"}
- `load_choice`:            {"id", "question", "choices", "labels", "answer_index"}
- `load_code_problems`:     {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
- `load_code_instructions`: {"instruction", "input", "response"}

`source` is either a local path (a file, or a directory holding one file per split) or a hub
dataset id. Local reading is plain JSON/JSONL (optionally gzip); hub reading goes through
`datasets.load_dataset`.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional

import datasets

from experiments.data.mbpp_conversion import mbpp_to_humaneval
from experiments.validation import ConfigError

_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class DataError(ConfigError):
    """A dataset is missing, empty or not in the expected format, or a benchmark key does not fit the data."""


def is_local(source: str) -> bool:
    """True when `source` names a local path (absolute, relative, or existing) rather than a hub id."""
    return source.startswith(("/", "./", "../", "~")) or Path(source).expanduser().exists()


def resolve_local_file(source: str, split: str, files: Optional[dict[str, str]] = None) -> Path:
    """The file holding `split` under a local `source` (a file is returned as is).

    In a directory, `files[split]` names the file when given; else `<split>.jsonl`, `<split>.json`,
    `<split>.jsonl.gz` or `<split>.json.gz` is used. A path that is not a regular file (a folder where a file is
    expected, a FIFO, a dangling or looping link) is a `DataError` saying what it is.
    """
    path = Path(source).expanduser()
    if not path.is_dir():
        return _regular_file(path, "local data path")
    if files and split in files:
        return _regular_file(path / files[split], f"split {split!r}: file")
    for suffix in _SUFFIXES:
        candidate = path / f"{split}{suffix}"
        if candidate.exists() or candidate.is_symlink():
            return _regular_file(candidate, f"split {split!r}: file")
    present = sorted(p.name for p in path.iterdir())
    raise DataError(
        f"no file for split {split!r} in {str(path)!r}; expected {split}.jsonl/.json[.gz] "
        f"or a `files` mapping; present: {present}"
    )


def _regular_file(path: Path, what: str) -> Path:
    """`path` when it is a regular file (or a link to one), else a `DataError`: `<what> '<path>' <what it is>`."""
    if path.is_file():
        return path
    if path.is_dir():
        problem = "is a folder, not a data file"
    elif path.exists():
        problem = "is not a regular file (a FIFO, socket or device)"
    elif path.is_symlink():
        problem = "is a symbolic link that leads nowhere (dangling, or a loop)"
    else:
        problem = "does not exist"
    raise DataError(f"{what} {str(path)!r} {problem}")


def _read_bytes(path: Path) -> bytes:
    """The bytes of a data file, decompressed when its name ends in .gz; a file that cannot be read (or
    decompressed) whole is a `DataError` naming it."""
    try:
        if path.suffix != ".gz":
            return path.read_bytes()
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except EOFError:
        raise DataError(f"{path}: the gzip data ends early: the file's {path.stat().st_size} bytes stop before its "
                        "end-of-stream marker (a truncated copy?)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: not readable as gzip ({exc})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def located_records(path: Path) -> list[tuple[str, dict]]:
    """Each record of a JSON list or JSON-lines file (gzip allowed) with where it is: `<file>:<line>` (JSON
    lines) or `<file>: item <i>` (a JSON list, from 1). Bytes that are not UTF-8, text that is not JSON, and a
    record that is not a JSON object are `DataError`s naming the file and the line (and byte or column)."""
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        where = " of the decompressed data" if path.suffix == ".gz" else ""
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {exc.start}{where}: {exc.reason})") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not a valid JSON list ({exc.msg}: column {exc.colno}; "
                            "a truncated copy?)") from None
        located = [(f"{path}: item {i}", item) for i, item in enumerate(items, 1)]
    else:
        located = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    located.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    for where, record in located:
        if not isinstance(record, dict):
            kind = _JSON_TYPES.get(type(record), type(record).__name__)
            raise DataError(f"{where}: a record must be a JSON object, not a JSON {kind} ({record!r:.60})")
    return located


def _hub_records(source: str, split: str, hub_config: Optional[str]) -> list[dict]:
    ds = datasets.load_dataset(source, hub_config, split=split)
    return [dict(r) for r in ds]


def raw_records(
    source: str, split: str, hub_config: Optional[str] = None, files: Optional[dict[str, str]] = None
) -> list[tuple[str, dict]]:
    """Unnormalised records of one split, from a local path or the hub, each with where it is (`located_records`;
    `hub:<id>[<split>] row <i>`); empty splits are an error."""
    if is_local(source):
        path = resolve_local_file(source, split, files)
        records = located_records(path)
        where = str(path)
    else:
        records = [(f"hub:{source}[{split}] row {i}", r) for i, r in enumerate(_hub_records(source, split, hub_config))]
        where = f"hub:{source}"
    if not records:
        raise DataError(f"dataset {where!r} split {split!r} is empty")
    return records


def _require(record: dict, keys: Iterable[str], what: str, where: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise DataError(f"{where}: a {what} record lacks {missing}; has {sorted(record)}")


def normalise_math(record: dict, where: str = "math") -> dict:
    """GSM8K record -> {"question", "answer"}."""
    _require(record, ("question", "answer"), "math (GSM8K)", where)
    return {"question": record["question"], "answer": record["answer"]}


def normalise_choice(record: dict, where: str = "choice") -> dict:
    """CommonsenseQA record (local JSONL or hub layout) -> normalised multiple-choice item."""
    _require(record, ("question", "answerKey"), "multiple-choice (CommonsenseQA)", where)
    q = record["question"]
    if isinstance(q, dict):  # original JSONL: question.stem, question.choices[{label, text}]
        stem = q["stem"]
        labels = [c["label"] for c in q["choices"]]
        texts = [c["text"] for c in q["choices"]]
    else:  # hub layout: question str, choices {label: [...], text: [...]}
        stem = q
        labels = list(record["choices"]["label"])
        texts = list(record["choices"]["text"])
    if record["answerKey"] not in labels:
        raise DataError(f"{where}: answerKey {record['answerKey']!r} not among labels {labels}")
    return {
        "id": str(record.get("id", "")),
        "question": stem,
        "choices": texts,
        "labels": labels,
        "answer_index": labels.index(record["answerKey"]),
    }


def normalise_code_problem(record: dict, where: str = "code") -> dict:
    """HumanEval record as is; MBPP record (`text`/`prompt` + `test_list`) converted to HumanEval format."""
    if "test_list" in record:
        try:
            return mbpp_to_humaneval(record)
        except (KeyError, TypeError, ValueError, AttributeError, SyntaxError) as exc:
            raise DataError(f"{where}: an MBPP record that cannot be converted ({type(exc).__name__}: {exc})") from None
    _require(record, ("task_id", "prompt", "canonical_solution", "test", "entry_point"), "HumanEval", where)
    return {k: record[k] for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}


def normalise_code_instruction(record: dict, where: str = "code instruction") -> dict:
    """Instruction record (`instruction`, optional `input`, `response` or `output`) -> normalised item."""
    _require(record, ("instruction",), "code instruction", where)
    response = record.get("response", record.get("output"))
    if response is None:
        raise DataError(f"{where}: a code instruction record lacks 'response'/'output'; has {sorted(record)}")
    return {"instruction": record["instruction"], "input": record.get("input", "") or "", "response": response}


NORMALISERS = {
    "math": normalise_math,
    "choice": normalise_choice,
    "code_problem": normalise_code_problem,
    "code_instruction": normalise_code_instruction,
}


def load(
    kind: str,
    source: str,
    split: str,
    hub_config: Optional[str] = None,
    files: Optional[dict[str, str]] = None,
) -> list[dict]:
    """Load and normalise one split of a dataset of `kind` (math, choice, code_problem, code_instruction)."""
    if kind not in NORMALISERS:
        raise DataError(f"dataset kind {kind!r} is unknown; allowed: {sorted(NORMALISERS)}")
    normalise = NORMALISERS[kind]
    return [normalise(r, where) for where, r in raw_records(source, split, hub_config, files)]


def load_math(source: str, split: str, **kw: Any) -> list[dict]:
    """GSM8K-format math items."""
    return load("math", source, split, **kw)


def load_choice(source: str, split: str, **kw: Any) -> list[dict]:
    """CommonsenseQA-format multiple-choice items."""
    return load("choice", source, split, **kw)


def load_code_problems(source: str, split: str, **kw: Any) -> list[dict]:
    """HumanEval-format code problems (MBPP converted)."""
    return load("code_problem", source, split, **kw)


def load_code_instructions(source: str, split: str, **kw: Any) -> list[dict]:
    """Code instruction-tuning items."""
    return load("code_instruction", source, split, **kw)
