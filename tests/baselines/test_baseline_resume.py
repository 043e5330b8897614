"""A run stopped after a checkpoint and resumed in a fresh process ends exactly where an uninterrupted run does:
per-step draws (replay, LwF) come from (seed, step), statistics (O-LoRA, InfLoRA, CorDA, MiLoRA, LoRA-Null) from the
run folder, PiSSA's SVD is deterministic, and full fine-tuning checkpoints the adapted weights themselves."""

from __future__ import annotations

import pytest

from experiments.config import train_config
from experiments.train import train
from suite_schema import registry
from tests.baselines.baseline_helpers import prepared


def run(tiny, name, run_dir, steps):
    model, method, ctx = prepared(tiny, name, run_dir, seed=3)
    return train(model, method, tiny.examples, ctx, train_config(steps=steps, lr=2e-2, batch_size=4, grad_accum=2,
                 checkpoint_every=3, progress=False))


# Every baseline of the registry but LoRA (its resume is tests/experiments/test_train.py's).
@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in registry.members("baseline", "retained", "extended") if m != "lora"])
def test_resume_matches_uninterrupted(tiny, tmp_path, name):
    straight = run(tiny, name, tmp_path / "straight", 6)
    run(tiny, name, tmp_path / "stopped", 3)  # stops after its step-3 checkpoint
    resumed = run(tiny, name, tmp_path / "stopped", 6)  # a fresh model + method, as a requeued job
    assert resumed.resumed_from == 3
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-6, abs=1e-7)
