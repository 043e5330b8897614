"""A benchmark in memory: target training data, target evaluation problems, retained domains.

Built from the `benchmark` config group. `benchmark.split` chooses what a run evaluates on: the
`dev` specs (for every design choice) or the `evaluation` specs (the test split, for final
numbers). Calibration subsets are drawn with the benchmark's own seed (not the run's), so every
run of a sweep sees the same retained data and shares one reference cache.

Dev splits of real datasets that have none are carved from a training split by a fixed rule
(`in_holdout`: a tenth of the items chosen by a hash of their text, `holdout: dev`); the
calibration subset then reads the rest (`holdout: rest`). Whatever the specs say, calibration
items whose question also occurs (normalised) in the domain's dev or test split are dropped
before the subset is drawn, so no method calibrates on a question it is evaluated on.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from experiments.data.dedup import normalise_text
from experiments.data.loaders import DataError, is_local, load
from experiments.validation import not_allowed

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RetainedDomain:
    """One retained domain: its kind (`math` or `choice`) and its disjoint calibration / evaluation items.

    `evaluation` holds the items of the split the run evaluates on (dev or test, `Benchmark.split`), the *near*
    items; `far` the domain's far items of that split (`benchmark.far`; empty when it has none);
    `dropped_calibration` counts calibration items removed because their question is in dev or test.
    """

    name: str
    kind: str
    calibration: list[dict]
    evaluation: list[dict]
    dropped_calibration: int = 0
    far: list[dict] = field(default_factory=list)


@dataclass
class Benchmark:
    """Everything one run trains and evaluates on."""

    name: str
    target_train: list[dict]
    target_eval: list[dict]
    retained: dict[str, RetainedDomain] = field(default_factory=dict)
    protect: Optional[list[str]] = None  # retained domains methods may calibrate on; None = all
    split: str = "test"  # which split `target_eval` and the retained `evaluation` items come from

    @property
    def protected(self) -> list[str]:
        """Names of the retained domains whose calibration data methods may use, sorted."""
        return sorted(self.retained if self.protect is None else self.protect)


def resolve_source(spec, data_root: Optional[str]) -> tuple[str, Optional[str]]:
    """(source, hub_config) for a dataset spec: the local copy when `data_root` or the spec's path is local."""
    if spec.local:
        local = Path(spec.local).expanduser()
        if not local.is_absolute():
            base = Path(data_root).expanduser() if data_root else REPO_ROOT
            local = base / local
        if data_root or not spec.hub:
            if not local.exists():
                key, value = ("benchmark.data_root", data_root) if data_root else ("local", spec.local)
                raise not_allowed(key, value, f"a path that exists ({str(local)!r} does not; set benchmark.data_root "
                                  f"to the folder holding it, or null to use the hub id {spec.hub!r})", DataError)
            return str(local), None
    if not spec.hub:
        raise DataError(f"dataset spec has neither a local path nor a hub id: {spec}")
    return spec.hub, spec.hub_config


def _subset(items: list[dict], max_items: Optional[int], seed: int) -> list[dict]:
    if max_items is None or max_items >= len(items):
        return items
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in sorted(order[:max_items])]


def item_text(item: dict) -> str:
    """The text that identifies an item: a question (math, choice), a prompt (code) or an instruction."""
    for key in ("question", "prompt", "instruction"):
        if key in item:
            return str(item[key]) + ("\n" + item.get("input", "") if key == "instruction" else "")
    raise DataError(f"an item without question, prompt or instruction: keys {sorted(item)}")


