"""LoRA-Null pinned to a re-derivation of the authors' construction written here: the null space from a given
covariance (the r smallest eigen-directions, a near tie included), the unscaled factors of W0 N N^T; on the model N
comes from the prompts-only covariance (re-derived here from the base), the model is the base at init, both factors
train (v1) or only B (freeze_a, v2: A orthogonal to the top directions, and after training the update barely touches
retained inputs, unlike LoRA's); scale(alpha) interpolates against the true W0, the export is the converted update
(rank 2r; rank r with A frozen) on the unmodified base, and a resumed run reuses the saved statistics."""

from __future__ import annotations

import json

import pytest
import torch

from baselines.common import lora_delta, lora_layers
from baselines.corda import prompt_windows
from baselines.lora import LoRA
from baselines.loranull import null_factors, null_space_basis, null_space_of
from experiments.activations import collect_inputs, discover_sites
from experiments.calibration import pair_example, reference_pairs, target_examples
from experiments.config import train_config
from experiments.methods import MethodConfigError, build_named
from experiments.train import train
from tests.baselines.baseline_helpers import (
    assert_scale_interpolates_against_true_w0,
    base_weights,
    fresh_base,
    logits_of,
    prepared,
    randomize_lora_b,
    residual_effective_weights,
    retained_batch,
    run_context,
    target_batch,
)


