"""The result record: where it lives, its version, its statuses, and what a complete one must hold.

A record is one JSON object per run, `<run_dir>/record.json`, written whole by the runtime (`experiments.records`)
and read by analysis (`analysis.collect`). A run evaluated at post-hoc scales other than 1 has one more record per
scale, `<run_dir>/scales/<alpha>/record.json`, with the run id `<run_id>@<alpha>`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

RECORD_NAME = "record.json"
#: Every code completion of an evaluation with its sandbox verdict, next to the record it belongs to.
CODE_SAMPLES_NAME = "code_samples.json"
#: What the model answered on every retained item, base beside it (`suite_schema.retained_samples`), next to the record.
RETAINED_SAMPLES_NAME = "retained_samples.json"
#: A run's records at post-hoc scales other than 1: <run_dir>/scales/<alpha>/record.json.
SCALES_DIR = "scales"
SUPERSEDED_DIR = "superseded"  # <run_dir>/superseded/<sha12>/: records of a run made again by newer code
SCHEMA_VERSION = 1  # what the runtime writes
SCHEMA_VERSIONS = (1,)  # what analysis reads
STATUS_COMPLETE = "complete"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"
STATUS_RUNNING = "running"
STATUSES = (STATUS_COMPLETE, STATUS_FAILED, STATUS_INTERRUPTED, STATUS_RUNNING)

#: The split final numbers are evaluated on; records of any other split (`dev`) carry the benchmark name
#: `<benchmark>@<split>`, so they form their own group in every table and never mix with evaluation records.
EVALUATION_SPLIT = "test"
TRAIN_KNOBS = ("steps", "lr")  # the `config.train` keys analysis reads as knobs

# Top-level keys every complete record carries, with the JSON types allowed.
REQUIRED = {
    "schema_version": (int,),
    "run_id": (str,),
    "status": (str,),
    "method": (str,),
    "backbone": (str,),
    "benchmark": (str,),
    "seed": (int,),
    "knobs": (dict,),
    "config": (dict,),
}
# Rates and accuracies inside a retained domain: {"rate"|"accuracy": x, "n": n}.
RATE_KEYS = ("answer_change_rate", "choice_flip_rate", "choice_flip_rate_norm")
ACCURACY_KEYS = ("base_accuracy", "adapted_accuracy", "base_accuracy_norm", "adapted_accuracy_norm")
COST_KEYS = (
    "train_seconds", "tokens_seen", "peak_memory_bytes", "trainable_params", "total_params", "stored_bytes",
    "decode_tokens_per_s", "eval_seconds",
)

#: The ledger of test-split reads: `<run_root>/test_reads.jsonl`, one JSON object per line, appended by the runtime
#: (`experiments.read_ledger`) when a run starts evaluating on `EVALUATION_SPLIT` (a dev run appends nothing) and read
#: by `analysis report` (`analysis.read_ledger`). A committed result folder keeps it next to its `records/`.
TEST_READS_NAME = "test_reads.jsonl"
#: `python -m experiments.protocol`'s log of its chunks, one JSON object per line: `<run_root>/protocol.jsonl`.
PROTOCOL_CHUNKS_NAME = "protocol.jsonl"
#: The files the runtime itself writes into a run root: a checkout whose only changes are these (a run root inside
#: it, its records committed) runs the code of its commit, so they do not mark a record `git_dirty`.
RUN_OUTPUT_NAMES = (RECORD_NAME, CODE_SAMPLES_NAME, RETAINED_SAMPLES_NAME, TEST_READS_NAME, PROTOCOL_CHUNKS_NAME)
#: The keys of one ledger line: when (UTC, ISO 8601), the code (`git_sha`, `git_dirty` as in a record's provenance),
#: the run (`run_id`, `method`, `knobs` as in its record, `train` = its `config.train` steps and lr, `seed`), what it
#: read (`backbone`, `benchmark`, `split`, the post-hoc `scales` evaluated) and `content_sha256`: the sha256 of the
#: split's evaluation items as the run loaded them (`experiments.read_ledger.content_hash`).
TEST_READ_FIELDS = ("time", "git_sha", "git_dirty", "run_id", "method", "knobs", "train", "seed", "backbone",
                    "benchmark", "split", "scales", "content_sha256")


def ledger_line_problem(line: Any) -> Optional[str]:
    """None when `line` (a parsed ledger line) carries every `TEST_READ_FIELDS` key with a usable type, else why not."""
    if not isinstance(line, dict):
        return f"a JSON {type_name(line)}, expected an object"
    missing = [k for k in TEST_READ_FIELDS if k not in line]
    if missing:
        return f"missing {', '.join(missing)}"
    for key in ("time", "run_id", "method", "backbone", "benchmark"):
        if not isinstance(line[key], str) or not line[key]:
            return f"{key!r} is {type_name(line[key])}, expected a non-empty string"
    if not isinstance(line["knobs"], dict):
        return f"'knobs' is {type_name(line['knobs'])}, expected an object"
    return None


_TYPE_NAMES = {int: "integer", float: "number", str: "string", dict: "object", list: "array", bool: "boolean"}


def benchmark_label(name: str, split: str) -> str:
    """The record's `benchmark`: the benchmark's name, with `@<split>` for any split but `EVALUATION_SPLIT`."""
    return name if split == EVALUATION_SPLIT else f"{name}@{split}"


def scale_label(alpha: float) -> str:
    """How a post-hoc scale appears in folder names and run ids: `0.5`, `1`, `0.25`."""
    return f"{float(alpha):g}"


def scale_run_id(run_id: str, alpha: float) -> str:
    """The run id of the record of training run `run_id` evaluated at post-hoc scale `alpha`."""
    return f"{run_id}@{scale_label(alpha)}"


def scale_dir(run_dir: Path, alpha: float) -> Path:
    """Where the record of a run at post-hoc scale `alpha` (other than 1) lives: <run_dir>/scales/<alpha>/."""
    return Path(run_dir) / SCALES_DIR / scale_label(alpha)


def type_name(value: Any) -> str:
    """The JSON type name of `value` (`null`, `integer`, `number`, `string`, ...)."""
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _check_type(record: dict, key: str, types: tuple) -> Optional[str]:
    if key not in record:
        return f"missing required key {key!r}"
    value = record[key]
    ok = any(is_int(value) if t is int else isinstance(value, t) for t in types)
    if not ok:
        allowed = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        return f"{key!r} is {type_name(value)} ({value!r:.60}), expected {allowed}"
    return None


def validate(record: Any) -> Optional[str]:
    """None when `record` is a usable record of any status, else the reason it is malformed.

    Failed, interrupted and running records need only `run_id` and `status`; a complete record
    needs every key in `REQUIRED` plus `metrics.target.pass@1` (a number in [0, 1]),
    `metrics.retained_near` (earlier records: `metrics.retained`; an object of domains, each with a finite
    `kl_token_mean`; `metrics.retained_far` alike where present) and a finite
    `metrics.retained_kl_mean`. Optional parts (`cost`, `train`, `scale`, rates) are type-checked
    when present.
    """
    if not isinstance(record, dict):
        return f"the file holds a JSON {type_name(record)}, expected an object"
    for key in ("run_id", "status"):
        problem = _check_type(record, key, REQUIRED[key])
        if problem:
            return problem
    if not record["run_id"]:
        return "'run_id' is empty"
    status = record["status"]
    if status not in STATUSES:
        return f"unknown status {status!r} (expected one of {', '.join(STATUSES)})"
    if status != STATUS_COMPLETE:
        return None
    for key, types in REQUIRED.items():
        problem = _check_type(record, key, types)
        if problem:
            return problem
    if record["schema_version"] not in SCHEMA_VERSIONS:
        return f"unsupported schema_version {record['schema_version']} (this analysis reads {SCHEMA_VERSIONS})"
    return _validate_complete(record)


#: Where a record keeps its retained metrics per domain: `retained_near` (the domain's own evaluation split; records
#: made before far items existed call it `retained`) and `retained_far` (far items, where the benchmark has them).
NEAR_KEY, EARLIER_NEAR_KEY, FAR_KEY = "retained_near", "retained", "retained_far"


def retained_near(metrics: dict) -> dict:
    """A complete record's near retained metrics per domain (`retained_near`, or `retained` in earlier records)."""
    return metrics[NEAR_KEY] if NEAR_KEY in metrics else metrics[EARLIER_NEAR_KEY]


