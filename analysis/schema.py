"""The table analysis builds from records: the flat row of one complete record and its columns.

The record's layout and its validation are `suite_schema.layout` (shared with the runtime that writes records);
`to_row(record)` turns a valid complete record into one flat dict whose keys are the table's columns:

    run_id, source, status, method (`defined_method`: the record's method, named with the definition it ran under when
    that is not today's), backbone, benchmark (`micro`; `micro@dev` for a dev-split record, as the runtime names it), seed,
    scale, sweep_key, train_key,
    knob/<name> (every `knobs` entry but `name`), knob/train.steps, knob/train.lr,
    target/<metric> (pass@1, pass@k, n_problems, n_samples), retained_kl_mean,
    retained/<domain>/<metric> (near items: kl_token_mean, kl_seq_mean, n_tokens, n, the rates and accuracies),
    retained_far/<domain>/<metric> (far items, the same metrics, where the record has them),
    retained/<domain>/kind (math | choice | other), per_item (`per_item_of`, only for records carrying per-problem or
    per-item results), cost/<field>, train/final_loss, train/steps,
    provenance/git_sha, provenance/git_dirty, provenance/end_time, provenance/machine (CPU model / vector ISA / CUDA
    device, only for records that carry it), config_key,
    split (the split evaluated), benchmark_version and backbone_version (what the benchmark's data and the backbone's
    weights were, as canonical JSON; `analysis.comparable` refuses to compare runs that differ in them).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from suite_schema import registry, run_identity
from suite_schema.layout import (
    ACCURACY_KEYS,
    EVALUATION_SPLIT,
    RATE_KEYS,
    TRAIN_KNOBS,
    benchmark_label,
    is_number,
    retained_far,
    retained_near,
)

# The coding axis (higher is better) and the headline retained axis (lower is better).
TARGET_COL = "target/pass@1"
KL_MEAN_COL = "retained_kl_mean"
SCALE_COL = "scale"
KNOB_PREFIX = "knob/"


def knob_value(value: Any) -> Any:
    """A knob value as a table cell: scalars as they are, anything else as canonical JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def knob_text(v: Any) -> Optional[str]:
    """A knob value as text for comparison and names: None for missing/null/NaN, integral floats as integers."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def named_away(method: str, defaults: dict, keys: Sequence[str], value_of: Callable[[str], Any]) -> str:
    """`method`, or `method[key=value,...]` naming, in the order of `keys`, each key in `defaults` whose value
    (`value_of(key)`) differs from its default (a null value is named `null`). A missing or null value is null,
    except for a key in `run_identity.LATER_KEYS`, where it is the value runs computed before the key existed."""
    parts = []
    for key in keys:
        if key not in defaults:
            continue
        value = knob_text(value_of(key))
        if value is None:
            value = knob_text(run_identity.LATER_KEYS.get(f"method.{key}"))
        if value != knob_text(defaults[key]):
            parts.append(f"{key}={'null' if value is None else value}")
    return f"{method}[{','.join(parts)}]" if parts else method


def defined_method(method: str, knobs: dict) -> str:
    """`method`, or `method[key=value,...]` naming each of `run_identity.DEFINITION_KEYS` the registered method has
    whose value in the record's `knobs` differs from the method's value today (`named_away`); a record without the
    key ran at its earlier value. So `lwf` recorded before LwF distilled on the new task's inputs reads
    `lwf[distill_on=retained,temperature=1]`, and no record is counted as a method it was not."""
    spec = registry.methods().get(method)
    return method if spec is None else named_away(method, spec.values, run_identity.DEFINITION_KEYS, knobs.get)


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


def record_split(record: dict) -> str:
    """The split a record was evaluated on: its `split`, else `config.benchmark.split`, else the split its `benchmark`
    label names (`name@split`; `EVALUATION_SPLIT` without one)."""
    value = record.get("split") or split_of(record)
    if value is not None:
        return str(value)
    name, at, split = str(record.get("benchmark", "")).partition("@")
    return split if at else EVALUATION_SPLIT


def _without_nulls(obj: Any) -> Any:
    """`obj` with null mapping entries dropped, recursively: a key added later with a null default changes nothing."""
    if isinstance(obj, dict):
        return {k: _without_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_without_nulls(v) for v in obj]
    return obj


#: The part of `config.benchmark` left out of its version: the split evaluated is compared on its own (`split`).
VERSION_SKIP = ("split",)
BENCHMARK_VERSION_COL = "benchmark_version"
BACKBONE_VERSION_COL = "backbone_version"
#: `config.backbone` keys that say which weights were loaded.
BACKBONE_WEIGHTS = ("name", "path", "revision")


def benchmark_version(record: dict) -> str:
    """What a record's benchmark is, as canonical JSON: its `config.benchmark` (data sources, item limits, seed)
    without `VERSION_SKIP` and null entries; `{}` when the record has none."""
    bench = (record.get("config") or {}).get("benchmark")
    bench = {k: v for k, v in bench.items() if k not in VERSION_SKIP} if isinstance(bench, dict) else {}
    return json.dumps(_without_nulls(bench), sort_keys=True, separators=(",", ":"), default=str)


def backbone_version(record: dict) -> str:
    """Which weights a record's backbone loaded, as canonical JSON: `config.backbone`'s `BACKBONE_WEIGHTS` entries
    (the record's `backbone` name alone when the config has none)."""
    bb = (record.get("config") or {}).get("backbone")
    bb = {k: bb[k] for k in BACKBONE_WEIGHTS if k in bb} if isinstance(bb, dict) else {}
    return json.dumps(_without_nulls(bb) or {"name": record.get("backbone")}, sort_keys=True, separators=(",", ":"),
                      default=str)


def sweep_key(method: str, backbone: str, benchmark: str, knobs: dict, scale: float) -> str:
    """Stable id of a sweep point: method, backbone, benchmark and every knob value (seed excluded)."""
    return _digest({"method": method, "backbone": backbone, "benchmark": benchmark, "knobs": knobs, "scale": scale})


def _domain_columns(row: dict, domains: dict, prefix: str) -> None:
    """`<prefix>/<domain>/<metric>` columns of one set of retained domains (near: `retained`, far: `retained_far`)."""
    for dom, entry in sorted(domains.items()):
        pre = f"{prefix}/{dom}/"
        row[pre + "kind"] = domain_kind(entry)
        for key in ("kl_token_mean", "kl_seq_mean", "n_tokens", "n"):
            if is_number(entry.get(key)):
                row[pre + key] = float(entry[key]) if key.startswith("kl") else entry[key]
        for key in RATE_KEYS:
            inner = entry.get(key)
            if isinstance(inner, dict) and is_number(inner.get("rate")):
                row[pre + key] = float(inner["rate"])
        for key in ACCURACY_KEYS:
            inner = entry.get(key)
            if isinstance(inner, dict) and is_number(inner.get("accuracy")):
                row[pre + key] = float(inner["accuracy"])
#: The per-problem and per-item results of a record (`per_item_of`), as canonical JSON text; only in rows of records
#: that carry some. Read by `analysis.bootstrap`.
PER_ITEM_COL = "per_item"


def per_item_of(metrics: dict) -> Optional[str]:
    """The per-problem and per-item results a record's `metrics` carry, as canonical JSON text
    `{"problems": {"task_ids": [...], "passed": [...]}, "items": {<domain>: {"kl_sum": [...], "n_tokens": [...]}},
    "far_items": {...}}`: `metrics.target.per_problem` (greedy pass, 0 or 1, per code problem) and each retained
    domain's `per_item` (KL in nats summed over an item's response tokens, and its token count), near and far. A part
    is left out when the record lacks it; None when it lacks both (records made before these fields). Not checked
    here (`analysis.bootstrap.eval_sets` does)."""
    out: dict[str, Any] = {}
    problems = (metrics.get("target") or {}).get("per_problem")
    if problems is not None:
        out["problems"] = problems
    for key, domains in (("items", retained_near(metrics)), ("far_items", retained_far(metrics))):
        items = {dom: entry["per_item"] for dom, entry in sorted((domains or {}).items())
                 if isinstance(entry, dict) and entry.get("per_item") is not None}
        if items:
            out[key] = items
    return json.dumps(out, sort_keys=True, separators=(",", ":")) if out else None


def to_row(record: dict, source: str) -> dict:
    """The flat row of a valid complete record (see the module docstring for the columns)."""
    knobs = knobs_of(record)
    scale = scale_of(record)
    method, backbone, benchmark = defined_method(record["method"], record["knobs"]), record["backbone"], record["benchmark"]
    split = split_of(record)
    if split is not None and not benchmark.endswith(f"@{split}"):
        benchmark = benchmark_label(benchmark, split)  # dev records never join a test group (nor a test sweep point)
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
        if is_number(value):
            row[f"target/{key}"] = float(value) if key.startswith("pass@") else value
    row[KL_MEAN_COL] = float(metrics["retained_kl_mean"])
    per_item = per_item_of(metrics)
    if per_item is not None:
        row[PER_ITEM_COL] = per_item
    _domain_columns(row, retained_near(metrics), "retained")
    _domain_columns(row, retained_far(metrics), "retained_far")
    for key, value in sorted((record.get("cost") or {}).items()):
        if is_number(value):
            row[f"cost/{key}"] = float(value)
    train = record.get("train") or {}
    if is_number(train.get("final_loss")):
        row["train/final_loss"] = float(train["final_loss"])
    if is_number(train.get("steps")):
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
    row["split"] = record_split(record)
    row[BENCHMARK_VERSION_COL] = benchmark_version(record)
    row[BACKBONE_VERSION_COL] = backbone_version(record)
    return row