def orthogonal_columns(n, scales, seed=0):
    """(n, len(scales)) with orthogonal columns of norms `scales` * sqrt(n): an exactly diagonal second moment."""
    q, _ = torch.linalg.qr(torch.randn(n, len(scales), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q * torch.tensor(scales, dtype=torch.float64) * n ** 0.5


def test_null_space_and_factors_on_hand_built_inputs():
    e = torch.eye(6, dtype=torch.float64)
    # Retained inputs: energy 25, 9, 4, 1, 0.01, 0.0001 along e0 ... e5.
    x = orthogonal_columns(500, [5.0, 3.0, 2.0, 1.0, 0.1, 0.01])
    n = null_space_basis(x, 2)
    assert n.shape == (6, 2) and n.dtype == torch.float32
    torch.testing.assert_close(n.abs().double(), e[:, [5, 4]], atol=1e-5, rtol=0)  # smallest first
    w = torch.arange(1.0, 25.0).reshape(4, 6)
    b0, a0 = null_factors(w, n, rank=2, scaling=2.0)
    # m = r: s B0 A0 is exactly W0 restricted to the null space, and A0 reads nothing else
    torch.testing.assert_close(2.0 * b0 @ a0, w @ n @ n.T, atol=1e-4, rtol=1e-5)
    assert a0[:, :4].abs().max() < 1e-6
    # m > r: the top r components of W0 inside the larger null space
    n3 = null_space_basis(x, 3)
    b1, a1 = null_factors(w, n3, rank=1, scaling=1.0)
    restricted = w @ n3 @ n3.T
    u, s, vh = torch.linalg.svd(restricted)
    torch.testing.assert_close(b1 @ a1, s[0] * u[:, :1] @ vh[:1], atol=1e-4, rtol=1e-5)
    assert a1[:, :3].abs().max() < 1e-6
    with pytest.raises(ValueError, match="rank"):
        null_factors(w, n, rank=3, scaling=1.0)


def test_null_space_from_a_given_prompts_only_covariance():
    """N = the r eigenvectors of C with the smallest eigenvalues (re-derived here with a float64 eigen-decomposition
    of a covariance with known eigenvectors), the factors the top r components of W0 N N^T unscaled (alpha = rank,
    s = 1), the residual W0 - W0 N N^T; a near tie at the m-th smallest eigenvalue (1 + 1e-6) is still resolved."""
    g = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))
    eig = torch.tensor([9.0, 7.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.5 * (1 - 1e-6), 0.1], dtype=torch.float64)
    cov = (q * eig) @ q.T
    w = torch.randn(6, 10, generator=g, dtype=torch.float64)
    for m in (1, 2, 3):
        n = null_space_of(cov, m).double()
        expect = q[:, -m:]  # the m smallest (eig is descending)
        # principal angles between span(N) and the expected subspace: cosines all 1
        torch.testing.assert_close(torch.linalg.svdvals(n.T @ expect), torch.ones(m, dtype=torch.float64), atol=1e-6,
                                   rtol=0)
    n = null_space_of(cov, 2)
    b0, a0 = null_factors(w.float(), n, rank=2, scaling=1.0)
    p = q[:, -2:] @ q[:, -2:].T
    torch.testing.assert_close((b0 @ a0).double(), w @ p, atol=1e-5, rtol=0)
    u, s, vh = torch.linalg.svd(w @ p)
    torch.testing.assert_close(torch.linalg.svdvals(b0.double()), s[:2].sqrt(), atol=1e-5, rtol=0)  # B0 = U sqrt(S)
    torch.testing.assert_close(torch.linalg.svdvals(a0.double()), s[:2].sqrt(), atol=1e-5, rtol=0)  # A0 = sqrt(S) V^T
    b2, a2 = null_factors(w.float(), n, rank=2, scaling=2.0)  # peft's split at s = 2: both factors / sqrt(2)
    torch.testing.assert_close(b2 * 2 ** 0.5, b0, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(a2 * 2 ** 0.5, a0, atol=1e-6, rtol=1e-5)


def authors_covariances(tiny, ctx):
    """Per site, the covariance re-derived here: the base's input on each prompt window (one forward each), divided by
    |max|, X^T X summed and divided by the number of windows (float64)."""
    base = fresh_base(tiny)
    sites = discover_sites(base, list(tiny.cfg.backbone.target_modules), torch.tensor([[1, 1, 1, 1]]))
    modules = dict(base.named_modules())
    windows = prompt_windows(ctx, 256)
    sums, inputs = {}, {}
    handles = [modules[s.modules[0]].register_forward_pre_hook(
        lambda m, a, n=s.name: inputs.__setitem__(n, a[0][0].double())) for s in sites]
    with torch.no_grad():
        for ids in windows:
            base(input_ids=torch.tensor([ids]))
            for site in sites:
                x = inputs[site.name] / inputs[site.name].max().abs()
                sums[site.name] = sums.get(site.name, 0) + x.T @ x
    for h in handles:
        h.remove()
    return sites, {n: c / len(windows) for n, c in sums.items()}


def test_init_is_the_base_and_the_adapter_is_w0_on_the_prompts_null_space(tiny, tmp_path):
    """Per site N spans the r smallest eigen-directions of the re-derived prompts-only covariance (principal angles
    ~0), s B0 A0 = W0 N N^T, alpha = rank (s = 1), the model is the base at init and both factors train."""
    model, method, ctx = prepared(tiny, "loranull", tmp_path)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    w0 = base_weights(tiny)
    for name, w in residual_effective_weights(model).items():
        torch.testing.assert_close(w, w0[name], rtol=1e-5, atol=1e-6)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 28  # A and B of the 14 adapted modules (the authors' v1)
    sites, covs = authors_covariances(tiny, ctx)
    layers = lora_layers(model)
    for site in sites:
        expect = torch.linalg.eigh(covs[site.name]).eigenvectors[:, :8]
        for name in site.modules:
            layer = layers[name]
            assert layer.scaling["default"] == 1.0
            nb = method.null_basis[name].double()
            cosines = torch.linalg.svdvals(nb.T @ expect)
            assert cosines.min() > 1 - 1e-6, (name, cosines.min())
            torch.testing.assert_close(lora_delta(layer).detach().double(), w0[name].double() @ nb @ nb.T,
                                       atol=1e-5, rtol=1e-4)
    assert method.costs()["null_space_build_seconds"] > 0 and not method.costs()["null_space_reused"]


def test_freeze_a_keeps_a_orthogonal_to_the_top_prompt_directions(tiny, tmp_path):
    """The paper's v2: only B trains and every row of A lies in span(N), orthogonal to the top eigen-directions."""
    model, method, ctx = prepared(tiny, "loranull", tmp_path, freeze_a=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 14 and all("lora_B" in n for n in trainable)
    sites, covs = authors_covariances(tiny, ctx)
    layers = lora_layers(model)
    for site in sites:
        top = torch.linalg.eigh(covs[site.name]).eigenvectors[:, 8:]  # every direction but the 8 smallest
        for name in site.modules:
            a = layers[name].lora_A["default"].weight.detach().double()
            assert a.norm(dim=1).min() > 0
            assert ((a / a.norm(dim=1, keepdim=True)) @ top).abs().max() < 1e-5, name


def retained_site_inputs(tiny):
    """Per site, the retained inputs evaluation scores: the calibration prompts with the base's responses (cut at 96)."""
    base = fresh_base(tiny)
    sites = discover_sites(base, list(tiny.cfg.backbone.target_modules), torch.tensor([[1, 1, 1, 1]]))
    seqs = [pair_example(p) for p in reference_pairs(tiny.reference, 96)]
    return sites, collect_inputs(base, sites, seqs, pad_id=tiny.tokenizer.pad_token_id, batch_size=16, max_tokens=4096,
                                 progress=False)


@pytest.mark.trains
def test_update_barely_touches_retained_inputs_after_training(tiny, tmp_path):
    """With A frozen (v2) the update reads only N: ||D X_R|| <= ||D||_2 ||N^T X_R|| on the retained prompt + response
    inputs, whatever B learned; and it touches them far less than LoRA's does."""
    sites, x_ret = retained_site_inputs(tiny)
    target_seqs = target_examples(run_context(tiny, tmp_path))
    x_tgt = collect_inputs(fresh_base(tiny), sites, target_seqs, pad_id=tiny.tokenizer.pad_token_id, batch_size=16,
                           progress=False)
    stats, null_energy = {}, {}
    for name, extra in (("loranull", {"freeze_a": True}), ("lora", {})):
        model, method, ctx = prepared(tiny, name, tmp_path / name, **extra)
        if name == "loranull":  # share of the retained energy that falls in each site's N
            for site in sites:
                x, nb = x_ret[site.name].double(), method.null_basis[site.modules[0]].double()
                null_energy[site.name] = float((x @ nb).pow(2).sum() / x.pow(2).sum())
        init = {n: (m.lora_B["default"].weight.detach().clone(), m.lora_A["default"].weight.detach().clone())
                for n, m in lora_layers(model).items()}
        train(model, method, tiny.examples, ctx, train_config(steps=20, lr=5e-2, batch_size=4, grad_accum=2,
              checkpoint_every=100, progress=False))
        layers = lora_layers(model)
        on_ret = on_tgt = 0.0
        normalised = {}
        for site in sites:
            xr, xt = x_ret[site.name], x_tgt[site.name]
            for module in site.modules:
                b0, a0 = init[module]
                # the converted update D = s (B A - B0 A0) (LoRA: B0 = 0)
                delta = (lora_delta(layers[module]) - layers[module].scaling["default"] * b0 @ a0).detach()
                on_ret += float((xr @ delta.T).pow(2).sum()) / len(xr)
                on_tgt += float((xt @ delta.T).pow(2).sum()) / len(xt)
                spectral = torch.linalg.matrix_norm(delta, 2)
                normalised[module] = (site.name, float((xr @ delta.T).norm() / (spectral * xr.norm())))
        stats[name] = {"normalised": normalised, "worst": max(v for _, v in normalised.values()),
                       "ratio": (on_ret / on_tgt) ** 0.5}
    ln, lo = stats["loranull"], stats["lora"]
    print(f"after training: max over modules of ||D X_R|| / (||D||_2 ||X_R||): loranull {ln['worst']:.3f} "
          f"(bound sqrt(max null-space energy) = {max(null_energy.values()) ** 0.5:.3f}), lora {lo['worst']:.3f}; "
          f"RMS ||D x_retained|| / RMS ||D x_target||: loranull {ln['ratio']:.3f}, lora {lo['ratio']:.3f}")
    # The guarantee: A reads only N, so ||D X_R|| <= ||D||_2 ||N^T X_R||, whatever B learned.
    for module, (site, value) in stats["loranull"]["normalised"].items():
        assert value <= null_energy[site] ** 0.5 + 1e-4, module
    assert stats["loranull"]["worst"] < stats["lora"]["worst"] / 2
    # On this random tiny model the retained spectrum is flat and code shares most directions, so against the target
    # the gap is smaller than on a pretrained model.
    assert stats["loranull"]["ratio"] < 0.8 * stats["lora"]["ratio"]


def test_scale_interpolates_against_the_true_w0(tiny, tmp_path):
    model, method, _ = prepared(tiny, "loranull", tmp_path)
    assert_scale_interpolates_against_true_w0(tiny, model, method, tmp_path)


def test_export_is_the_converted_update_on_the_unmodified_base(tiny, tmp_path):
    """Both factors trained: a rank-2r LoRA [B | B0], [A ; -A0] (alpha doubled) on the true base."""
    model, method, _ = prepared(tiny, "loranull", tmp_path / "run")
    randomize_lora_b(model, std=0.2)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_A["default"].weight.add_(0.05)
    probe = target_batch(tiny)
    trained = logits_of(model, probe)
    method.export(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 16  # 2r, alpha = 2 * rank (s = 1)
    assert torch.equal(logits_of(model, probe), trained)
    reloaded = LoRA.load_export(fresh_base(tiny), tmp_path / "export")
    torch.testing.assert_close(logits_of(reloaded, probe), trained, rtol=1e-4, atol=1e-4)


def test_export_with_a_frozen_is_a_plain_rank_r_lora_on_the_unmodified_base(tiny, tmp_path):
    model, method, _ = prepared(tiny, "loranull", tmp_path / "run", freeze_a=True)
    randomize_lora_b(model, std=0.2)
    trained_b = {n: m.lora_B["default"].weight.detach().clone() for n, m in lora_layers(model).items()}
    probe = target_batch(tiny)
    trained = logits_of(model, probe)
    method.export(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 8
    assert all(torch.equal(m.lora_B["default"].weight, trained_b[n]) for n, m in lora_layers(model).items())
    assert torch.equal(logits_of(model, probe), trained)  # export left the model as it was
    reloaded = LoRA.load_export(fresh_base(tiny), tmp_path / "export")
    for name, layer in lora_layers(reloaded).items():
        torch.testing.assert_close(layer.lora_A["default"].weight, method.init_factors[name][1])
    torch.testing.assert_close(logits_of(reloaded, probe), trained, rtol=1e-4, atol=1e-4)


def test_resumed_prepare_reuses_the_saved_statistics(tiny, tmp_path):
    first, _, _ = prepared(tiny, "loranull", tmp_path)
    second, m2, _ = prepared(tiny, "loranull", tmp_path, seed=1)
    assert m2.costs()["null_space_reused"] and (tmp_path / "loranull_init.safetensors").is_file()
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_hyperparameters_are_rejected(tiny, tmp_path):
    with pytest.raises(MethodConfigError, match=r"method.null_dim=4 is not allowed: null \(= rank\) or an integer >= rank"):
        build_named("loranull", rank=8, null_dim=4)
    with pytest.raises(MethodConfigError, match="method.max_windows"):
        build_named("loranull", max_windows=0)
    with pytest.raises(MethodConfigError, match=r'method.definition=\'2026-11\' is not allowed: "authors"'):
        build_named("loranull", definition="2026-11")
    with pytest.raises(MethodConfigError, match="method.freeze_a"):
        build_named("loranull", freeze_a="yes")
    with pytest.raises(MethodConfigError, match=r"method.null_dim=40 is not allowed: at most 32"):
        prepared(tiny, "loranull", tmp_path, null_dim=40)
