"""O-LoRA: the L1 orthogonality penalty on hand-built matrices; on the model it is the configured weighted sum
over adapted modules, with A_prev the top retained input directions of each module's site."""

from __future__ import annotations

import pytest
import torch

from baselines.common import lora_layers
from baselines.olora import orthogonality_penalty
from experiments.activations import collect_inputs, discover_sites
from experiments.calibration import pair_example, reference_pairs
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import prepared, randomize_lora_b, target_batch


def test_penalty_on_hand_built_matrices():
    a_prev = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    a = torch.tensor([[1.0, 2.0, 3.0], [-4.0, 5.0, -6.0]])
    # A_prev A^T = [[1, -4], [2, 5]]: the L1 of the entries is 12 (its Frobenius norm would be sqrt(46)).
    assert orthogonality_penalty([(a_prev, a)]).item() == 12.0
    a_prev2 = torch.tensor([[0.6, 0.8]])
    a2 = torch.tensor([[1.0, -1.0], [0.5, 0.5], [0.0, 2.0]])
    # [0.6 - 0.8, 0.3 + 0.4, 1.6] -> 0.2 + 0.7 + 1.6
    assert orthogonality_penalty([(a_prev, a), (a_prev2, a2)]).item() == pytest.approx(12.0 + 2.5)
    # Orthogonal rows cost nothing.
    assert orthogonality_penalty([(a_prev, torch.tensor([[0.0, 0.0, 7.0]]))]).item() == 0.0


def test_bad_knobs_are_rejected():
    with pytest.raises(MethodConfigError, match="method.lambda1"):
        build_named("olora", lambda1=-1.0)
    with pytest.raises(MethodConfigError, match="method.prev_rank"):
        build_named("olora", prev_rank=0)


def test_extra_loss_is_the_weighted_sum_over_modules_with_retained_top_directions(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "olora", tmp_path, lambda1=0.7, lambda2=0.01, prev_rank=3)
    randomize_lora_b(model)
    layers = lora_layers(model)
    assert len(layers) == 14 and set(method.a_prev) == set(layers)

    # A_prev of a site: the top eigenvectors of the uncentered second moment of its retained inputs.
    base_model = model.get_base_model()
    with model.disable_adapter():
        sites = discover_sites(base_model, list(tiny.cfg.backbone.target_modules), torch.tensor([[1, 1, 1, 1]]))
        seqs = [pair_example(p) for p in reference_pairs(tiny.reference)]
        x = collect_inputs(base_model, sites, seqs, pad_id=tiny.tokenizer.pad_token_id, progress=False)
    for site in sites:
        evals, evecs = torch.linalg.eigh(x[site.name].T @ x[site.name] / len(x[site.name]))
        top = evecs[:, -3:]  # the 3 largest eigenvalues
        for module in site.modules:
            a_prev = method.a_prev[module]
            assert a_prev.shape == (3, site.dim)
            torch.testing.assert_close(a_prev @ a_prev.T, torch.eye(3), atol=1e-5, rtol=0)
            # Same span as the top eigenvectors (projectors agree).
            torch.testing.assert_close(a_prev.T @ a_prev, top @ top.T, atol=1e-3, rtol=0)

    by_hand = 0.0
    sq = 0.0
    for name, layer in layers.items():
        a = layer.lora_A["default"].weight.detach()
        b = layer.lora_B["default"].weight.detach()
        by_hand += float((method.a_prev[name] @ a.T).abs().sum())
        sq += float(a.pow(2).sum() + b.pow(2).sum())
    loss = method.extra_loss(model, target_batch(tiny), ctx)
    assert loss.item() == pytest.approx(0.7 * by_hand + 0.01 * sq, rel=1e-5)
    loss.backward()
    assert all(layer.lora_A["default"].weight.grad.abs().sum() > 0 for layer in layers.values())


def test_penalty_alone_drives_a_orthogonal_to_the_retained_directions(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "olora", tmp_path, lambda1=1.0)
    start = method.penalty_terms(model)[0].item()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        method.extra_loss(model, {}, ctx).backward()
        opt.step()
    end = method.penalty_terms(model)[0].item()
    assert end < 0.25 * start, (start, end)


def test_resumed_prepare_reuses_the_saved_basis(tiny, tmp_path):
    _, first, _ = prepared(tiny, "olora", tmp_path)
    _, second, _ = prepared(tiny, "olora", tmp_path)
    assert not first.costs()["basis_reused"] and second.costs()["basis_reused"]
    for name in first.a_prev:
        assert torch.equal(first.a_prev[name], second.a_prev[name])
    assert first.costs()["basis_rank_mean"] == 8
    # lambda1 = lambda2 = 0 is plain LoRA: no extra term at all.
    model, zero, ctx = prepared(tiny, "olora", tmp_path / "zero", lambda1=0.0)
    assert zero.extra_loss(model, {}, ctx) is None
