"""k-means with k-means++ initialisation, in torch on the data's device, deterministic for a seed.

Written here rather than taken from scikit-learn so it runs on the model's device (GPU) on
activations that never leave it, with a torch.Generator for exact reproducibility.
"""

from __future__ import annotations

import torch


def pairwise_sq_dists(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """(n, k) squared Euclidean distances ||x_i - c_j||^2 from the differences themselves (torch.cdist without
    its matmul expansion): |x|^2 - 2 x.c + |c|^2 cancels catastrophically when a point is close to a center
    far from the origin (activations of always-identical template positions), and no memory of n x k x d is
    needed either way."""
    return torch.cdist(x, c, compute_mode="donot_use_mm_for_euclid_dist").square()


class WeightedCenters:
    """Centers prepared for `nearest_centers`, in float64: -2 w_k c_k, w_k |c_k|^2 and the weights w_k."""

    def __init__(self, centers: torch.Tensor, weights: torch.Tensor) -> None:
        c = centers.detach().double()
        self.weights = weights.detach().double().reshape(-1)
        self.cross = c * (-2.0 * self.weights[:, None])
        self.offset = c.square().sum(1) * self.weights


def nearest_centers(x: torch.Tensor, prepared: WeightedCenters) -> torch.Tensor:
    """(n,) argmin_k w_k ||x_i - c_k||^2 for the rows of `x` (no gradient).

    In float64 by the expansion w_k |x|^2 - 2 w_k x.c_k + w_k |c_k|^2: one matrix product and one outer product
    instead of the n k d differences of `pairwise_sq_dists` (on a CPU at an atlas site's sizes: 2x faster at 32
    rows, 4-7x at 600, as fast at one row). Its rounding, about 1e-16 w_k |x|^2, is below that of float32
    differences, 1e-7 w_k |x - c_k|^2, wherever |x - c_k| > 3e-5 |x|; tests check the argmin against float64
    differences on degenerate clusters far from the origin and on activation-like data.
    """
    x64 = x.detach().double()
    dist = torch.addmm(prepared.offset, x64, prepared.cross.T)
    dist.addr_(torch.linalg.vector_norm(x64, dim=1).square_(), prepared.weights)
    return dist.argmin(1)


def kmeans_plus_plus(x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k initial centers: the first uniformly, each next with probability proportional to D(x)^2."""
    n = x.shape[0]
    first = torch.randint(n, (1,), generator=generator).item()
    centers = [x[first]]
    closest = pairwise_sq_dists(x, x[first : first + 1]).squeeze(1)
    for _ in range(1, k):
        total = closest.sum()
        if total <= 0:  # fewer distinct points than k: repeat one (its cluster stays empty)
            idx = torch.randint(n, (1,), generator=generator).item()
        else:
            idx = torch.multinomial((closest / total).cpu(), 1, generator=generator).item()
        centers.append(x[idx])
        closest = torch.minimum(closest, pairwise_sq_dists(x, x[idx : idx + 1]).squeeze(1))
    return torch.stack(centers)


def kmeans(x: torch.Tensor, k: int, seed: int, iters: int = 50, tol: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(centers (k, d), assignment (n,)) of Lloyd's algorithm from a k-means++ start, in float32.

    An emptied cluster keeps its previous center. Stops when the centers move less than `tol`
    relative to their scale, or after `iters` iterations.
    """
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"kmeans needs a non-empty (n, d) tensor; got shape {tuple(x.shape)}")
    k = min(k, x.shape[0])
    x = x.float()
    generator = torch.Generator().manual_seed(seed)
    centers = kmeans_plus_plus(x, k, generator)
    assign = pairwise_sq_dists(x, centers).argmin(1)
    for _ in range(iters):
        sums = torch.zeros_like(centers).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype).unsqueeze(1)
        new = torch.where(counts > 0, sums / counts.clamp_min(1), centers)
        shift = (new - centers).norm() / centers.norm().clamp_min(1e-12)
        centers = new
        assign = pairwise_sq_dists(x, centers).argmin(1)
        if shift < tol:
            break
    return centers, assign
