"""The result record as analysis reads it: validation and the flat row of one complete run.

A record is one JSON object per run (`<run_dir>/record.json`, written by the training runtime).
This module is the one definition of the record's layout: the runtime (`experiments.records`) takes
its names and statuses from here, and it imports nothing from the runtime: analysis reads files only.

`validate(record)` returns the reason a record cannot be used (or None); `to_row(record)` turns
a valid complete record into one flat dict whose keys are the table's columns:

    run_id, source, status, method, backbone, benchmark (`micro`; `micro@dev` for a dev-split record, as the runtime names it), seed,
    scale, sweep_key, train_key,
    knob/<name> (every `knobs` entry but `name`), knob/train.steps, knob/train.lr,
    target/<metric> (pass@1, pass@k, n_problems, n_samples), retained_kl_mean,
    retained/<domain>/<metric> (kl_token_mean, kl_seq_mean, n_tokens, n, the rates and accuracies),
    retained/<domain>/kind (math | choice | other), cost/<field>, train/final_loss, train/steps,
    provenance/git_sha, provenance/git_dirty, provenance/end_time, provenance/machine (CPU model / vector ISA / CUDA
    device, only for records that carry it), config_key.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Optional

RECORD_NAME = "record.json"
#: Every code completion of an evaluation with its sandbox verdict, next to the record it belongs to.
CODE_SAMPLES_NAME = "code_samples.json"
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
#: `<benchmark>@<split>` (the runtime writes it so; older records get it here), so they form their own group in
#: every table and never mix with evaluation records.
EVALUATION_SPLIT = "test"
# The coding axis (higher is better) and the headline retained axis (lower is better).
TARGET_COL = "target/pass@1"
KL_MEAN_COL = "retained_kl_mean"
SCALE_COL = "scale"
KNOB_PREFIX = "knob/"
TRAIN_KNOBS = ("steps", "lr")
#: Config keys added after runs were recorded, each with the value that computes what runs did before the key
#: existed. The runtime leaves such a key out of the run id at that value, so earlier runs keep their ids
#: (`experiments.records.scientific_config`); analysis reads a record without the key as made at that value
#: (`analysis.variants`), whatever the default is now.
LATER_KEYS = {
    "method.filter_basis": None,  # ATLAS's filters each in the full input space
    "method.filter_members": "kmeans",  # ATLAS's filters fitted on the k-means clusters
}

# Top-level keys every record carries, with the JSON types allowed.
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

_TYPE_NAMES = {int: "integer", float: "number", str: "string", dict: "object", list: "array", bool: "boolean"}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _check_type(record: dict, key: str, types: tuple) -> Optional[str]:
    if key not in record:
        return f"missing required key {key!r}"
    value = record[key]
    ok = any(_is_int(value) if t is int else isinstance(value, t) for t in types)
    if not ok:
        allowed = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        return f"{key!r} is {_type_name(value)} ({value!r:.60}), expected {allowed}"
    return None


def validate(record: Any) -> Optional[str]:
    """None when `record` is a usable record of any status, else the reason it is malformed.

    Failed, interrupted and running records need only `run_id` and `status`; a complete record
    needs every key in `REQUIRED` plus `metrics.target.pass@1` (a number in [0, 1]),
    `metrics.retained` (an object of domains, each with a finite `kl_token_mean`) and a finite
    `metrics.retained_kl_mean`. Optional parts (`cost`, `train`, `scale`, rates) are type-checked
    when present.
    """
    if not isinstance(record, dict):
        return f"the file holds a JSON {_type_name(record)}, expected an object"
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


def _validate_complete(record: dict) -> Optional[str]:
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        return "missing required key 'metrics'" if metrics is None else f"'metrics' is {_type_name(metrics)}, expected object"
    target = metrics.get("target")
    if not isinstance(target, dict):
        return "missing 'metrics.target'" if target is None else f"'metrics.target' is {_type_name(target)}, expected object"
    p1 = target.get("pass@1")
    if not _is_finite(p1) or not 0.0 <= p1 <= 1.0:
        return "missing 'metrics.target.pass@1'" if "pass@1" not in target else (
            f"'metrics.target.pass@1' is {_type_name(p1)} ({p1!r:.40}), expected a number in [0, 1]")
    for key, value in target.items():
        if key.startswith("pass@") and value is not None and not _is_finite(value):
            return f"'metrics.target.{key}' is {_type_name(value)}, expected a number"
    retained = metrics.get("retained")
    if not isinstance(retained, dict):
        return "missing 'metrics.retained'" if retained is None else (
            f"'metrics.retained' is {_type_name(retained)}, expected object")
    for dom, entry in retained.items():
        if not isinstance(entry, dict):
            return f"'metrics.retained.{dom}' is {_type_name(entry)}, expected object"
        kl = entry.get("kl_token_mean")
        if not _is_finite(kl):
            return f"'metrics.retained.{dom}.kl_token_mean' is {_type_name(kl)}, expected a finite number"
        for key in ("kl_seq_mean", "n_tokens", "n"):
            if key in entry and entry[key] is not None and not _is_number(entry[key]):
                return f"'metrics.retained.{dom}.{key}' is {_type_name(entry[key])}, expected a number"
        for key in RATE_KEYS + ACCURACY_KEYS:
            if key in entry and entry[key] is not None:
                inner = entry[key]
                field = "rate" if key in RATE_KEYS else "accuracy"
                if not isinstance(inner, dict) or (inner.get(field) is not None and not _is_number(inner.get(field))):
                    return f"'metrics.retained.{dom}.{key}' is malformed, expected {{{field!r}: number, 'n': count}}"
    kl_mean = metrics.get("retained_kl_mean")
    if not _is_finite(kl_mean):
        return "missing 'metrics.retained_kl_mean'" if "retained_kl_mean" not in metrics else (
            f"'metrics.retained_kl_mean' is {_type_name(kl_mean)} ({kl_mean!r:.40}), expected a finite number")
    cost = record.get("cost")
    if cost is not None:
        if not isinstance(cost, dict):
            return f"'cost' is {_type_name(cost)}, expected object"
        for key, value in cost.items():
            # Costs are numbers; a method may add boolean flags (e.g. a statistics cache hit).
            if value is not None and not _is_number(value) and not isinstance(value, bool):
                return f"'cost.{key}' is {_type_name(value)}, expected a number or a boolean flag"
    train = record.get("train")
    if train is not None and not isinstance(train, dict):
        return f"'train' is {_type_name(train)}, expected object or null"
    if "scale" in record and record["scale"] is not None and not _is_finite(record["scale"]):
        return f"'scale' is {_type_name(record['scale'])}, expected a number"
    tcfg = record["config"].get("train")
    if tcfg is not None and not isinstance(tcfg, dict):
        return f"'config.train' is {_type_name(tcfg)}, expected object"
    for key in TRAIN_KNOBS:
        value = (tcfg or {}).get(key)
        if value is not None and not _is_number(value):
            return f"'config.train.{key}' is {_type_name(value)}, expected a number"
    return None


def knob_value(value: Any) -> Any:
    """A knob value as a table cell: scalars as they are, anything else as canonical JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def domain_kind(entry: dict) -> str:
    """`math` (answers compared), `choice` (choices compared) or `other`, from the metrics a domain carries."""
    if "answer_change_rate" in entry:
        return "math"
    if "choice_flip_rate" in entry:
        return "choice"
    return "other"


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def knobs_of(record: dict) -> dict:
    """The knob values of a record: `knobs` (minus `name` and `seed`), train steps and lr, and scale."""
    knobs = {f"{KNOB_PREFIX}{k}": knob_value(v) for k, v in sorted(record["knobs"].items()) if k not in ("name", "seed")}
    tcfg = record["config"].get("train") or {}
    for key in TRAIN_KNOBS:
        knobs[f"{KNOB_PREFIX}train.{key}"] = tcfg.get(key)
    return knobs


