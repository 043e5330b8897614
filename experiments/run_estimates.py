"""How long a run that has not run yet will take on this machine, in wall-clock seconds, and where that number
comes from: the median wall time of finished runs of the same kind, else a default for the micro backbone.

A run's kind is its method (with the definition it runs under, `run_identity.DEFINITION_KEYS`), backbone and
training steps. A complete record measures its run: the wall time from its start to its end (`provenance`
start_time to end_time of the run's own record, written after every post-hoc scale's record). A run that resumed
(`train.resumed_from`) measured only its last attempt and is left out; a run that evaluated another run's training
(`train.reused_from`, experiments/reuse.py) measures an evaluation-only run, as does a whole run's time less its
`cost.train_seconds`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from experiments import records
from suite_schema import layout, run_identity

#: Where the records committed with the suite lie (made on 2 CPU cores, docs/results/micro/README.md).
COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "results"
# Defaults for a kind no record measures, from the committed micro records of LoRA at 600 steps (docs/results/micro):
# 127-134 s of training (0.22 s a step) and 58-62 s for its 5 evaluations, loading included (12 s each).
LORA_STEP_S = 0.22
EVALUATION_S = 12.0
#: What `python run.py` spends before a record's start time (imports, composing the config): a micro base run took
#: 358 s as a process, 346 s by its record; 14 s and 1 s on the tests' tiny backbone. Added to every estimate.
STARTUP_S = 12.0
#: A method's training step in LoRA steps where no record measures it: LwF adds a base forward and a second forward
#: and backward on each target micro-batch, about 2.5x LoRA's step on micro (docs/reproducing.md).
STEP_COST = {"lwf": 2.5}
FULL, EVAL_ONLY = "full", "evaluation only"


def definition(method: dict) -> tuple:
    """The values of `run_identity.DEFINITION_KEYS` in a scientific method config (None where absent: the earlier
    value, `run_identity.scientific_config` drops it)."""
    return tuple(method.get(key) for key in run_identity.DEFINITION_KEYS)


def kind_of(config: dict) -> tuple:
    """(method name, definition, backbone name, train.steps) of a scientific run config (a record's `config`, or
    `run_identity.scientific_config` of a resolved one): runs of one kind take about the same time."""
    method, train = config.get("method") or {}, config.get("train") or {}
    return method.get("name"), definition(method), (config.get("backbone") or {}).get("name"), train.get("steps")


@dataclass(frozen=True)
class Measured:
    """What one complete record measured: its kind, the wall seconds of the whole run (None when it did not train
    here from the start) and of its evaluation part (None when unknown)."""

    kind: tuple
    full_s: Optional[float]
    eval_s: Optional[float]
    refined: bool = False  # the run also evaluated refined post-hoc scales (`scale_refinement` in its record)


def _seconds(start: Any, end: Any) -> Optional[float]:
    try:
        value = (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()
    except ValueError:
        return None
    return value if value >= 0 else None


def measured(record: dict) -> Optional[Measured]:
    """What a complete run record measured (`Measured`), or None when it is not complete, has no config or times,
    or resumed an attempt of its own (its times cover only the last attempt)."""
    if record.get("status") != layout.STATUS_COMPLETE or not isinstance(record.get("config"), dict):
        return None
    prov = records.part(record, "provenance")
    wall = _seconds(prov.get("start_time"), prov.get("end_time"))
    train = records.part(record, "train")
    if wall is None:
        return None
    kind = kind_of(record["config"])
    refined = bool(record.get("scale_refinement"))
    if isinstance(train.get("reused_from"), dict):
        return Measured(kind, None, wall, refined)
    if train.get("resumed_from") is not None:
        return None
    trained = records.part(record, "cost").get("train_seconds")
    eval_s = wall - trained if isinstance(trained, (int, float)) and 0 <= trained <= wall else None
    return Measured(kind, wall, eval_s, refined)


def run_records(folder: Path, nested: bool = False) -> Iterable[dict]:
    """The run records in the run folders of `folder` (`<folder>/<run_id>/record.json`), or with `nested` in run
    folders at any depth under it; never a post-hoc scale's record."""
    found = Path(folder).rglob(layout.RECORD_NAME) if nested else Path(folder).glob(f"*/{layout.RECORD_NAME}")
    for path in sorted(found):
        if path.parent.parent.name == layout.SCALES_DIR:
            continue
        record = records.read_record(path.parent)
        if record is not None:
            yield record


class Pool:
    """Measured wall times by kind, from the complete records of some folders; `label` names them in a plan."""

    def __init__(self, label: str, found: Iterable[dict]) -> None:
        self.label = label
        self.times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: {FULL: [], EVAL_ONLY: []})
        self.refined: dict[tuple, bool] = defaultdict(bool)  # whether any record of a kind refined its scales
        for record in found:
            m = measured(record)
            if m is None:
                continue
            self.refined[m.kind] |= m.refined
            if m.full_s is not None:
                self.times[m.kind][FULL].append(m.full_s)
            if m.eval_s is not None:
                self.times[m.kind][EVAL_ONLY].append(m.eval_s)

    def median(self, kind: tuple, part: str) -> Optional[tuple[float, int]]:
        """(median seconds, how many records) of `part` (FULL or EVAL_ONLY) for runs of `kind`, None without any."""
        values = self.times.get(kind, {}).get(part) or []
        return (float(np.median(values)), len(values)) if values else None


@dataclass(frozen=True)
class Estimate:
    """A run's estimated wall seconds and where the number comes from."""

    seconds: float
    source: str


def default_seconds(method: str, steps: Optional[int], trains: bool, evaluations: int, part: str) -> float:
    """The micro default: `steps` LoRA steps of `LORA_STEP_S` (times `STEP_COST` of the method) when the run trains
    here (`part` FULL), plus `EVALUATION_S` per evaluation (the run's own and one per post-hoc scale)."""
    train = (steps or 0) * LORA_STEP_S * STEP_COST.get(method, 1.0) if trains and part == FULL else 0.0
    return train + EVALUATION_S * evaluations


def estimate(kind: tuple, trains: bool, evaluations: int, reuses: bool, pools: Sequence[Pool],
             refined_evals: int = 0) -> Estimate:
    """The wall seconds of `python run.py` for a run of `kind` (`kind_of`) with `evaluations` evaluations and up to
    `refined_evals` refined post-hoc scales (`eval.refine_scales`): `STARTUP_S` plus the median of the first pool that
    measured its kind (evaluation only when it `reuses` another run's training), else plus `default_seconds`; refined
    scales at `EVALUATION_S` each (their whole budget, an upper bound) unless the measured records refined too."""
    part = EVAL_ONLY if reuses and trains else FULL
    what = " (evaluation only)" if part == EVAL_ONLY else ""
    extra = f" + up to {refined_evals} refined scales" if refined_evals else ""
    for pool in pools:
        found = pool.median(kind, part)
        if found is not None:
            if pool.refined[kind]:
                return Estimate(STARTUP_S + found[0], f"{pool.label}, median of {found[1]}{what}")
            return Estimate(STARTUP_S + found[0] + EVALUATION_S * refined_evals,
                            f"{pool.label}, median of {found[1]}{what}{extra}")
    method, _, backbone, steps = kind
    source = "micro default" if backbone == "micro" else f"micro default (no record of {backbone})"
    return Estimate(STARTUP_S + default_seconds(method, steps, trains, evaluations + refined_evals, part),
                    source + what + extra)


def duration(seconds: float) -> str:
    """Seconds as `2 h 05 min`, `3 min 10 s` or `45 s`."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"
