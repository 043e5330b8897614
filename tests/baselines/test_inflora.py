"""InfLoRA: A's rows lie outside the retained input subspace and carry the most target energy there; only B
trains; the model is the base at init; after training Delta W x stays ~0 on retained inputs."""

from __future__ import annotations

import pytest
import torch

from baselines.common import lora_delta, lora_layers
from baselines.inflora import complement_down_projection
from experiments.activations import collect_inputs, discover_sites
from experiments.calibration import pair_example, reference_pairs, target_examples
from experiments.config import train_config
from experiments.methods import MethodConfigError, build_named
from experiments.train import train
from tests.baselines.baseline_helpers import fresh_base, logits_of, prepared, retained_batch, run_context


def orthogonal_columns(n, scales, seed=0):
    """(n, len(scales)) with orthogonal columns of norms `scales` * sqrt(n): an exactly diagonal second moment."""
    q, _ = torch.linalg.qr(torch.randn(n, len(scales), generator=torch.Generator().manual_seed(seed)))
    return q * torch.tensor(scales) * n ** 0.5


def test_down_projection_on_hand_built_inputs():
    e = torch.eye(6)
    # Retained inputs live in span(e0, e1); target inputs: big along e0, then e3 > e4 > e5, nothing on e2.
    retained = orthogonal_columns(400, [3.0, 1.0]) @ e[:2]
    target = orthogonal_columns(400, [10.0, 3.0, 2.0, 0.5], seed=1) @ e[[0, 3, 4, 5]]
    a, m = complement_down_projection(retained, target, epsilon=0.999, rank=3)
    assert m.shape == (6, 2)
    torch.testing.assert_close(m @ m.T, e[:2].T @ e[:2], atol=1e-5, rtol=0)  # M spans e0, e1
    torch.testing.assert_close(a.abs(), e[[3, 4, 5]], atol=1e-5, rtol=0)  # top complement directions, in order
    # The complement holds target energy along 3 directions only: rows beyond them are zero.
    a5, _ = complement_down_projection(retained, target, epsilon=0.999, rank=5)
    assert (a5[3:] == 0).all()
    torch.testing.assert_close(a5[:3].abs(), e[[3, 4, 5]], atol=1e-5, rtol=0)
    # A lower epsilon keeps only e0 in M: e1 (retained energy 1 / 10) is then free for the target.
    a_low, m_low = complement_down_projection(retained, target, epsilon=0.85, rank=1)
    assert m_low.shape == (6, 1) and a_low.abs().argmax() == 3
    retained_in_complement = retained @ (torch.eye(6) - m_low @ m_low.T)
    assert (retained_in_complement.pow(2).sum() / retained.pow(2).sum()) <= 1 - 0.85


def test_epsilon_outside_its_range_is_rejected():
    with pytest.raises(MethodConfigError, match="method.epsilon"):
        build_named("inflora", epsilon=1.0)


def inputs_per_site(tiny, model, sequences):
    sites = discover_sites(model, list(tiny.cfg.backbone.target_modules), torch.tensor([[1, 1, 1, 1]]))
    return sites, collect_inputs(model, sites, sequences, pad_id=tiny.tokenizer.pad_token_id, batch_size=16,
                                 progress=False)


def test_init_is_the_base_and_only_b_trains(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "inflora", tmp_path)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch))
    for name, layer in lora_layers(model).items():
        a = layer.lora_A["default"].weight
        assert not a.requires_grad and layer.lora_B["default"].weight.requires_grad
        m = method.retained_basis[name]
        assert (a @ m).abs().max() < 1e-5, name  # every row of A is orthogonal to the retained subspace
        nonzero = a[a.norm(dim=1) > 0]
        torch.testing.assert_close(nonzero @ nonzero.T, torch.eye(len(nonzero)), atol=1e-5, rtol=0)


@pytest.mark.trains
def test_update_keeps_retained_inputs_unchanged_after_training(tiny, tmp_path):
    base = fresh_base(tiny)
    # The sequences InfLoRA builds its subspaces from (same cut at the run's max length, 96).
    retained_seqs = [pair_example(p) for p in reference_pairs(tiny.reference, 96)]
    target_seqs = target_examples(run_context(tiny, tmp_path))
    sites, x_ret = inputs_per_site(tiny, base, retained_seqs)
    _, x_tgt = inputs_per_site(tiny, base, target_seqs)

    epsilon = 0.99
    stats = {}
    for name, hp in (("inflora", {"epsilon": epsilon}), ("lora", {})):
        model, method, ctx = prepared(tiny, name, tmp_path / name, **hp)
        train(model, method, tiny.examples, ctx, train_config(steps=20, lr=5e-2, batch_size=4, grad_accum=2,
              checkpoint_every=100, progress=False))
        layers = lora_layers(model)
        on_ret = on_tgt = 0.0
        worst_bound = 0.0
        for site in sites:
            xr, xt = x_ret[site.name], x_tgt[site.name]
            for module in site.modules:
                delta = lora_delta(layers[module]).detach()
                on_ret += float((xr @ delta.T).pow(2).sum()) / len(xr)
                on_tgt += float((xt @ delta.T).pow(2).sum()) / len(xt)
                # ||dW X_ret||_F / (||dW||_2 ||X_ret||_F): at most sqrt(1 - epsilon) when A reads only the
                # complement of the retained subspace (which holds <= 1 - epsilon of the retained energy).
                worst_bound = max(worst_bound, float((xr @ delta.T).norm()
                                                     / (torch.linalg.matrix_norm(delta, 2) * xr.norm())))
        stats[name] = {"ratio": (on_ret / on_tgt) ** 0.5, "normalised": worst_bound}
    print(f"after training: RMS ||dW x_retained|| / RMS ||dW x_target|| over all adapted modules: "
          f"inflora {stats['inflora']['ratio']:.3f}, lora {stats['lora']['ratio']:.3f}; "
          f"max over modules of ||dW X_ret|| / (||dW||_2 ||X_ret||): inflora {stats['inflora']['normalised']:.4f} "
          f"(bound sqrt(1 - epsilon) = {(1 - epsilon) ** 0.5:.3f}), lora {stats['lora']['normalised']:.4f}")
    assert stats["inflora"]["normalised"] <= (1 - epsilon) ** 0.5 + 1e-4
    assert stats["inflora"]["normalised"] < stats["lora"]["normalised"] / 3
    # On this random tiny model code and retained inputs share most directions (the target keeps only a few
    # per cent of its energy outside the retained subspace), so against the target the gap is smaller.
    assert stats["inflora"]["ratio"] < 0.75 * stats["lora"]["ratio"]