def retained_far(metrics: dict) -> dict:
    """A complete record's far retained metrics per domain; empty when its benchmark had no far items."""
    return metrics.get(FAR_KEY) or {}


def _validate_domains(metrics: dict, name: str, required: bool) -> Optional[str]:
    retained = metrics.get(name)
    if retained is None and not required:
        return None
    if not isinstance(retained, dict):
        return f"missing 'metrics.{name}'" if retained is None else (
            f"'metrics.{name}' is {type_name(retained)}, expected object")
    for dom, entry in retained.items():
        if not isinstance(entry, dict):
            return f"'metrics.{name}.{dom}' is {type_name(entry)}, expected object"
        kl = entry.get("kl_token_mean")
        if not _is_finite(kl):
            return f"'metrics.{name}.{dom}.kl_token_mean' is {type_name(kl)}, expected a finite number"
        for key in ("kl_seq_mean", "n_tokens", "n"):
            if key in entry and entry[key] is not None and not is_number(entry[key]):
                return f"'metrics.{name}.{dom}.{key}' is {type_name(entry[key])}, expected a number"
        for key in RATE_KEYS + ACCURACY_KEYS:
            if key in entry and entry[key] is not None:
                inner = entry[key]
                field = "rate" if key in RATE_KEYS else "accuracy"
                if not isinstance(inner, dict) or (inner.get(field) is not None and not is_number(inner.get(field))):
                    return f"'metrics.{name}.{dom}.{key}' is malformed, expected {{{field!r}: number, 'n': count}}"
    return None


