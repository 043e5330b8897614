"""A benchmark in memory: target training data, target evaluation problems, retained domains.

Built from the `benchmark` config group. Calibration subsets are drawn with the benchmark's own
seed (not the run's), so every run of a sweep sees the same retained data and shares one
reference cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from experiments.data.loaders import DataError, is_local, load

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RetainedDomain:
    """One retained domain: its kind (`math` or `choice`) and its disjoint calibration / evaluation items."""

    name: str
    kind: str
    calibration: list[dict]
    evaluation: list[dict]


@dataclass
class Benchmark:
    """Everything one run trains and evaluates on."""

    name: str
    target_train: list[dict]
    target_eval: list[dict]
    retained: dict[str, RetainedDomain] = field(default_factory=dict)
    protect: Optional[list[str]] = None  # retained domains methods may calibrate on; None = all

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
                key = "benchmark.data_root" if data_root else "local"
                raise DataError(
                    f"{key}: local data path {str(local)!r} does not exist "
                    f"(set benchmark.data_root to the folder holding it, or null to use the hub id {spec.hub!r})"
                )
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


def load_split(spec, split_spec, data_root: Optional[str], seed: int) -> list[dict]:
    """Load one split of a dataset spec and take its seeded subset."""
    source, hub_config = resolve_source(spec, data_root)
    files = dict(spec.files) if spec.files and is_local(source) else None
    items = load(spec.kind, source, split_spec.split, hub_config=hub_config, files=files)
    return _subset(items, split_spec.max_items, seed)


def build_benchmark(cfg) -> Benchmark:
    """Load every dataset a benchmark config names (see `experiments.config.BenchmarkConfig`)."""
    root = cfg.data_root
    train = load_split(cfg.target.train, cfg.target.train, root, cfg.seed)
    target_eval: list[dict] = []
    for name, spec in cfg.target.evaluation.items():
        problems = load_split(spec, spec, root, cfg.seed)
        for p in problems:
            p.setdefault("suite", name)
        target_eval.extend(problems)
    retained = {}
    for name, spec in cfg.retained.items():
        calibration = load_split(spec, spec.calibration, root, cfg.seed)
        evaluation = load_split(spec, spec.evaluation, root, cfg.seed + 1)
        retained[name] = RetainedDomain(name, spec.kind, calibration, evaluation)
    protect = cfg.get("protect") if hasattr(cfg, "get") else getattr(cfg, "protect", None)
    return Benchmark(cfg.name, train, target_eval, retained, None if protect is None else list(protect))
