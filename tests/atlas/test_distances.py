"""Distances to the atlas's centers are exact to float32 rounding, also for degenerate and near-degenerate
clusters far from the origin (where |x|^2 - 2 x.c + |c|^2 cancels), and no cluster's radius is (near) zero."""

from __future__ import annotations

import pytest
import torch

from atlas.atlas import SIGMA2_FLOOR, SiteAtlas, _radii
from tests.atlas.atlas_helpers import layer_site, site_atlas


def far_tight_site() -> tuple[SiteAtlas, torch.Tensor, torch.Tensor]:
    """Three centers of norm ~300 in 64-d with sigma^2 1e-11 (degenerate), 1e-6 (near-degenerate) and 1; points at
    distances 1e-5 .. 3 from each."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 64, generator=g, dtype=torch.float64) * 40.0
    sigma2 = torch.tensor([1e-11, 1e-6, 1.0], dtype=torch.float64)
    offsets = torch.randn(30, 64, generator=g, dtype=torch.float64)
    offsets = offsets / offsets.norm(dim=1, keepdim=True) * torch.logspace(-5, 0.5, 30, dtype=torch.float64)[:, None]
    points = centers.repeat_interleave(10, 0) + offsets
    site = SiteAtlas(centers.float(), sigma2.float(), torch.zeros(3, 64, 1), torch.zeros(3, dtype=torch.int32),
                     torch.tensor(0.0))
    return site, points, sigma2


def test_distances_match_float64_for_degenerate_clusters_far_from_the_origin():
    site, points, sigma2 = far_tight_site()
    centers64 = site.centers.double()  # the centers as stored (float32), so only the arithmetic differs
    x32 = points.float()
    exact = (x32.double()[:, None, :] - centers64[None]).square().sum(2) / site.sigma2.double()
    got = layer_site(site).distances(x32).double()
    torch.testing.assert_close(got, exact, rtol=1e-4, atol=0.0)
    assert torch.equal(got.argmin(1), exact.argmin(1))
    assert torch.equal(site.delta(x32).double().argmin(1), exact.argmin(1))
    # the layer's nearest center (the float64 expansion of `atlas.kmeans.nearest_centers`), for every point
    assert torch.equal(layer_site(site).nearest(x32), exact.argmin(1))


def test_nearest_center_matches_float64_differences_on_activation_like_data():
    """k* from the float64 expansion against argmin of float64 differences: 4,000 points of norm ~1e3 with a shared
    offset (as one token position's activations have), 16 centers among them, radii over 6 orders of magnitude."""
    g = torch.Generator().manual_seed(3)
    offset = torch.randn(96, generator=g, dtype=torch.float64) * 100.0
    points = offset + torch.randn(4000, 96, generator=g, dtype=torch.float64) * torch.logspace(-3, 1, 4000,
                                                                                                dtype=torch.float64)[:, None]
    centers = points[torch.randperm(4000, generator=g)[:16]] + 1e-4
    sigma2 = torch.logspace(-4, 2, 16, dtype=torch.float64)
    site = SiteAtlas(centers.float(), sigma2.float(), torch.zeros(16, 96, 1), torch.zeros(16, dtype=torch.int32),
                     torch.tensor(0.0))
    x32 = points.float()
    exact = ((x32.double()[:, None, :] - site.centers.double()[None]).square().sum(2) / site.sigma2.double())
    assert torch.equal(layer_site(site).nearest(x32), exact.argmin(1))
    # the expansion the layer used before: off by orders of magnitude on the tight clusters
    xf, cf = x32, site.centers
    expansion = (xf.square().sum(1, keepdim=True) - 2 * xf @ cf.T + cf.square().sum(1)).clamp_min(0) / site.sigma2
    assert ((expansion.double() - exact).abs() / exact.clamp_min(1e-30)).max() > 10.0


def test_no_radius_below_the_floor():
    x = torch.cat([torch.full((20, 8), 3.0), torch.randn(40, 8, generator=torch.Generator().manual_seed(1))])
    centers = torch.stack([torch.full((8,), 3.0), torch.zeros(8)])
    assign = torch.cat([torch.zeros(20, dtype=torch.long), torch.ones(40, dtype=torch.long)])
    sigma2 = _radii(x, centers, assign)
    spread = (x - centers[assign]).square().sum(1).mean()
    assert float(sigma2[0]) == pytest.approx(SIGMA2_FLOOR * float(spread), rel=1e-6)
    assert float(sigma2[1]) == pytest.approx(float((x[20:] - centers[1]).square().sum(1).mean()), rel=1e-6)
    site = site_atlas(torch.cat([x, x + 1e-7]), 2, 0.9, 4, 0.9, seed=0)
    assert float(site.sigma2.min()) > 0.0 and torch.isfinite(site.log_q)
