"""InfLoRA as the authors' code defines it, pinned to a re-derivation from the paper and the public code's
behaviour: M = top eigenvectors of the retained second moment C_R, m = max(#{k : share of the squared eigenvalues
< epsilon}, 1); A = top left singular vectors of (I - M M^T) C_T divided by sqrt(3); update B A x at scale 1, only
B trains; the model is the base at init; Delta W x on retained inputs is bounded by their energy outside M."""

from __future__ import annotations

import math

import pytest
import torch

from baselines.common import lora_delta, lora_layers
from baselines.inflora import complement_down_projection, retained_basis
from experiments.activations import collect_inputs, discover_sites
from experiments.calibration import pair_example, reference_pairs, target_examples
from experiments.config import train_config
from experiments.methods import MethodConfigError, build_named
from experiments.train import train
from tests.baselines.baseline_helpers import (
    fresh_base,
    logits_of,
    prepared,
    retained_batch,
    run_context,
)

ROW_NORM = 1 / math.sqrt(3)


# -- the re-derivation: d x d moments, float64, every step as the paper / public code states it -----------------
def moment(x: torch.Tensor) -> torch.Tensor:
    """Uncentered second moment (d, d): the mean of x x^T over the rows (tokens)."""
    x = x.double()
    return x.T @ x / len(x)


def reference_basis(retained: torch.Tensor, epsilon: float) -> torch.Tensor:
    """DualGPM after the first task: SVD of the moment, shares of the squared singular values, strict `<` count."""
    u, s, _ = torch.linalg.svd(moment(retained))
    share = torch.cumsum(s**2, 0) / (s**2).sum()
    r = int((share < epsilon).sum())
    return u[:, : max(r, 1)]


def reference_down_projection(retained, target, epsilon, rank):
    """(A, M): A = U[:, :rank]^T / sqrt(3), U the left singular vectors of C_T - M M^T C_T."""
    m = reference_basis(retained, epsilon)
    c = moment(target)
    u, s, _ = torch.linalg.svd(c - m @ (m.T @ c))
    return u[:, :rank].T / math.sqrt(3), m, s


def orthogonal_columns(n, scales, seed=0):
    """(n, len(scales)) with orthogonal columns of norms `scales` * sqrt(n): moment eigenvalues = scales^2."""
    q, _ = torch.linalg.qr(torch.randn(n, len(scales), generator=torch.Generator().manual_seed(seed)))
    return q * torch.tensor(scales) * n**0.5


def random_inputs(n, d, decay, seed):
    """(n, d) inputs with a decaying spectrum in a random basis."""
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    return (torch.randn(n, d, generator=g) * decay ** torch.arange(d)) @ basis.T


# -- the retained subspace --------------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon, authors_m, linear_m", [(0.6, 1, 2), (0.9, 1, 3), (0.95, 2, 4), (0.99, 3, 4)])
def test_subspace_dimension_counts_squared_eigenvalues(epsilon, authors_m, linear_m):
    # Moment eigenvalues 4, 2, 1, 0.5: squared shares 0.753, 0.941, 0.988, 1; linear shares 0.533, 0.8, 0.933, 1.
    x = orthogonal_columns(500, [2.0, 2**0.5, 1.0, 0.5**0.5]) @ torch.eye(4)
    m = retained_basis(x, epsilon)
    assert m.shape == (4, authors_m)
    assert reference_basis(x, epsilon).shape[1] == authors_m
    # The rule covering epsilon of the linear energy (the suite's first definition) keeps more.
    linear = torch.cumsum(torch.tensor([4.0, 2, 1, 0.5]), 0) / 7.5
    assert min(int(torch.searchsorted(linear, torch.tensor(epsilon))) + 1, 4) == linear_m
    torch.testing.assert_close(m @ m.T, torch.eye(4)[:authors_m].T @ torch.eye(4)[:authors_m], atol=1e-5, rtol=0)


def test_subspace_keeps_at_least_one_and_never_the_last_direction():
    x = orthogonal_columns(300, [3.0, 1.0]) @ torch.eye(5)[:2]  # two directions: squared shares 0.988, 1
    assert retained_basis(x, 0.5).shape == (5, 1)  # count 0 -> max(0, 1)
    assert retained_basis(x, 0.9999).shape == (5, 1)  # the share reaching 1 is never strictly below epsilon
    assert retained_basis(torch.zeros(10, 5), 0.9).shape == (5, 0)  # no retained energy: no subspace
    assert retained_basis(torch.zeros(0, 5), 0.9).shape == (5, 0)


