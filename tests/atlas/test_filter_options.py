"""The atlas's two filter options: `filter_members` (fit each center's filter on its k-means cluster or on the tokens
the layer assigns to it) and `filter_basis` (every filter inside one shared top-P basis of the site, U_k = V W_k):
what each computes, what is stored, and that the layer's two-product form equals the equation."""

import pytest
import torch

from atlas.atlas import EPS, SiteAtlas, cast, load_atlas, save_atlas
from atlas.footprint import footprint
from atlas.kmeans import WeightedCenters, kmeans, nearest_centers
from atlas.method import ATLAS
from experiments.activations import second_moment_basis
from experiments.methods import build_named
from tests.atlas.atlas_helpers import random_atlas, site_atlas
from tests.atlas.test_atlas import TARGETS, batch, prepared, tiny_model
from tests.atlas.test_layer_fast_path import assert_matches_equation, inputs, layer_for


def projector(u: torch.Tensor) -> torch.Tensor:
    return u.double() @ u.double().T


def tight_and_wide(seed=0, d=12):
    """A tight cluster next to a wide one: plain distance (k-means) and the normalised distance (the layer) give
    the tight cluster's outskirts to different centers."""
    g = torch.Generator().manual_seed(seed)
    tight = torch.randn(300, d, generator=g) * 0.3 + 3 * torch.eye(d)[0]
    wide = torch.randn(300, d, generator=g) * torch.linspace(0.5, 3.0, d) + 3 * torch.eye(d)[1]
    return torch.cat([tight, wide])


def test_assigned_members_fit_each_filter_on_the_tokens_the_layer_assigns_to_its_center():
    x = tight_and_wide()
    site = site_atlas(x, 2, 0.8, 4, 0.9, seed=0, filter_members="assigned")
    centers, assign = kmeans(x, 2, 0)
    assert torch.equal(site.centers, centers)
    layer_rule = nearest_centers(x, WeightedCenters(site.centers, 1.0 / site.sigma2.clamp_min(EPS)))
    assert (layer_rule != assign).sum() > 10, "the data should make the two memberships differ"
    kmeans_site = site_atlas(x, 2, 0.8, 4, 0.9, seed=0)
    differs = False
    for j in range(2):
        r, rk = int(site.ranks[j]), int(kmeans_site.ranks[j])
        expect = second_moment_basis(x[layer_rule == j], 0.8, 4)
        assert r == expect.shape[1]
        torch.testing.assert_close(projector(site.filters[j, :, :r]), projector(expect), atol=1e-5, rtol=0)
        from_kmeans = second_moment_basis(x[assign == j], 0.8, 4)
        torch.testing.assert_close(projector(kmeans_site.filters[j, :, :rk]), projector(from_kmeans), atol=1e-5, rtol=0)
        differs |= r != rk or not torch.allclose(projector(site.filters[j, :, :r]), projector(from_kmeans), atol=1e-3)
    assert differs


def test_an_unknown_filter_members_value_is_refused():
    with pytest.raises(ValueError, match="filter_members 'nearest'"):
        site_atlas(tight_and_wide(), 2, 0.8, 4, 0.9, seed=0, filter_members="nearest")


