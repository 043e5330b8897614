"""Fixtures for the baselines: the tiny backbone and benchmark composed into a real run config, with a real
reference cache of the tiny base (built once per session, float32 log-probs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import REPO, tiny_overrides


@dataclass
class Tiny:
    """A validated run config on the tiny backbone + benchmark, its data and the base's reference cache."""

    cfg: Any
    tokenizer: Any
    benchmark: Any
    reference: Any
    examples: list
    cache_dir: Path


def compose_tiny(backbone: Path, bench: Path, run_root: Path, cache_dir: Path, *extra: str):
    from experiments.config import validate_config

    overrides = tiny_overrides(backbone, bench, run_root, cache_dir, **{"++eval.logprob_dtype": "float32"})
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate_config(compose("config", overrides=["method=lora", *overrides, *extra]))


@pytest.fixture(scope="session")
def tiny(tiny_backbone_dir, tiny_benchmark_dir, tmp_path_factory) -> Tiny:
    from experiments.backbones import backbone_key, load_backbone
    from experiments.config import eval_config
    from experiments.data.benchmark import build_benchmark
    from experiments.evaluation.reference_cache import get_reference
    from experiments.job import encode_target

    root = tmp_path_factory.mktemp("baselines")
    cfg = compose_tiny(tiny_backbone_dir, tiny_benchmark_dir, root / "runs", root / "cache" / "reference")
    benchmark = build_benchmark(cfg.benchmark)
    base, tok = load_backbone(cfg.backbone)
    reference = get_reference(base, tok, benchmark, eval_config(cfg), backbone_key(cfg.backbone),
                              cfg.backbone.chat_template)
    examples = encode_target(benchmark, tok, cfg.backbone.chat_template, cfg.backbone.max_length)
    return Tiny(cfg, tok, benchmark, reference, examples, root / "cache")
