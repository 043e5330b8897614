"""An atlas site and its layer for tests, with every option named. The options a test does not vary are the layer's
first design (a distance gate at a quantile, each filter in the full input space fitted on its k-means cluster, hard
assignment at full conditioning), which the geometry tests were written against; `conf/method/atlas.yaml` holds the
method's defaults."""

from __future__ import annotations

import torch

from atlas.atlas import SiteAtlas, build_site_atlas, random_site_atlas
from atlas.layer import AtlasSite

FIRST_DESIGN = dict(gate_signal="distance", gate_fit="quantile", filter_basis=None, filter_members="kmeans")
LAYER = dict(assign="hard", gate_temperature=1.0, assign_temperature=1.0, use_gate=True, use_filter=True,
             gate_signal="distance", conditioning=1.0)


def site_atlas(x: torch.Tensor, num_centers: int, filter_energy: float, filter_rank: int, gate_quantile: float,
               seed: int, **options) -> SiteAtlas:
    """`build_site_atlas` with `FIRST_DESIGN` for every option not in `options`."""
    return build_site_atlas(x, num_centers=num_centers, filter_energy=filter_energy, filter_rank=filter_rank,
                            gate_quantile=gate_quantile, seed=seed, **{**FIRST_DESIGN, **options})


def random_atlas(reference: SiteAtlas, x: torch.Tensor, gate_quantile: float, seed: int, **options) -> SiteAtlas:
    """`random_site_atlas` with the first design's gate for every gate option not in `options`."""
    gate = {"gate_signal": FIRST_DESIGN["gate_signal"], "gate_fit": FIRST_DESIGN["gate_fit"], **options}
    return random_site_atlas(reference, x, gate_quantile=gate_quantile, seed=seed, **gate)


def layer_site(site: SiteAtlas, **options) -> AtlasSite:
    """`AtlasSite` with `LAYER` for every option not in `options`."""
    return AtlasSite(site, **{**LAYER, **options})
