"""How a resolved run config becomes its run id and its training id.

The run id is a hash of the *scientific* config: presentation keys (logger, launcher, output paths, progress bars,
cache locations, worker counts) are left out, so the same science always gets the same id and the same run
directory. A record's `config` is the scientific config of its run, so `run_id_of(record["config"])` (with the seed
it holds) gives back the record's run id.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

#: Dotted keys that do not change what a run computes.
PRESENTATION_KEYS = (
    "hydra",
    "logger",
    "run_root",
    "experiment",
    "benchmark.data_root",
    "train.progress",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.log_every",
    "train.num_threads",
    "train.length_groups",  # the same examples and loss per step in fewer padded positions: rounding differs, as with threads
    "eval.cache_dir",
    "eval.sandbox_workers",
    "rerun_before",  # which records count as stale, not what a run computes
    "wait_if_running",
    "eval.scales",  # more post-hoc scales of the same training run are more records, not another run
    "eval.refine_scales",  # so are the scales refinement adds between them
    "method.display",  # how analysis shows the method (conf/method/*.yaml), not what it computes
    "method.tune",  # the grid the tuning presets sweep for the method, not what one run computes
    "reuse_training_from",  # where a finished run with the same training is looked for (experiments.reuse)
)
#: Keys that choose what a trained model is evaluated on and nothing it trains on: runs that differ only here (and in
#: presentation keys) train the same model (`training_id_of`). No statistic a method fits and no training step reads
#: the evaluation split (experiments/calibration.py), and the reference cache stores each split's log-probs by that
#: split's own size (experiments/evaluation/reference_cache.py).
EVALUATION_ONLY_KEYS = ("benchmark.split", "benchmark.far")
#: Config keys added after runs were recorded, each with the value that computes what runs did before the key
#: existed. At that value such a key is left out of the run id, so earlier runs keep their ids; analysis reads a
#: record without the key as made at that value (`analysis.variants`), whatever the default is now.
LATER_KEYS = {
    "method.filter_basis": None,  # ATLAS's filters each in the full input space
    "method.filter_members": "kmeans",  # ATLAS's filters fitted on the k-means clusters
    "method.definition": "2026-11",  # InfLoRA, EWC, CorDA, LoRA-Null as the suite first defined them (CHANGELOG)
    "method.distill_on": "retained",  # LwF distilled on retained calibration prompts (now `lwf_retained`)
    "method.temperature": 1.0,  # LwF's distillation at temperature 1
    "benchmark.far": None,  # no far retained items (the earlier micro world)
    "method.fit_tokens": "all",  # ATLAS's atlas fitted on every calibration token
}
#: Later keys that change what a method *is*, not a knob of it: analysis always names a record whose value differs
#: from its method's current one (`analysis.variants`), so a record made under an earlier definition is never read as
#: today's method.
DEFINITION_KEYS = ("definition", "distill_on", "temperature")


def _parent(cfg: dict, dotted: str) -> tuple[Any, str]:
    node: Any = cfg
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            break
    return node, parts[-1]


def _without(cfg: dict, keys) -> dict:
    out = copy.deepcopy(cfg)
    for dotted in keys:
        node, leaf = _parent(out, dotted)
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def scientific_config(cfg: dict) -> dict:
    """A copy of a resolved config mapping without the presentation keys, and without each of `LATER_KEYS` that has
    its earlier behaviour's value."""
    out = _without(cfg, PRESENTATION_KEYS)
    for dotted, earlier in LATER_KEYS.items():
        node, leaf = _parent(out, dotted)
        if isinstance(node, dict) and leaf in node and node[leaf] == earlier:
            node.pop(leaf)
    return out


def _digest(cfg: dict) -> str:
    blob = json.dumps(cfg, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_id_of(cfg: dict) -> str:
    """16 hex characters identifying the science of a resolved config mapping."""
    return _digest(scientific_config(cfg))


def training_id_of(cfg: dict) -> str:
    """16 hex characters identifying what a resolved config mapping *trains*: its scientific config without
    `EVALUATION_ONLY_KEYS`. A dev run and a test run of one point share it; `cfg` may also be a record's `config`
    (already scientific)."""
    return _digest(_without(scientific_config(cfg), EVALUATION_ONLY_KEYS))
