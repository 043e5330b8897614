"""EWC: the Fisher is the mean squared per-sample gradient of the base's log-likelihood of its own responses,
w.r.t. the base weights; the penalty is (lambda / 2) sum F (s B A)^2, 0 at init; the Fisher is cached on disk,
keyed, and reused without a backward pass."""

from __future__ import annotations

import pytest
import torch

import baselines.ewc as ewc_module
from baselines.common import lora_layers
from baselines.ewc import ewc_penalty, fisher_root
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import fresh_base, prepared, randomize_lora_b, run_context, target_batch


def test_penalty_formula_on_hand_built_matrices():
    fisher = {"a": torch.tensor([[1.0, 2.0], [0.0, 4.0]]), "b": torch.tensor([[0.5]])}
    deltas = {"a": torch.tensor([[1.0, -1.0], [3.0, 0.5]]), "b": torch.tensor([[2.0]])}
    # 1*1 + 2*1 + 0*9 + 4*0.25 + 0.5*4
    assert ewc_penalty(fisher, deltas).item() == pytest.approx(6.0)


def test_bad_knobs_are_rejected():
    with pytest.raises(MethodConfigError, match="method.ewc_lambda"):
        build_named("ewc", ewc_lambda=-1)
    with pytest.raises(MethodConfigError, match="method.max_sequences"):
        build_named("ewc", max_sequences=0)


def test_fisher_is_the_mean_squared_per_sample_gradient_of_the_base(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "ewc", tmp_path / "run", max_sequences=3, seed=5)
    pairs = method.fisher_pairs(ctx)
    assert len(pairs) == 3
    base = fresh_base(tiny)
    name = "model.layers.1.mlp.down_proj"
    weight = dict(base.named_modules())[name].weight
    by_hand = torch.zeros_like(weight)
    for pair in pairs:
        ids = torch.tensor([pair.prompt_ids + pair.response_ids])
        logp = torch.log_softmax(base(input_ids=ids).logits[0].float(), -1)
        n = len(pair.prompt_ids)
        total = sum(logp[n - 1 + t, tok] for t, tok in enumerate(pair.response_ids))
        (grad,) = torch.autograd.grad(total, weight)
        by_hand += grad.pow(2)
    by_hand /= 3
    assert by_hand.abs().sum() > 0
    torch.testing.assert_close(method.fisher[name], by_hand, rtol=1e-4, atol=1e-10)
    assert set(method.fisher) == set(lora_layers(model)) and len(method.fisher) == 14


def test_penalty_is_zero_at_init_and_the_formula_after(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "ewc", tmp_path, ewc_lambda=250.0)
    batch = target_batch(tiny)
    assert method.extra_loss(model, batch, ctx).item() == 0.0  # B = 0: no update yet
    randomize_lora_b(model)
    by_hand = 0.0
    for name, layer in lora_layers(model).items():
        s = layer.scaling["default"]
        delta = s * layer.lora_B["default"].weight.detach() @ layer.lora_A["default"].weight.detach()
        assert s == 16 / 8
        by_hand += float((method.fisher[name] * delta.pow(2)).sum())
    loss = method.extra_loss(model, batch, ctx)
    assert by_hand > 0 and loss.item() == pytest.approx(125.0 * by_hand, rel=1e-5)
    loss.backward()
    assert all(layer.lora_B["default"].weight.grad.abs().sum() > 0 for layer in lora_layers(model).values())


def test_fisher_is_cached_on_disk_and_reused_without_a_backward_pass(tiny, tmp_path, monkeypatch):
    _, first, _ = prepared(tiny, "ewc", tmp_path / "a", max_sequences=4, seed=11)
    assert not first.costs()["fisher_cache_hit"] and first.costs()["fisher_build_seconds"] > 0
    root = fisher_root(tiny.cfg.eval.cache_dir)
    assert root == tiny.cache_dir / "fisher" and first.fisher_path.parent == root
    assert (first.fisher_path / "manifest.json").is_file() and not list(root.glob(".*tmp*"))

    def no_fisher(*args, **kwargs):
        raise AssertionError("the Fisher was recomputed although it is cached")

    monkeypatch.setattr(ewc_module, "diagonal_fisher", no_fisher)
    model, second, ctx = prepared(tiny, "ewc", tmp_path / "b", max_sequences=4, seed=11)  # another run, same key
    assert second.costs()["fisher_cache_hit"] and second.fisher_path == first.fisher_path
    for name in first.fisher:
        assert torch.equal(first.fisher[name], second.fisher[name])
    # The key holds the seed (it picks the sequences) and the settings: another seed is another Fisher.
    targets = list(tiny.cfg.backbone.target_modules)
    key_a, _ = second.fisher_key(run_context(tiny, tmp_path / "c", seed=11), targets)
    key_b, _ = second.fisher_key(run_context(tiny, tmp_path / "c", seed=12), targets)
    key_c, _ = build_named("ewc", max_sequences=5).fisher_key(run_context(tiny, tmp_path / "c", seed=11), targets)
    assert len({key_a, key_b, key_c}) == 3
    with pytest.raises(AssertionError, match="recomputed"):
        prepared(tiny, "ewc", tmp_path / "d", max_sequences=4, seed=12)