def _validate_complete(record: dict) -> Optional[str]:
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        return "missing required key 'metrics'" if metrics is None else f"'metrics' is {type_name(metrics)}, expected object"
    target = metrics.get("target")
    if not isinstance(target, dict):
        return "missing 'metrics.target'" if target is None else f"'metrics.target' is {type_name(target)}, expected object"
    p1 = target.get("pass@1")
    if not _is_finite(p1) or not 0.0 <= p1 <= 1.0:
        return "missing 'metrics.target.pass@1'" if "pass@1" not in target else (
            f"'metrics.target.pass@1' is {type_name(p1)} ({p1!r:.40}), expected a number in [0, 1]")
    for key, value in target.items():
        if key.startswith("pass@") and value is not None and not _is_finite(value):
            return f"'metrics.target.{key}' is {type_name(value)}, expected a number"
    near_key = NEAR_KEY if NEAR_KEY in metrics else EARLIER_NEAR_KEY
    for name, required in ((near_key, True), (FAR_KEY, False)):
        problem = _validate_domains(metrics, name, required)
        if problem:
            return problem
    kl_mean = metrics.get("retained_kl_mean")
    if not _is_finite(kl_mean):
        return "missing 'metrics.retained_kl_mean'" if "retained_kl_mean" not in metrics else (
            f"'metrics.retained_kl_mean' is {type_name(kl_mean)} ({kl_mean!r:.40}), expected a finite number")
    cost = record.get("cost")
    if cost is not None:
        if not isinstance(cost, dict):
            return f"'cost' is {type_name(cost)}, expected object"
        for key, value in cost.items():
            # Costs are numbers; a method may add boolean flags (e.g. a statistics cache hit).
            if value is not None and not is_number(value) and not isinstance(value, bool):
                return f"'cost.{key}' is {type_name(value)}, expected a number or a boolean flag"
    train = record.get("train")
    if train is not None and not isinstance(train, dict):
        return f"'train' is {type_name(train)}, expected object or null"
    if "scale" in record and record["scale"] is not None and not _is_finite(record["scale"]):
        return f"'scale' is {type_name(record['scale'])}, expected a number"
    tcfg = record["config"].get("train")
    if tcfg is not None and not isinstance(tcfg, dict):
        return f"'config.train' is {type_name(tcfg)}, expected object"
    for key in TRAIN_KNOBS:
        value = (tcfg or {}).get(key)
        if value is not None and not is_number(value):
            return f"'config.train.{key}' is {type_name(value)}, expected a number"
    return None


#: A run directory's own subfolders, where no record a reader wants lives (checkpoints, exports, W&B files).
RUN_SUBDIRS = (".hydra", "wandb", "checkpoints", "export", SUPERSEDED_DIR, "__pycache__")


def find_records(dirs: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """Record files under `dirs` (recursively; a path may also be a record file) and run directories
    without one (a folder holding `.hydra/` or `run.log` but no `record.json`: still running, or killed
    before writing). Both lists are sorted, each path once."""
    records: set[Path] = set()
    bare: set[Path] = set()
    for d in dirs:
        root = Path(d)
        if root.is_file():
            records.add(root)
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such run directory or record file")
        for cur, subdirs, files in os.walk(root):
            subdirs.sort()
            here = Path(cur)
            if RECORD_NAME in files:
                records.add(here / RECORD_NAME)
            elif ".hydra" in subdirs or "run.log" in files:
                bare.add(here)
            # Nothing analysis needs lives in a run's own subfolders (checkpoints, exports, W&B files).
            is_run = RECORD_NAME in files or ".hydra" in subdirs or "run.log" in files
            skip = RUN_SUBDIRS if is_run else (".hydra", "__pycache__")
            subdirs[:] = [s for s in subdirs if s not in skip]
    return sorted(records, key=str), sorted(bare, key=str)
