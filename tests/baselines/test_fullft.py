"""Full fine-tuning of the adapted modules: exactly the target modules' weights train and nothing else moves,
scale(alpha) is W0 + alpha (W - W0) (0 the base and 1 the trained model, bit for bit), and the export is the adapted
weights in safetensors that a fresh base loads back to the trained outputs."""

from __future__ import annotations

import pytest
import torch

from baselines.fullft import WEIGHTS_FILE, FullFT, load_fullft_export
from experiments.activations import target_linears
from experiments.config import train_config
from experiments.methods import MethodConfigError, build_named
from experiments.train import train
from tests.baselines.baseline_helpers import fresh_base, logits_of, prepared, retained_batch, target_batch


def adapted_weight_names(tiny):
    return {f"{n}.weight" for n in target_linears(fresh_base(tiny), list(tiny.cfg.backbone.target_modules))}


def trained_fullft(tiny, tmp_path, steps=4):
    model, method, ctx = prepared(tiny, "fullft", tmp_path / "run")
    train(model, method, tiny.examples, ctx, train_config(steps=steps, lr=1e-2, batch_size=4, grad_accum=1,
          checkpoint_every=100, progress=False))
    return model, method


@pytest.mark.trains
def test_trains_exactly_the_adapted_modules_weights(tiny, tmp_path):
    model, method, _ = prepared(tiny, "fullft", tmp_path / "run")
    names = adapted_weight_names(tiny)
    assert len(names) == 14
    assert {n for n, p in model.named_parameters() if p.requires_grad} == names
    assert method.costs()["w0_copy_bytes"] == sum(p.numel() * 4 for n, p in model.named_parameters() if n in names)
    batch = retained_batch(tiny)
    assert torch.equal(logits_of(model, batch), logits_of(fresh_base(tiny), batch))
    model, _ = trained_fullft(tiny, tmp_path / "trained")
    base = dict(fresh_base(tiny).named_parameters())
    for name, p in model.named_parameters():
        if name in names:
            assert not torch.equal(p, base[name]), name
        else:
            assert torch.equal(p, base[name]), name  # embeddings, norms: untouched


@pytest.mark.trains
def test_scale_is_w0_plus_alpha_times_the_update(tiny, tmp_path):
    model, method = trained_fullft(tiny, tmp_path)
    names = adapted_weight_names(tiny)
    w0 = {n: p.detach().clone() for n, p in fresh_base(tiny).named_parameters() if n in names}
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    batch = retained_batch(tiny)
    trained_logits = logits_of(model, batch)
    for alpha in (0.5, 0.0, 0.25, 1.0, 1.5):
        method.scale(model, alpha)
        now = {n: p for n, p in model.named_parameters() if n in names}
        for n, w in now.items():
            torch.testing.assert_close(w, w0[n] + alpha * (trained[n] - w0[n]), rtol=1e-6, atol=1e-7)
    method.scale(model, 0.0)
    assert all(torch.equal(p, w0[n]) for n, p in model.named_parameters() if n in names)
    assert torch.equal(logits_of(model, batch), logits_of(fresh_base(tiny), batch))
    method.scale(model, 1.0)
    assert torch.equal(logits_of(model, batch), trained_logits)
    method.scale(model, 0.5)
    with pytest.raises(RuntimeError, match="scale"):
        method.export(model, tmp_path / "export")


@pytest.mark.trains
def test_export_holds_the_adapted_weights_and_reloads_onto_a_fresh_base(tiny, tmp_path):
    from safetensors import safe_open

    model, method = trained_fullft(tiny, tmp_path)
    stored = method.export(model, tmp_path / "export")
    path = tmp_path / "export" / WEIGHTS_FILE
    assert [p.name for p in (tmp_path / "export").iterdir()] == [WEIGHTS_FILE] and stored == path.stat().st_size
    with safe_open(str(path), framework="pt") as fh:
        assert set(fh.keys()) == adapted_weight_names(tiny)
    payload = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if p.requires_grad)
    assert payload < stored < payload + 16_384  # the tensors plus the safetensors header
    probe = target_batch(tiny)
    reloaded = load_fullft_export(fresh_base(tiny), tmp_path / "export")
    assert torch.equal(logits_of(reloaded, probe), logits_of(model, probe))
    assert FullFT.load_export(fresh_base(tiny), tmp_path / "export") is not None
    with pytest.raises(FileNotFoundError):
        load_fullft_export(fresh_base(tiny), tmp_path)


def test_bad_target_modules_are_rejected():
    for bad in ([], "q_proj", [1]):
        with pytest.raises(MethodConfigError, match="method.target_modules"):
            build_named("fullft", target_modules=bad)