def in_holdout(item: dict) -> bool:
    """Whether an item is in the fixed held-out tenth of its split (sha256 of its normalised text)."""
    digest = hashlib.sha256(normalise_text(item_text(item)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 10 == 0


def _task_number(item: dict) -> int:
    tail = str(item.get("task_id", "")).rsplit("/", 1)[-1]
    if not tail.isdigit():
        raise DataError(f"id_range needs numeric task ids; got task_id {item.get('task_id')!r}")
    return int(tail)


def select(items: list[dict], split_spec) -> list[dict]:
    """The items a split spec keeps before subsetting: its `holdout` part and its `id_range`."""
    holdout = getattr(split_spec, "holdout", None)
    if holdout == "dev":
        items = [it for it in items if in_holdout(it)]
    elif holdout == "rest":
        items = [it for it in items if not in_holdout(it)]
    elif holdout is not None:
        raise not_allowed("holdout", holdout, "null, 'dev' or 'rest'", DataError)
    id_range = getattr(split_spec, "id_range", None)
    if id_range is not None:
        lo, hi = id_range
        items = [it for it in items if lo <= _task_number(it) <= hi]
    if not items:
        raise DataError(f"split {split_spec.split!r} (holdout {holdout!r}, id_range {id_range}) keeps no item")
    return items


def load_items(spec, split_spec, data_root: Optional[str]) -> list[dict]:
    """Every item one split spec selects (before the seeded subset)."""
    source, hub_config = resolve_source(spec, data_root)
    files = dict(spec.files) if spec.files and is_local(source) else None
    return select(load(spec.kind, source, split_spec.split, hub_config=hub_config, files=files), split_spec)


def load_split(spec, split_spec, data_root: Optional[str], seed: int) -> list[dict]:
    """Load one split of a dataset spec, keep what it selects and take its seeded subset."""
    return _subset(load_items(spec, split_spec, data_root), split_spec.max_items, seed)


def _retained(name: str, spec, split: str, root: Optional[str], seed: int, far=None) -> RetainedDomain:
    dev = getattr(spec, "dev", None)
    held_out = [spec.evaluation] + ([dev] if dev is not None else [])
    if far is not None:
        held_out += [far.evaluation] + ([far.dev] if getattr(far, "dev", None) is not None else [])
    if split == "dev" and dev is None:
        raise not_allowed(f"benchmark.retained.{name}.dev", None, "a dev split spec when benchmark.split=dev", DataError)
    pool = load_items(spec, spec.calibration, root)
    evaluated = {normalise_text(item_text(it)) for part in held_out for it in load_items(spec, part, root)}
    kept = [it for it in pool if normalise_text(item_text(it)) not in evaluated]
    if not kept:
        raise DataError(f"benchmark.retained.{name}.calibration: every item is also in its dev or test split")
    calibration = _subset(kept, spec.calibration.max_items, seed)
    evaluation = load_split(spec, dev if split == "dev" else spec.evaluation, root, seed + 1)
    far_items: list[dict] = []
    if far is not None:
        far_split = getattr(far, "dev", None) if split == "dev" else far.evaluation
        if far_split is None:
            raise not_allowed(f"benchmark.far.{name}.dev", None, "a dev split spec when benchmark.split=dev", DataError)
        far_items = load_split(spec, far_split, root, seed + 2)
    return RetainedDomain(name, spec.kind, calibration, evaluation, dropped_calibration=len(pool) - len(kept),
                          far=far_items)


def build_benchmark(cfg) -> Benchmark:
    """Load every dataset a benchmark config names (see `experiments.config.BenchmarkConfig`), for
    evaluation on `cfg.split` (`dev` or `test`)."""
    root = cfg.data_root
    split = getattr(cfg, "split", "test") or "test"
    if split not in ("dev", "test"):
        raise not_allowed("benchmark.split", split, "'dev' or 'test'", DataError)
    train = load_split(cfg.target.train, cfg.target.train, root, cfg.seed)
    suites = getattr(cfg.target, "dev", None) if split == "dev" else cfg.target.evaluation
    if not suites:
        raise not_allowed(f"benchmark.target.{'dev' if split == 'dev' else 'evaluation'}", {},
                          f"at least one suite for benchmark.split={split}", DataError)
    target_eval: list[dict] = []
    for name, spec in suites.items():
        problems = load_split(spec, spec, root, cfg.seed)
        for p in problems:
            p.setdefault("suite", name)
        target_eval.extend(problems)
    far = getattr(cfg, "far", None) or {}
    unknown = sorted(set(far) - set(cfg.retained))
    if unknown:
        raise not_allowed(f"benchmark.far.{unknown[0]}", unknown[0], f"a retained domain, one of {sorted(cfg.retained)}",
                          DataError)
    retained = {name: _retained(name, spec, split, root, cfg.seed, far.get(name)) for name, spec in cfg.retained.items()}
    protect = cfg.get("protect") if hasattr(cfg, "get") else getattr(cfg, "protect", None)
    return Benchmark(cfg.name, train, target_eval, retained, None if protect is None else list(protect), split)