@pytest.mark.parametrize("epsilon", [0.5, 0.9, 0.95, 0.98, 0.99, 0.999])
def test_subspace_matches_the_rederivation_on_random_inputs(epsilon):
    x = random_inputs(400, 24, 0.85, seed=3)
    m, ref = retained_basis(x, epsilon), reference_basis(x, epsilon)
    assert m.shape == ref.shape
    torch.testing.assert_close((m @ m.T).double(), ref @ ref.T, atol=1e-4, rtol=0)


# -- the down-projection ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon, rank", [(0.9, 4), (0.98, 8), (0.999, 3)])
def test_down_projection_matches_the_rederivation(epsilon, rank):
    retained = random_inputs(400, 24, 0.8, seed=1)
    target = random_inputs(300, 24, 0.9, seed=2)
    a, m = complement_down_projection(retained, target, epsilon, rank)
    ref_a, ref_m, _ = reference_down_projection(retained, target, epsilon, rank)
    assert a.shape == (rank, 24) and m.shape == ref_m.shape
    torch.testing.assert_close(a.norm(dim=1), torch.full((rank,), ROW_NORM), atol=1e-5, rtol=0)
    # Row by row (up to sign), the authors' vectors.
    torch.testing.assert_close((a.double() * ref_a).sum(1).abs(), torch.full((rank,), 1 / 3, dtype=torch.float64),
                               atol=1e-4, rtol=0)
    assert (a @ m).abs().max() < 1e-6


def test_down_projection_reads_the_squared_target_moment():
    # M = e0; the target couples e0 with e1 and e2, so (I - P) C_T (the authors') and (I - P) C_T (I - P)
    # (the right singular vectors of X_T (I - P), the suite's first definition) have different top directions.
    retained = orthogonal_columns(400, [1.0]) @ torch.eye(3)[:1]
    mix = torch.tensor([[3.0, 0.0, 0.0], [1.5, 1.0, 0.0], [1.5, 0.0, 1.2]])  # target = z @ mix, z white
    target = orthogonal_columns(600, [1.0, 1.0, 1.0], seed=4) @ mix
    a, _ = complement_down_projection(retained, target, 0.9, 1)
    c = moment(target)
    top = torch.linalg.eigh((c @ c)[1:, 1:]).eigenvectors[:, -1]  # top eigenvector of the e1,e2 block of C_T^2
    first = torch.linalg.eigh(c[1:, 1:]).eigenvectors[:, -1]  # ... of C_T's block
    assert a[0, 0].abs() < 1e-6
    torch.testing.assert_close((a[0, 1:].double() @ top).abs(), torch.tensor(ROW_NORM, dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert (top @ first).abs() < 0.99  # the two definitions differ here


def test_down_projection_on_hand_built_inputs():
    e = torch.eye(6)
    # Retained inputs in span(e0, e1) (moment eigenvalues 9, 1); the target along e0 (10), e3 > e4 > e5.
    retained = orthogonal_columns(400, [3.0, 1.0]) @ e[:2]
    target = orthogonal_columns(400, [10.0, 3.0, 2.0, 0.5], seed=1) @ e[[0, 3, 4, 5]]
    a, m = complement_down_projection(retained, target, epsilon=0.95, rank=3)
    torch.testing.assert_close(m @ m.T, e[:1].T @ e[:1], atol=1e-5, rtol=0)  # squared shares 0.988, 1: M = e0
    torch.testing.assert_close(a.abs(), e[[3, 4, 5]] * ROW_NORM, atol=1e-5, rtol=0)
    # Rank beyond the target's directions in the complement: the remaining rows are zero.
    a5, _ = complement_down_projection(retained, target, epsilon=0.95, rank=5)
    assert (a5[3:] == 0).all()
    torch.testing.assert_close(a5[:3].abs(), e[[3, 4, 5]] * ROW_NORM, atol=1e-5, rtol=0)


def test_degenerate_down_projections():
    e = torch.eye(4)
    # Moment eigenvalues 64, 16, 4, 1 -> squared shares 0.753, 0.941, 0.988, 1: epsilon 0.99 keeps m = 3, so the
    # complement holds one direction (e3), whatever the rank.
    retained = orthogonal_columns(500, [8**0.5, 2.0, 2**0.5, 1.0]) @ e
    target = random_inputs(300, 4, 1.0, seed=5)
    a, m = complement_down_projection(retained, target, 0.99, rank=3)
    assert m.shape == (4, 3)
    torch.testing.assert_close(a[0].abs(), e[3] * ROW_NORM, atol=1e-5, rtol=0)
    assert (a[1:] == 0).all()
    # No target energy at all, or none outside M: A is zero (B then receives no gradient).
    assert (complement_down_projection(retained, torch.zeros(50, 4), 0.99, 2)[0] == 0).all()
    inside = orthogonal_columns(200, [5.0, 1.0], seed=6) @ e[:2]
    assert (complement_down_projection(retained, inside, 0.99, 2)[0] == 0).all()
    assert (complement_down_projection(retained, torch.zeros(0, 4), 0.99, 2)[0] == 0).all()
    # No retained inputs: M is empty and A is the target's own top directions.
    a0, m0 = complement_down_projection(torch.zeros(0, 4), target, 0.99, 2)
    ref = torch.linalg.svd(moment(target)).U[:, :2].T / math.sqrt(3)
    assert m0.shape == (4, 0)
    torch.testing.assert_close((a0.double() * ref).sum(1).abs(), torch.full((2,), 1 / 3, dtype=torch.float64),
                               atol=1e-5, rtol=0)


# -- configuration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("epsilon", 1.0), ("definition", "2026-11"), ("alpha", 16)])
def test_bad_values_are_rejected(key, value):
    with pytest.raises(MethodConfigError, match=f"method.{key}"):
        build_named("inflora", **{key: value})


def inputs_per_site(tiny, model, sequences):
    sites = discover_sites(model, list(tiny.cfg.backbone.target_modules), torch.tensor([[1, 1, 1, 1]]))
    return sites, collect_inputs(model, sites, sequences, pad_id=tiny.tokenizer.pad_token_id, batch_size=16,
                                 progress=False)


def test_init_is_the_base_scale_one_and_only_b_trains(tiny, tmp_path):
    model, method, _ = prepared(tiny, "inflora", tmp_path)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch))
    for name, layer in lora_layers(model).items():
        assert layer.scaling["default"] == 1.0, name  # h = W0 x + B A x
        a = layer.lora_A["default"].weight
        assert not a.requires_grad and layer.lora_B["default"].weight.requires_grad
        m = method.retained_basis[name]
        assert (a @ m).abs().max() < 1e-5, name  # every row of A is orthogonal to the retained subspace
        nonzero = a[a.norm(dim=1) > 0]
        torch.testing.assert_close(nonzero @ nonzero.T, torch.eye(len(nonzero)) / 3, atol=1e-5, rtol=0)
    # Post-hoc scale multiplies B A by the factor itself.
    method.scale(model, 0.5)
    assert all(layer.scaling["default"] == 0.5 for layer in lora_layers(model).values())


