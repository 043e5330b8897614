"""A finished run, loaded back for a measurement after the fact: its record, its validated config, the frozen base
model, the tokenizer and a run context on the run's own split (its reference cache, held-out sequences), so that a
later tool measures what the run's own evaluation would have (`movement`, `python -m atlas.inspect --recompute`).

Run from the checkout the run was made in: benchmark paths in the config are relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from experiments import records
from experiments.backbones import backbone_key, load_backbone
from experiments.config import eval_config, validate_config
from experiments.data.benchmark import build_benchmark
from experiments.evaluation.reference_cache import get_reference
from experiments.job import run_context
from experiments.methods import method_class, param_names
from suite_schema import layout, run_identity
from suite_schema.registry import CONF


@dataclass
class TrainedRun:
    """What `load_run` returns; `export` is the run's exported method state (atlas, adapter, parameters)."""

    record: dict
    config: Any
    ctx: Any
    base: torch.nn.Module
    tokenizer: Any
    export: Path


def config_of(record: dict, data_root: Optional[str] = None, cache_dir: Optional[str] = None) -> Any:
    """The validated config of a record: the record's config over the suite's defaults (presentation keys such as
    `benchmark.data_root` and `eval.cache_dir` are not part of a record; `data_root` and `cache_dir` set them). A key
    of `LATER_KEYS` the record lacks takes its earlier value, the behaviour the run had, not today's default."""

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[])
    with open_dict(cfg):
        for key, value in record["config"].items():
            cfg[key] = value if key in ("method", "seed") else OmegaConf.merge(cfg[key], value)
        takes = set(param_names(method_class(cfg.method._target_)))
        for dotted, earlier in run_identity.LATER_KEYS.items():
            section, leaf = dotted.split(".", 1)
            if section == "method" and leaf in takes and leaf not in cfg.method:
                cfg.method[leaf] = earlier
        cfg.benchmark.data_root = data_root
        cfg.eval.cache_dir = cache_dir
    return validate_config(cfg)



def load_run(run_dir: Path, data_root: Optional[str] = None, cache_dir: Optional[str] = None) -> TrainedRun:
    """Load a complete run that exported a trained method (`ValueError` naming what is missing otherwise); the base
    model's responses come from the reference cache in `cache_dir`, as evaluation resolves it."""
    run_dir = Path(run_dir)
    record = records.read_record(run_dir)
    if record is None or record.get("status") != layout.STATUS_COMPLETE:
        raise ValueError(f"{run_dir}: no complete record.json")
    export = run_dir / "export"
    if not export.is_dir():
        raise ValueError(f"{run_dir}: no export/ folder (a method that trains nothing moves nothing)")
    typed = config_of(record, data_root, cache_dir)
    benchmark = build_benchmark(typed.benchmark)
    base, tokenizer = load_backbone(typed.backbone)
    reference = lambda: get_reference(base, tokenizer, benchmark, eval_config(typed),  # noqa: E731
                                      backbone_key(typed.backbone), typed.backbone.chat_template,
                                      progress=bool(typed.train.progress))
    ctx = run_context(typed, tokenizer, benchmark, run_dir, reference_fn=reference)
    return TrainedRun(record, typed, ctx, base, tokenizer, export)
