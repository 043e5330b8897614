"""DoRA (peft): every adapted layer has a trained magnitude vector (||W0||_row at init), the forward pass is
m * (W0 + s B A) / ||W0 + s B A||_row, the model is the base at init, training moves the magnitudes, and
scale(alpha) gives W0 + alpha (W' - W0) (peft's plain LoRA scale would not: a trained magnitude stays in force)."""

from __future__ import annotations

import pytest
import torch

from baselines.common import lora_layers
from baselines.dora import dora_effective_weight
from baselines.lora import LoRA
from experiments.config import train_config
from experiments.train import train
from tests.baselines.baseline_helpers import (
    assert_scale_interpolates_against_true_w0,
    base_weights,
    fresh_base,
    logits_of,
    prepared,
    randomize_lora_b,
    retained_batch,
)


def effective(model):
    return {n: dora_effective_weight(layer) for n, layer in lora_layers(model).items()}


def randomize_magnitudes(model, seed=2, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            m = layer.lora_magnitude_vector["default"].weight
            m.mul_(1 + spread * (torch.rand(m.shape, generator=g) - 0.5))


def test_magnitude_vectors_start_at_the_row_norms_and_the_model_is_the_base(tiny, tmp_path):
    model, method, _ = prepared(tiny, "dora", tmp_path)
    assert model.peft_config["default"].use_dora
    w0 = base_weights(tiny)
    layers = lora_layers(model)
    assert len(layers) == 14
    for name, layer in layers.items():
        magnitude = layer.lora_magnitude_vector["default"].weight
        assert magnitude.requires_grad and magnitude.shape == (w0[name].shape[0],)
        torch.testing.assert_close(magnitude.detach(), w0[name].norm(dim=1))  # one entry per output feature
        assert layer.lora_A["default"].weight.requires_grad and (layer.lora_B["default"].weight == 0).all()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert sum("lora_magnitude_vector" in n for n in trainable) == 14 and len(trainable) == 3 * 14
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-6, atol=1e-6)


def test_forward_is_the_dora_equation(tiny, tmp_path):
    model, _, _ = prepared(tiny, "dora", tmp_path)
    randomize_lora_b(model, std=0.2)
    randomize_magnitudes(model)
    layer = lora_layers(model)["model.layers.1.mlp.down_proj"]
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    w0 = layer.get_base_layer().weight.detach()
    a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
    m = layer.lora_magnitude_vector["default"].weight.detach()
    direction = w0 + (16 / 8) * b @ a
    by_hand = x @ (m[:, None] * direction / direction.norm(dim=1, keepdim=True)).T
    with torch.no_grad():
        torch.testing.assert_close(layer(x), by_hand, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dora_effective_weight(layer), m[:, None] * direction / direction.norm(dim=1, keepdim=True))


@pytest.mark.trains
def test_training_moves_the_magnitudes(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "dora", tmp_path)
    start = {n: l.lora_magnitude_vector["default"].weight.detach().clone() for n, l in lora_layers(model).items()}
    train(model, method, tiny.examples, ctx, train_config(steps=5, lr=5e-2, batch_size=4, grad_accum=1,
          checkpoint_every=100, progress=False))
    moved = [n for n, l in lora_layers(model).items()
             if not torch.allclose(l.lora_magnitude_vector["default"].weight, start[n], atol=1e-4)]
    assert len(moved) == 14


def test_scale_interpolates_against_the_true_w0(tiny, tmp_path):
    model, method, _ = prepared(tiny, "dora", tmp_path)
    randomize_magnitudes(model)
    assert_scale_interpolates_against_true_w0(tiny, model, method, tmp_path, effective=effective)


def test_plain_lora_scale_would_not_reach_the_base(tiny, tmp_path):
    """Why DoRA has its own scale: with trained magnitudes, LoRA scale 0 leaves m / ||W0||_row != 1 in force."""
    model, method, _ = prepared(tiny, "dora", tmp_path)
    randomize_lora_b(model, std=0.2)
    randomize_magnitudes(model)
    batch = retained_batch(tiny)
    base = logits_of(fresh_base(tiny), batch)
    LoRA.scale(method, model, 0.0)
    assert not torch.allclose(logits_of(model, batch), base, atol=1e-3)
    LoRA.scale(method, model, 1.0)
    method.scale(model, 0.0)
    assert torch.equal(logits_of(model, batch), base)  # B' = 0 and m' = ||W0||_row: the base, bit for bit
    method.scale(model, 1.0)