@pytest.mark.trains
def test_update_on_retained_inputs_stays_within_their_energy_outside_m(tiny, tmp_path):
    base = fresh_base(tiny)
    # The sequences InfLoRA builds its subspaces from (same cut at the run's max length, 96).
    retained_seqs = [pair_example(p) for p in reference_pairs(tiny.reference, 96)]
    target_seqs = target_examples(run_context(tiny, tmp_path))
    sites, x_ret = inputs_per_site(tiny, base, retained_seqs)
    _, x_tgt = inputs_per_site(tiny, base, target_seqs)

    stats, worst = {}, 0.0
    for name in ("inflora", "lora"):
        model, method, ctx = prepared(tiny, name, tmp_path / name, **({"epsilon": 0.99} if name == "inflora" else {}))
        train(model, method, tiny.examples, ctx, train_config(steps=20, lr=5e-2, batch_size=4, grad_accum=2,
              checkpoint_every=100, progress=False))
        layers = lora_layers(model)
        on_ret = on_tgt = 0.0
        for site in sites:
            xr, xt = x_ret[site.name], x_tgt[site.name]
            for module in site.modules:
                delta = lora_delta(layers[module]).detach()
                on_ret += float((xr @ delta.T).pow(2).sum()) / len(xr)
                on_tgt += float((xt @ delta.T).pow(2).sum()) / len(xt)
                if name == "inflora":
                    # ||dW X_R||_F <= ||dW||_2 ||X_R (I - M M^T)||_F: A reads only the complement of M.
                    m = method.retained_basis[module].cpu()
                    outside = (xr - (xr @ m) @ m.T).norm()
                    worst = max(worst, float((xr @ delta.T).norm() / (torch.linalg.matrix_norm(delta, 2) * outside)))
        stats[name] = (on_ret / on_tgt) ** 0.5
    print(f"after training: RMS ||dW x_retained|| / RMS ||dW x_target|| over all adapted modules: "
          f"inflora {stats['inflora']:.3f}, lora {stats['lora']:.3f}; max over modules of "
          f"||dW X_R|| / (||dW||_2 ||X_R (I - M M^T)||): {worst:.4f} (<= 1)")
    assert 0 < worst <= 1 + 1e-4
    assert stats["inflora"] < stats["lora"]
