"""The activation atlas of the retained domains: per site, reference centers, radii, directional filters, gate quantile.

Built once per backbone x retained data x seed from the inputs the adapted modules see on the
retained calibration prompts followed by the base model's own responses (docs/method.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from sklearn.linear_model import LogisticRegression

from atlas.kmeans import WeightedCenters, kmeans, nearest_centers, pairwise_sq_dists
from experiments.activations import second_moment_basis
from experiments.tensor_files import load_tensors, save_tensors

EPS = 1e-12
GATE_SIGNALS = ("distance", "subspace")
#: How the gate's threshold and slope are set: `quantile` = log q at the `gate_quantile` of the signal on retained
#: calibration tokens, slope 1; `logistic` = a class-balanced logistic regression of retained (0) vs target (1)
#: calibration tokens on log s(x), so g(x) is the fitted probability that x is a target input.
GATE_FITS = ("quantile", "logistic")
#: Which calibration tokens each center's filter is fitted on: `kmeans` = its k-means cluster (nearest center by
#: plain distance), `assigned` = the tokens the layer assigns to it (nearest by the normalised distance
#: ||x - c_k||^2 / sigma_k^2, `atlas.layer`), i.e. the tokens the filter will be applied to.
FILTER_MEMBERS = ("kmeans", "assigned")
#: A cluster's sigma^2 is at least this share of the site's mean squared distance to the nearest center: a
#: cluster of (nearly) identical calibration inputs, e.g. a template position, would otherwise get sigma^2 ~ 1e-11
#: and turn any other input assigned to it into an astronomically large distance.
SIGMA2_FLOOR = 1e-3


@dataclass
class SiteAtlas:
    """One site's atlas.

    centers: (K, d) reference centers; sigma2: (K,) mean squared distance of each cluster's members to
    its center; filters: (K, d, R) orthonormal columns (zero-padded past each cluster's rank);
    ranks: (K,) filter rank of each cluster; log_q: the gate's threshold on log s(x) (g = 1/2 there);
    gate_slope: the gate's slope on log s(x) (1 for a quantile gate, fitted for a logistic one):
    g(x) = sigmoid(gate_slope * (log s(x) - log_q) / T).
    basis, coefs: with a shared filter basis (`filter_basis` P), the site's (d, P) orthonormal basis V and each
    cluster's (K, P, R) coordinates W_k in it; then U_k = V W_k, and `filters` is that product in the atlas's
    dtype (`basis_filters`), so what is stored (V, W) and what is computed agree exactly. None without a basis.
    """

    centers: torch.Tensor
    sigma2: torch.Tensor
    filters: torch.Tensor
    ranks: torch.Tensor
    log_q: torch.Tensor
    gate_slope: torch.Tensor = None  # type: ignore[assignment]
    basis: Optional[torch.Tensor] = None
    coefs: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.gate_slope is None:
            self.gate_slope = torch.tensor(1.0)
        if (self.basis is None) != (self.coefs is None):
            raise ValueError("a shared filter basis needs both `basis` (d, P) and `coefs` (K, P, R)")

    @staticmethod
    def basis_filters(basis: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
        """(K, d, R) filters U_k = V W_k from a (d, P) basis and (K, P, R) coordinates, in float32, cast to their dtype."""
        return torch.einsum("dp,kpr->kdr", basis.float(), coefs.float()).to(coefs.dtype)

    @property
    def filter_basis(self) -> Optional[int]:
        """P, the width of the shared filter basis; None when each filter spans the full input space."""
        return None if self.basis is None else self.basis.shape[1]

    @property
    def num_centers(self) -> int:
        return self.centers.shape[0]

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """(n, K) normalised squared distances ||x - c_k||^2 / sigma_k^2, in float32."""
        return pairwise_sq_dists(x.float(), self.centers.float()) / self.sigma2.float().clamp_min(EPS)

    def pass_share(self, x: torch.Tensor) -> torch.Tensor:
        """(n,) share of each input's energy outside its nearest center's filter subspace,
        ||x - U_k* U_k*^T x||^2 / ||x||^2 (float32): what the directional filter passes."""
        xf = x.float()
        kstar = nearest_centers(xf, WeightedCenters(self.centers, 1.0 / self.sigma2.float().clamp_min(EPS)))
        kept = torch.einsum("nd,ndr->nr", xf, self.filters.float()[kstar])
        energy = xf.square().sum(1)
        return (energy - kept.square().sum(1)).clamp_min(0.0) / energy.clamp_min(EPS)

    def gate_signal(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        """(n,) the statistic the gate thresholds: `distance` = min_k delta_k(x), `subspace` = `pass_share(x)`."""
        if kind == "subspace":
            return self.pass_share(x)
        if kind == "distance":
            return self.delta(x).min(1).values
        raise ValueError(f"gate signal {kind!r}: one of {list(GATE_SIGNALS)}")

    def nbytes(self) -> int:
        """Bytes of the stored tensors (filters counted at their true ranks, as they could be stored packed: d values
        per filter column, or with a shared basis the basis's d P values plus P per filter column)."""
        per = self.centers.element_size()
        d = self.centers.shape[1]
        width = d if self.basis is None else self.basis.shape[1]
        filters = width * int(self.ranks.sum()) + (0 if self.basis is None else self.basis.numel())
        return per * (self.centers.numel() + self.sigma2.numel() + filters + 2) + 4 * self.ranks.numel()


def _radii(x: torch.Tensor, centers: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
    k = centers.shape[0]
    d2 = (x - centers[assign]).square().sum(1)
    sums = torch.zeros(k, dtype=x.dtype, device=x.device).index_add_(0, assign, d2)
    counts = torch.bincount(assign, minlength=k).to(x.dtype)
    sigma2 = sums / counts.clamp_min(1)
    spread = d2.mean().clamp_min(EPS)  # an empty or single-point cluster borrows the global spread
    return torch.where(counts > 1, sigma2, spread).clamp_min(SIGMA2_FLOOR * spread)


def _filters(x: torch.Tensor, assign: torch.Tensor, k: int, energy: float, max_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    bases = [second_moment_basis(x[assign == j], energy, max_rank) for j in range(k)]
    return _stack(bases, x.shape[1], x), torch.tensor([b.shape[1] for b in bases], dtype=torch.int32, device=x.device)


def _stack(bases: list[torch.Tensor], rows: int, like: torch.Tensor) -> torch.Tensor:
    """(K, rows, max rank) of per-cluster column blocks, zero-padded past each block's width (at least 1 wide)."""
    out = torch.zeros(len(bases), rows, max(1, max(b.shape[1] for b in bases)), dtype=like.dtype, device=like.device)
    for j, b in enumerate(bases):
        out[j, :, : b.shape[1]] = b
    return out


def _basis_filters(x: torch.Tensor, assign: torch.Tensor, k: int, energy: float, max_rank: int,
                   width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Filters inside one shared basis: V = the top `width` directions of the site's uncentered second moment
    (all its calibration inputs), and per cluster the top directions of its members' second moment within V,
    the fewest that reach `energy` of the members' whole energy (not only of its part in V), at most `max_rank`.
    Returns (V (d, P), W (K, P, R), ranks (K,)); U_k = V W_k is orthonormal."""
    basis = second_moment_basis(x, 1.0, width)
    members = [x[assign == j] for j in range(k)]
    coords = [second_moment_basis(m @ basis, energy, max_rank, total=m.square().sum()) for m in members]
    ranks = torch.tensor([c.shape[1] for c in coords], dtype=torch.int32, device=x.device)
    return basis, _stack(coords, basis.shape[1], x), ranks


def _gate_log_q(site: "SiteAtlas", x: torch.Tensor, quantile: float, signal: str) -> torch.Tensor:
    values = site.gate_signal(x, signal)
    return torch.quantile(values.clamp_min(EPS).double(), quantile).log().float()


def fit_logistic_gate(retained: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """(log_q, slope) of the class-balanced logistic regression P(target | v) = sigmoid(slope * (v - log_q))
    fitted on the log gate signals v of retained (label 0) and target (label 1) calibration tokens
    (scikit-learn's L2-regularised LogisticRegression, C = 1, on v standardised over both sides).

    The slope is at least 1e-3: a signal that does not separate the two gets a nearly flat gate at the
    fitted threshold instead of a sign flip (a gate that would open on retained inputs).
    """
    v = torch.cat([retained, target]).double().cpu()
    if not len(retained) or not len(target):
        raise ValueError("a logistic gate needs retained and target calibration tokens")
    mu, sd = float(v.mean()), float(v.std()) or 1.0
    labels = torch.cat([torch.zeros(len(retained)), torch.ones(len(target))]).numpy()
    fit = LogisticRegression(class_weight="balanced", C=1.0).fit(((v - mu) / sd).unsqueeze(1).numpy(), labels)
    w, b = float(fit.coef_[0, 0]) / sd, float(fit.intercept_[0])
    slope = max(w, 1e-3)
    # the fit is sigmoid(w_std (v - mu) / sd + b) = sigmoid(w (v - (mu - b / w))) with w = w_std / sd
    log_q = mu - b / w if w > 1e-3 else float(torch.quantile(v, 0.5))
    return log_q, slope


def calibrate_gate(site: "SiteAtlas", retained: torch.Tensor, target: Optional[torch.Tensor], fit: str,
                   quantile: float, signal: str) -> "SiteAtlas":
    """Set the site's gate threshold and slope (in place; returns it) by `fit` (see GATE_FITS) from its
    retained and (for `logistic`) target calibration inputs."""
    if fit == "quantile":
        site.log_q, site.gate_slope = _gate_log_q(site, retained, quantile, signal), torch.tensor(1.0)
    elif fit == "logistic":
        if target is None:
            raise ValueError("gate_fit=logistic needs target calibration inputs")
        v_r = site.gate_signal(retained, signal).clamp_min(EPS).log()
        v_t = site.gate_signal(target.to(retained.device), signal).clamp_min(EPS).log()
        log_q, slope = fit_logistic_gate(v_r, v_t)
        site.log_q, site.gate_slope = torch.tensor(log_q, dtype=torch.float32), torch.tensor(slope, dtype=torch.float32)
    else:
        raise ValueError(f"gate fit {fit!r}: one of {list(GATE_FITS)}")
    return site


def build_site_atlas(
    x: torch.Tensor,
    *,
    num_centers: int,
    filter_energy: float,
    filter_rank: int,
    gate_quantile: float,
    seed: int,
    gate_signal: str,
    gate_fit: str,
    filter_basis: Optional[int],
    filter_members: str,
    target: Optional[torch.Tensor] = None,
    dtype: Optional[torch.dtype] = None,
) -> SiteAtlas:
    """The atlas of one site from its (n, d) retained calibration inputs (k-means++, radii, filters, each in the
    full input space when `filter_basis` is None or inside the site's shared top-P basis for `filter_basis` P,
    fitted on the members `filter_members` names) and its gate calibrated by `gate_fit` on `gate_signal`
    (`target`: (m, d) target calibration inputs, needed by the logistic fit). The hyperparameters are ATLAS's
    (`conf/method/atlas.yaml`, meanings in `atlas.method.ATLASParams`); `dtype` casts the result (None: float32)."""
    if filter_members not in FILTER_MEMBERS:
        raise ValueError(f"filter_members {filter_members!r}: one of {list(FILTER_MEMBERS)}")
    x = x.float()
    centers, assign = kmeans(x, num_centers, seed)
    sigma2 = _radii(x, centers, assign)
    if filter_members == "assigned":
        assign = nearest_centers(x, WeightedCenters(centers, 1.0 / sigma2.clamp_min(EPS)))
    zero = torch.tensor(0.0, device=x.device)
    if filter_basis is None:
        filters, ranks = _filters(x, assign, centers.shape[0], filter_energy, filter_rank)
        site = SiteAtlas(centers, sigma2, filters, ranks, zero)
    else:
        basis, coefs, ranks = _basis_filters(x, assign, centers.shape[0], filter_energy, filter_rank, filter_basis)
        site = SiteAtlas(centers, sigma2, SiteAtlas.basis_filters(basis, coefs), ranks, zero, basis=basis, coefs=coefs)
    calibrate_gate(site, x, None if target is None else target.float(), gate_fit, gate_quantile, gate_signal)
    return cast(site, dtype) if dtype is not None else site


def random_site_atlas(reference: SiteAtlas, x: torch.Tensor, *, gate_quantile: float, seed: int, gate_signal: str,
                      gate_fit: str, target: Optional[torch.Tensor] = None) -> SiteAtlas:
    """Control: random centers (matching the real centers' norms) and random orthonormal filters of the
    same ranks; radii and gate quantile calibrated on the same inputs, so only the geometry is random."""
    g = torch.Generator().manual_seed(seed)
    x = x.float()
    k, d = reference.centers.shape
    direction = torch.randn(k, d, generator=g).to(x.device)
    centers = direction / direction.norm(dim=1, keepdim=True) * reference.centers.float().to(x.device).norm(dim=1, keepdim=True)
    assign = pairwise_sq_dists(x, centers).argmin(1)
    sigma2 = _radii(x, centers, assign)
    width = reference.filters.shape[2]
    # With a shared basis the control is random in the same form: a random basis, random coordinates in it.
    space = d if reference.basis is None else reference.basis.shape[1]
    blocks = torch.zeros(k, space, width, device=x.device)
    for j in range(k):
        r = int(reference.ranks[j])
        if r:
            q, _ = torch.linalg.qr(torch.randn(space, r, generator=g).to(x.device))
            blocks[j, :, :r] = q
    zero = torch.tensor(0.0, device=x.device)
    if reference.basis is None:
        site = SiteAtlas(centers, sigma2, blocks, reference.ranks.clone(), zero)
    else:
        basis, _ = torch.linalg.qr(torch.randn(d, space, generator=g).to(x.device))
        site = SiteAtlas(centers, sigma2, SiteAtlas.basis_filters(basis, blocks), reference.ranks.clone(), zero,
                         basis=basis, coefs=blocks)
    calibrate_gate(site, x, None if target is None else target.float(), gate_fit, gate_quantile, gate_signal)
    return cast(site, reference.centers.dtype)


def cast(site: SiteAtlas, dtype: torch.dtype) -> SiteAtlas:
    """The same atlas with its floating tensors in `dtype` (log_q and gate_slope stay float32; with a shared basis
    the filters are recomputed from the cast V and W, as `load_atlas` will compute them)."""
    if site.basis is None:
        return SiteAtlas(site.centers.to(dtype), site.sigma2.to(dtype), site.filters.to(dtype), site.ranks,
                         site.log_q.float(), site.gate_slope.float())
    basis, coefs = site.basis.to(dtype), site.coefs.to(dtype)
    return SiteAtlas(site.centers.to(dtype), site.sigma2.to(dtype), SiteAtlas.basis_filters(basis, coefs), site.ranks,
                     site.log_q.float(), site.gate_slope.float(), basis=basis, coefs=coefs)


def save_atlas(atlas: dict[str, SiteAtlas], path: Path, meta: dict) -> int:
    """Write every site's tensors to one safetensors file (filters packed to their true ranks: the columns of U_k,
    or with a shared basis V once and each cluster's coordinates W_k) with their digest
    (`experiments.tensor_files`); return bytes."""
    tensors = {}
    for name, s in atlas.items():
        tensors[f"{name}/centers"] = s.centers.contiguous()
        tensors[f"{name}/sigma2"] = s.sigma2.contiguous()
        tensors[f"{name}/ranks"] = s.ranks.contiguous()
        tensors[f"{name}/log_q"] = s.log_q.reshape(1).contiguous()
        tensors[f"{name}/gate_slope"] = s.gate_slope.float().reshape(1).contiguous()
        if s.basis is not None:
            tensors[f"{name}/basis"] = s.basis.contiguous()
        for j in range(s.num_centers):
            r = int(s.ranks[j])
            if r:
                if s.basis is None:
                    tensors[f"{name}/filter.{j}"] = s.filters[j, :, :r].contiguous()
                else:
                    tensors[f"{name}/coefs.{j}"] = s.coefs[j, :, :r].contiguous()
    return save_tensors(path, tensors, {"atlas": json.dumps(meta)})


def load_atlas(path: Path) -> tuple[dict[str, SiteAtlas], dict]:
    """Inverse of `save_atlas`: (site name -> SiteAtlas, metadata). Raises `DamagedFile` (experiments.tensor_files)
    for a file that is truncated or altered."""
    raw, metadata = load_tensors(path)
    meta = json.loads(metadata["atlas"])
    keys = list(raw)
    sites = sorted({k.rsplit("/", 1)[0] for k in keys})
    out = {}
    for name in sites:
        centers, ranks = raw[f"{name}/centers"], raw[f"{name}/ranks"]
        k, d = centers.shape
        width = max(1, int(ranks.max()))
        basis = raw.get(f"{name}/basis")
        blocks = torch.zeros(k, d if basis is None else basis.shape[1], width, dtype=centers.dtype)
        for j in range(k):
            r = int(ranks[j])
            if r:
                blocks[j, :, :r] = raw[f"{name}/filter.{j}" if basis is None else f"{name}/coefs.{j}"]
        slope = raw.get(f"{name}/gate_slope", torch.ones(1))  # atlases written before the fitted gate: slope 1
        log_q = raw[f"{name}/log_q"].reshape(())
        if basis is None:
            out[name] = SiteAtlas(centers, raw[f"{name}/sigma2"], blocks, ranks, log_q, slope.reshape(()))
        else:
            out[name] = SiteAtlas(centers, raw[f"{name}/sigma2"], SiteAtlas.basis_filters(basis, blocks), ranks, log_q,
                                  slope.reshape(()), basis=basis, coefs=blocks)
    return out, meta