@pytest.mark.parametrize("members", ["kmeans", "assigned"])
def test_shared_basis_filters_are_orthonormal_inside_the_basis_and_follow_energy_and_cap(members):
    x = tight_and_wide(seed=3, d=16)
    site = site_atlas(x, 3, 0.7, 4, 0.9, seed=1, filter_basis=6, filter_members=members)
    v, w = site.basis, site.coefs
    assert site.filter_basis == 6 and v.shape == (16, 6) and w.shape[:2] == (3, 6)
    torch.testing.assert_close(v.T @ v, torch.eye(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(v, second_moment_basis(x, 1.0, 6))  # the site's top-6 directions, all its tokens
    assert torch.equal(site.filters, SiteAtlas.basis_filters(v, w))
    assign = kmeans(x, 3, 1)[1] if members == "kmeans" else \
        nearest_centers(x, WeightedCenters(site.centers, 1.0 / site.sigma2.clamp_min(EPS)))
    for j in range(3):
        r = int(site.ranks[j])
        u = site.filters[j, :, :r]
        assert 1 <= r <= 4
        torch.testing.assert_close(u.T @ u, torch.eye(r), atol=1e-5, rtol=0)
        torch.testing.assert_close(v @ (v.T @ u), u, atol=1e-5, rtol=0)  # inside span(V)
        members_x = x[assign == j]
        kept = lambda k: float((members_x @ site.filters[j, :, :k]).square().sum() / members_x.square().sum())  # noqa: E731
        assert r == 4 or kept(r) >= 0.7 - 1e-5  # the share of the members' whole energy, not of their part in V
        assert r == 1 or kept(r - 1) < 0.7
    assert torch.equal(site.filters[:, :, int(site.ranks.max()):], torch.zeros_like(site.filters[:, :, int(site.ranks.max()):]))


def test_shared_basis_stores_the_basis_once_and_each_filter_as_p_coordinates(tmp_path):
    x = tight_and_wide(seed=4, d=16)
    full = site_atlas(x, 3, 0.95, 4, 0.9, seed=2)
    shared = site_atlas(x, 3, 0.95, 4, 0.9, seed=2, filter_basis=5)
    per = 4
    assert full.nbytes() == per * (3 * 16 + 3 + 16 * int(full.ranks.sum()) + 2) + 4 * 3
    assert shared.nbytes() == per * (3 * 16 + 3 + 16 * 5 + 5 * int(shared.ranks.sum()) + 2) + 4 * 3
    for dtype in (torch.float32, torch.bfloat16):
        site = cast(shared, dtype)
        assert torch.equal(site.filters, SiteAtlas.basis_filters(site.basis, site.coefs))
        save_atlas({"s": site}, tmp_path / f"{dtype}.safetensors", {"sites": {}})
        loaded, _ = load_atlas(tmp_path / f"{dtype}.safetensors")
        back = loaded["s"]
        for name in ("centers", "sigma2", "filters", "ranks", "log_q", "basis", "coefs"):
            assert torch.equal(getattr(back, name), getattr(site, name)), name
    from safetensors import safe_open

    with safe_open(str(tmp_path / "torch.float32.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    assert "s/basis" in keys and not any(k.startswith("s/filter.") for k in keys)
    assert {k for k in keys if k.startswith("s/coefs.")} == {f"s/coefs.{j}" for j in range(3) if int(shared.ranks[j])}


def test_a_random_control_of_a_shared_basis_atlas_keeps_its_form_and_ranks():
    x = tight_and_wide(seed=5, d=16)
    real = site_atlas(x, 3, 0.8, 4, 0.9, seed=0, filter_basis=6, gate_signal="subspace")
    rand = random_atlas(real, x, 0.9, seed=9, gate_signal="subspace")
    assert rand.filter_basis == 6 and torch.equal(rand.ranks, real.ranks)
    torch.testing.assert_close(rand.basis.T @ rand.basis, torch.eye(6), atol=1e-5, rtol=0)
    assert torch.equal(rand.filters, SiteAtlas.basis_filters(rand.basis, rand.coefs))
    assert not torch.allclose(rand.basis.abs(), real.basis.abs(), atol=1e-2)


@pytest.mark.parametrize("gate_signal", ["distance", "subspace"])
@pytest.mark.parametrize("assign", ["hard", "soft"])
def test_the_layer_with_a_shared_basis_matches_the_equation(gate_signal, assign):
    """(x V) W in the layer equals U_k^T x of the equation (float64, explicit d x d projections): outputs and the
    gradients with respect to the input, A and B."""
    g = torch.Generator().manual_seed(0)
    d = 24
    x = torch.cat([torch.randn(150, d, generator=g) * s + 5 * torch.eye(d)[j] for j, s in enumerate([0.2, 0.6, 1.2, 2.0])])
    site = site_atlas(x, 4, 0.8, 3, 0.9, seed=0, gate_signal=gate_signal, filter_basis=7,
                            filter_members="assigned")
    layer = layer_for(site, assign=assign, gate_signal=gate_signal)
    assert layer.site.basis is not None and layer.site.coef_cols.shape == (7, 4 * site.filters.shape[2])
    assert_matches_equation(layer, inputs(site, x))


def test_a_shared_basis_atlas_exports_and_reloads_to_the_same_outputs(tiny_backbone_dir, tmp_path):
    model, method, tok = prepared(tiny_backbone_dir, tmp_path / "run", filter_basis=3, filter_members="assigned")
    assert all(s.filter_basis == 3 for s in method.atlas.values())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    b = batch(tok)
    before = model(**b).logits
    method.export(model, tmp_path / "export")
    fresh, _, _ = tiny_model(tiny_backbone_dir)
    loaded = ATLAS.from_export(fresh, tmp_path / "export")
    assert loaded.params.filter_basis == 3 and loaded.params.filter_members == "assigned"
    assert torch.equal(fresh(**b).logits, before)


def test_footprint_counts_a_shared_basis_as_a_built_atlas_holds_it(tiny_backbone_dir, tmp_path):
    model, method, _ = prepared(tiny_backbone_dir, tmp_path, rank=4, alpha=8, filter_basis=3)
    c = model.config
    shapes = {k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "head_dim")}
    sites = method.atlas.values()
    k = method.params.num_centers
    # the P-weighted mean rank, so that sum_sites P * K * mean = the stored coordinates exactly (P = 3 at every site)
    mean_rank = sum(int(s.ranks.sum()) for s in sites) / (k * len(sites))
    est = footprint(shapes, 4, k, method.params.filter_rank, TARGETS, bytes_per_value=4, mean_filter_rank=mean_rank,
                    filter_basis=3)
    real = sum(s.centers.numel() + s.sigma2.numel() + s.basis.numel() + 3 * int(s.ranks.sum()) + 1 for s in sites)
    assert est["atlas_params"] == pytest.approx(real)
    assert est["atlas_params"] < footprint(shapes, 4, k, method.params.filter_rank, TARGETS,
                                           mean_filter_rank=mean_rank)["atlas_params"]


@pytest.mark.parametrize("key,value,allowed", [("filter_basis", 0, "null or an integer >= 1"),
                                               ("filter_basis", 2.5, "null or an integer >= 1"),
                                               ("filter_members", "nearest", "one of ['kmeans', 'assigned']")])
def test_bad_filter_options_are_refused_before_any_compute(key, value, allowed):
    with pytest.raises(ValueError) as err:
        build_named("atlas", target_modules=TARGETS, **{key: value})
    assert key in str(err.value) and allowed in str(err.value)