def scale_of(record: dict) -> float:
    """The post-hoc interpolation scale of a record (1.0 when the record carries none)."""
    value = record.get("scale")
    return 1.0 if value is None else float(value)


def split_of(record: dict) -> Optional[str]:
    """The evaluation split a record was made on (`config.benchmark.split`; None when the record has none)."""
    bench = (record.get("config") or {}).get("benchmark")
    value = bench.get("split") if isinstance(bench, dict) else None
    return None if value is None else str(value)


def sweep_key(method: str, backbone: str, benchmark: str, knobs: dict, scale: float) -> str:
    """Stable id of a sweep point: method, backbone, benchmark and every knob value (seed excluded)."""
    return _digest({"method": method, "backbone": backbone, "benchmark": benchmark, "knobs": knobs, "scale": scale})


def to_row(record: dict, source: str) -> dict:
    """The flat row of a valid complete record (see the module docstring for the columns)."""
    knobs = knobs_of(record)
    scale = scale_of(record)
    method, backbone, benchmark = record["method"], record["backbone"], record["benchmark"]
    split = split_of(record)
    if split not in (None, EVALUATION_SPLIT) and not benchmark.endswith(f"@{split}"):
        benchmark = f"{benchmark}@{split}"  # dev records never join a test group (nor a test sweep point)
    row: dict[str, Any] = {
        "run_id": record["run_id"],
        "source": source,
        "status": record["status"],
        "method": method,
        "backbone": backbone,
        "benchmark": benchmark,
        "seed": int(record["seed"]),
        SCALE_COL: scale,
        "sweep_key": sweep_key(method, backbone, benchmark, knobs, scale),
        # One training run drawn at several post-hoc scales shares this key.
        "train_key": sweep_key(method, backbone, benchmark, knobs, 0.0),
    }
    row.update(knobs)
    metrics = record["metrics"]
    for key, value in sorted(metrics["target"].items()):
        if _is_number(value):
            row[f"target/{key}"] = float(value) if key.startswith("pass@") else value
    row[KL_MEAN_COL] = float(metrics["retained_kl_mean"])
    for dom, entry in sorted(metrics["retained"].items()):
        pre = f"retained/{dom}/"
        row[pre + "kind"] = domain_kind(entry)
        for key in ("kl_token_mean", "kl_seq_mean", "n_tokens", "n"):
            if _is_number(entry.get(key)):
                row[pre + key] = float(entry[key]) if key.startswith("kl") else entry[key]
        for key in RATE_KEYS:
            inner = entry.get(key)
            if isinstance(inner, dict) and _is_number(inner.get("rate")):
                row[pre + key] = float(inner["rate"])
        for key in ACCURACY_KEYS:
            inner = entry.get(key)
            if isinstance(inner, dict) and _is_number(inner.get("accuracy")):
                row[pre + key] = float(inner["accuracy"])
    for key, value in sorted((record.get("cost") or {}).items()):
        if _is_number(value):
            row[f"cost/{key}"] = float(value)
    train = record.get("train") or {}
    if _is_number(train.get("final_loss")):
        row["train/final_loss"] = float(train["final_loss"])
    if _is_number(train.get("steps")):
        row["train/steps"] = train["steps"]
    reused = train.get("reused_from")
    if isinstance(reused, dict):  # trained by another run (experiments.reuse), maybe with other code
        row["train/reused_from"] = reused.get("run_id")
        row["provenance/train_git_sha"] = reused.get("git_sha")
        row["provenance/train_git_dirty"] = reused.get("git_dirty")
    prov = record.get("provenance") or {}
    if isinstance(prov, dict):
        row["provenance/git_sha"] = prov.get("git_sha")
        row["provenance/git_dirty"] = prov.get("git_dirty")
        row["provenance/end_time"] = prov.get("end_time")
        mach = prov.get("machine")
        if isinstance(mach, dict):  # records from before the field have no column (not counted)
            row["provenance/machine"] = " / ".join(str(mach.get(k)) for k in ("cpu", "cpu_capability", "cuda_device")
                                                   if mach.get(k))
    # Everything that defines the science but the seed: runs of one sweep point should share it.
    config = {k: v for k, v in record["config"].items() if k != "seed"}
    row["config_key"] = _digest({"config": config, "scale": scale})
    return row
