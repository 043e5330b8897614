"""Helpers shared by the baseline tests: fresh tiny bases, contexts, methods from their config files, batches."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from baselines.common import calibration_pairs, lora_layers, pair_example
from experiments.backbones import load_model
from experiments.methods import RunContext, build_method
from experiments.prompts import collate
from experiments.train import seed_everything
from tests.conftest import REPO


def fresh_base(tiny, seed: int = 0) -> torch.nn.Module:
    """A freshly loaded tiny base (global RNG seeded first, so peft's Kaiming init of A is reproducible)."""
    seed_everything(seed)
    return load_model(tiny.cfg.backbone)


def run_context(tiny, run_dir: Path, seed: int = 0) -> RunContext:
    return RunContext(cfg=tiny.cfg, tokenizer=tiny.tokenizer, benchmark=tiny.benchmark, run_dir=Path(run_dir),
                      seed=seed, reference_fn=lambda: tiny.reference)


def method_from_conf(name: str, **overrides):
    """The method `conf/method/<name>.yaml` configures, with hyperparameter overrides."""
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "conf" / "method" / f"{name}.yaml"), overrides)
    return build_method(cfg)


def prepared(tiny, name: str, run_dir: Path, seed: int = 0, **overrides):
    """(model, method, ctx): a fresh base prepared by the configured method."""
    model = fresh_base(tiny, seed)
    method = method_from_conf(name, **overrides)
    ctx = run_context(tiny, run_dir, seed)
    model = method.prepare(model, ctx)
    return model, method, ctx


def target_batch(tiny, n: int = 8) -> dict:
    return collate(tiny.examples[:n], tiny.tokenizer.pad_token_id)


def retained_batch(tiny, n: int = 12) -> dict:
    pairs = calibration_pairs(tiny.reference)[:n]
    return collate([pair_example(p) for p in pairs], tiny.tokenizer.pad_token_id)


@torch.no_grad()
def sft_loss(model: torch.nn.Module, batch: dict) -> float:
    model.eval()
    return float(model(**batch).loss)


@torch.no_grad()
def logits_of(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    model.eval()
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def randomize_lora_b(model: torch.nn.Module, seed: int = 1, std: float = 0.1) -> None:
    """Give every LoRA B random values (a non-zero update) from its own generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            w = layer.lora_B["default"].weight
            w.copy_(torch.randn(w.shape, generator=g) * std)
