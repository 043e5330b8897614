"""Helpers shared by the baseline tests: fresh tiny bases, contexts, methods from their config files, batches."""

from __future__ import annotations

from pathlib import Path

import torch

from baselines.common import lora_layers
from experiments.backbones import load_model
from experiments.calibration import pair_example, reference_pairs
from experiments.job import run_context as job_context
from experiments.methods import RunContext, build_named
from experiments.prompts import collate
from experiments.train import seed_everything


def fresh_base(tiny, seed: int = 0) -> torch.nn.Module:
    """A freshly loaded tiny base (global RNG seeded first, so peft's Kaiming init of A is reproducible)."""
    seed_everything(seed)
    return load_model(tiny.cfg.backbone)


def run_context(tiny, run_dir: Path, seed: int = 0) -> RunContext:
    cfg = tiny.cfg if seed == tiny.cfg.seed else with_seed(tiny.cfg, seed)
    return job_context(cfg, tiny.tokenizer, tiny.benchmark, Path(run_dir), reference_fn=lambda: tiny.reference)


def with_seed(cfg, seed: int):
    from omegaconf import OmegaConf

    from experiments.config import validate_config

    return validate_config(OmegaConf.merge(cfg, {"seed": seed}))


def method_from_conf(name: str, **overrides):
    """The method `conf/method/<name>.yaml` configures, with hyperparameter overrides."""
    return build_named(name, **overrides)


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
    pairs = reference_pairs(tiny.reference)[:n]
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


def residual_effective_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Module -> W_base + s B A of every LoRA layer (the weight the forward pass uses), float32, detached."""
    out = {}
    for name, layer in lora_layers(model).items():
        a, b = layer.lora_A["default"].weight.float(), layer.lora_B["default"].weight.float()
        out[name] = (layer.get_base_layer().weight.float() + layer.scaling["default"] * (b @ a)).detach()
    return out


def base_weights(tiny) -> dict[str, torch.Tensor]:
    """Module -> W0 of every Linear of a freshly loaded base."""
    return {n: m.weight.detach() for n, m in fresh_base(tiny).named_modules() if isinstance(m, torch.nn.Linear)}


def assert_scale_interpolates_against_true_w0(tiny, model, method, tmp_path, effective=residual_effective_weights):
    """After a trained-looking update (random B), scale(alpha) gives W0 + alpha (W_trained - W0) for the TRUE W0,
    scale 0 is the base, scale 1 the trained model bit for bit, and export refuses a scaled model."""
    import pytest

    randomize_lora_b(model, std=0.2)
    w0 = base_weights(tiny)
    trained = effective(model)
    batch = retained_batch(tiny)
    trained_logits = logits_of(model, batch)
    assert not torch.allclose(trained_logits, logits_of(fresh_base(tiny), batch), atol=1e-3)
    for alpha in (0.0, 0.5, 0.25, 1.0):
        method.scale(model, alpha)
        now = effective(model)
        assert now.keys() == trained.keys() and len(now) == 14
        for name, w in now.items():
            torch.testing.assert_close(w, w0[name] + alpha * (trained[name] - w0[name]), rtol=1e-5, atol=1e-5)
    method.scale(model, 0.0)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    method.scale(model, 1.0)
    assert torch.equal(logits_of(model, batch), trained_logits)
    method.scale(model, 0.5)
    with pytest.raises(RuntimeError, match="scale"):
        method.export(model, tmp_path / "export")
    method.scale(model, 1.0)
