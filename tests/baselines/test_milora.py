"""MiLoRA: the adapter holds the LAST r singular components of W0 (a hand computation and the real weights), the
model is the base at init although W0 is rewritten, scale(alpha) interpolates against the true W0, the export is the
converted update on the unmodified base, and a resumed run reuses the saved factors."""

from __future__ import annotations

import json

import pytest
import torch

from baselines.common import lora_layers
from baselines.lora import LoRA
from baselines.milora import minor_factors
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import (
    assert_scale_interpolates_against_true_w0,
    base_weights,
    fresh_base,
    logits_of,
    prepared,
    randomize_lora_b,
    residual_effective_weights,
    retained_batch,
    target_batch,
)


def hand_matrix(singular_values, rows=7, seed=0):
    """(U [rows, k], V [k, k], W = U diag(s) V^T) with orthonormal U, V and the given singular values."""
    g = torch.Generator().manual_seed(seed)
    k = len(singular_values)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(k, k, generator=g, dtype=torch.float64))
    return u, v, u @ torch.diag(torch.tensor(singular_values, dtype=torch.float64)) @ v.T


def test_minor_factors_on_a_hand_built_matrix():
    u, v, w = hand_matrix([10.0, 5.0, 2.0, 1.0, 0.5])
    b0, a0 = minor_factors(w, rank=2, scaling=2.0)
    assert b0.shape == (7, 2) and a0.shape == (2, 5)
    minor = u[:, 3:] @ torch.diag(torch.tensor([1.0, 0.5], dtype=torch.float64)) @ v[:, 3:].T
    torch.testing.assert_close(2.0 * b0 @ a0, minor, atol=1e-12, rtol=0)  # s B0 A0 = U_r S_r V_r^T (last r)
    residual = torch.linalg.svdvals(w - 2.0 * b0 @ a0)[:3]
    torch.testing.assert_close(residual, torch.tensor([10.0, 5.0, 2.0], dtype=torch.float64))
    # sqrt(S_r / s) on each side: B0^T B0 = A0 A0^T = diag(S_r / s)
    torch.testing.assert_close(b0.T @ b0, torch.diag(torch.tensor([0.5, 0.25], dtype=torch.float64)), atol=1e-12, rtol=0)
    torch.testing.assert_close(a0 @ a0.T, torch.diag(torch.tensor([0.5, 0.25], dtype=torch.float64)), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="rank"):
        minor_factors(w, rank=6, scaling=1.0)


def test_init_is_the_base_and_rewrites_w0(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "milora", tmp_path)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    w0 = base_weights(tiny)
    effective = residual_effective_weights(model)
    assert len(effective) == 14
    for name, w in effective.items():
        torch.testing.assert_close(w, w0[name], rtol=1e-5, atol=1e-6)
        layer = lora_layers(model)[name]
        assert not torch.allclose(layer.get_base_layer().weight, w0[name])  # W_res = W0 - s B0 A0
        assert layer.lora_A["default"].weight.requires_grad and layer.lora_B["default"].weight.requires_grad
    assert method.costs()["svd_seconds"] > 0 and not method.costs()["factors_reused"]
    assert (tmp_path / "milora_factors.safetensors").is_file() and (tmp_path / "milora_init").is_dir()


def test_adapter_spans_the_minor_right_singular_subspace(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "milora", tmp_path)
    w0 = base_weights(tiny)
    r = 8
    for name, layer in lora_layers(model).items():
        _, s, vh = torch.linalg.svd(w0[name].double(), full_matrices=False)
        a0 = layer.lora_A["default"].weight.detach().double()
        b0 = layer.lora_B["default"].weight.detach().double()
        minor, principal = vh[-r:], vh[:-r]
        # A's rows lie in span(V_min) and are orthogonal to every principal right singular vector
        torch.testing.assert_close(a0 @ minor.T @ minor, a0, atol=1e-5, rtol=0)
        assert (a0 @ principal.T).abs().max() < 1e-4 * a0.abs().max(), name
        # the adapter carries exactly the r smallest singular values, the residual the others
        sv = torch.linalg.svdvals(layer.scaling["default"] * b0 @ a0)[:r]
        torch.testing.assert_close(sv, s[-r:], rtol=1e-4, atol=1e-6)
        residual = layer.get_base_layer().weight.detach().double()
        torch.testing.assert_close(torch.linalg.svdvals(residual)[: len(s) - r], s[: len(s) - r], rtol=1e-4, atol=1e-6)


def test_scale_interpolates_against_the_true_w0(tiny, tmp_path):
    model, method, _ = prepared(tiny, "milora", tmp_path)
    assert_scale_interpolates_against_true_w0(tiny, model, method, tmp_path)


def test_export_is_the_converted_update_on_the_unmodified_base(tiny, tmp_path):
    model, method, _ = prepared(tiny, "milora", tmp_path / "run")
    randomize_lora_b(model, std=0.2)
    stored = method.export(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32 and config["init_lora_weights"] is True
    assert stored == (tmp_path / "export" / "adapter_model.safetensors").stat().st_size
    probe = target_batch(tiny)
    reloaded = LoRA.load_export(fresh_base(tiny), tmp_path / "export")
    torch.testing.assert_close(logits_of(reloaded, probe), logits_of(model, probe), rtol=1e-4, atol=1e-4)


def test_resumed_prepare_reuses_the_saved_factors(tiny, tmp_path):
    first, _, _ = prepared(tiny, "milora", tmp_path)
    second, m2, _ = prepared(tiny, "milora", tmp_path, seed=1)  # another global RNG state: the factors still match
    assert m2.costs()["factors_reused"]
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_ranks_are_rejected(tiny, tmp_path):
    with pytest.raises(MethodConfigError, match="method.rank"):
        build_named("milora", rank=0)
    with pytest.raises(MethodConfigError, match=r"method.rank=17 is not allowed: at most 16"):
        prepared(tiny, "milora", tmp_path, rank=17)  # k_proj / v_proj of the tiny model are 32 -> 16
