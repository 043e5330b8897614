"""PiSSA (peft): the adapter holds the FIRST r singular components of W0 (orthogonal to MiLoRA's), the model is
the base at init although W0 is rewritten, the randomized-SVD option is seeded by the run, scale(alpha) interpolates
against the true W0 and the export is the converted update on the unmodified base."""

from __future__ import annotations

import json

import pytest
import torch

from baselines.common import lora_layers
from baselines.lora import LoRA
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


def unit_rows(m):
    return m / m.norm(dim=1, keepdim=True)


def test_init_is_the_base_and_rewrites_w0(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "pissa", tmp_path)
    assert model.peft_config["default"].init_lora_weights == "pissa"
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    w0 = base_weights(tiny)
    for name, w in residual_effective_weights(model).items():
        torch.testing.assert_close(w, w0[name], rtol=1e-5, atol=1e-6)
        layer = lora_layers(model)[name]
        assert not torch.allclose(layer.get_base_layer().weight, w0[name])  # W_res = W0 - s B0 A0
        assert layer.lora_A["default"].weight.requires_grad and layer.lora_B["default"].weight.requires_grad
    assert method.costs()["svd_seconds"] > 0 and (tmp_path / "pissa_init").is_dir()


def test_adapter_spans_the_principal_right_singular_subspace(tiny, tmp_path):
    model, _, _ = prepared(tiny, "pissa", tmp_path / "pissa")
    milora, _, _ = prepared(tiny, "milora", tmp_path / "milora")
    minor_layers = lora_layers(milora)
    w0 = base_weights(tiny)
    r = 8
    for name, layer in lora_layers(model).items():
        _, s, vh = torch.linalg.svd(w0[name].double(), full_matrices=False)
        a0 = layer.lora_A["default"].weight.detach().double()
        b0 = layer.lora_B["default"].weight.detach().double()
        principal, rest = vh[:r], vh[r:]
        torch.testing.assert_close(a0 @ principal.T @ principal, a0, atol=1e-5, rtol=0)
        assert (a0 @ rest.T).abs().max() < 1e-4 * a0.abs().max(), name
        sv = torch.linalg.svdvals(layer.scaling["default"] * b0 @ a0)[:r]
        torch.testing.assert_close(sv, s[:r], rtol=1e-4, atol=1e-6)  # the r LARGEST singular values
        # PiSSA's and MiLoRA's down-projections read disjoint sets of right singular directions
        a_minor = minor_layers[name].lora_A["default"].weight.detach().double()
        cosines = unit_rows(a0) @ unit_rows(a_minor).T
        assert cosines.abs().max() < 1e-4, name


def test_randomized_svd_is_seeded_by_the_run_and_close_to_the_principal_components(tiny, tmp_path):
    first, method, _ = prepared(tiny, "pissa", tmp_path / "a", svd_niter=4)
    assert method.peft_init()["init_lora_weights"] == "pissa_niter_4" == first.peft_config["default"].init_lora_weights
    torch.manual_seed(123)  # the draws come from the run's seed, not from the global RNG state
    second, _, _ = prepared(tiny, "pissa", tmp_path / "b", svd_niter=4)
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    assert all(torch.equal(a[k], b[k]) for k in a)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(first, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    w0 = base_weights(tiny)
    for name, layer in lora_layers(first).items():
        s = torch.linalg.svdvals(w0[name].double())
        delta = layer.scaling["default"] * (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).double()
        # an approximate top-r: it captures almost all of the top-r energy of W0
        assert delta.pow(2).sum() >= 0.9 * s[:8].pow(2).sum(), name


def test_scale_interpolates_against_the_true_w0(tiny, tmp_path):
    model, method, _ = prepared(tiny, "pissa", tmp_path)
    assert_scale_interpolates_against_true_w0(tiny, model, method, tmp_path)


def test_export_is_the_converted_update_on_the_unmodified_base(tiny, tmp_path):
    model, method, _ = prepared(tiny, "pissa", tmp_path / "run")
    randomize_lora_b(model, std=0.2)
    method.export(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32 and config["init_lora_weights"] is True
    probe = target_batch(tiny)
    reloaded = LoRA.load_export(fresh_base(tiny), tmp_path / "export")
    torch.testing.assert_close(logits_of(reloaded, probe), logits_of(model, probe), rtol=1e-4, atol=1e-4)


def test_bad_svd_niter_is_rejected():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(MethodConfigError, match="method.svd_niter"):
            build_named("pissa", svd_niter=bad)
