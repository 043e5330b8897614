"""The conditioned residual: y = W x + s * g(x) * B A Pi(x) x, identical in training and inference.

Written by hand because no library offers an input-conditioned low-rank residual: peft's LoRA
layers add s B A x for every input. With gate and filter disabled this layer is exactly LoRA
(same init, same outputs, same gradients; a test checks it against peft).

How it is computed (docs/method.md). Per site (the modules reading one tensor share it):
- the nearest center k*(x) = argmin_k delta_k(x), delta_k(x) = ||x - c_k||^2 / sigma_k^2, from one float64
  matrix product (`atlas.kmeans.nearest_centers`); the distance values themselves only where they are used:
  every delta_k exactly from the differences (torch.cdist without the |x|^2 - 2 x.c + |c|^2 expansion, which
  cancels catastrophically in float32 for tight clusters far from the origin) for soft assignment, and delta_k*
  from its difference for the distance gate (tests cover degenerate and near-degenerate clusters in float64);
- all filter coordinates U_k^T x from one matmul against the K filters side by side (d, K R) (with a shared
  filter basis V, U_k = V W_k: (x V) W, two matmuls of d P + P K R per row), times the assignment weights w_k
  (the one-hot of k* for hard, softmax(-delta_k / tau) for soft): z = (w_k U_k^T x)_k, flattened to (n, K R).
- the gate statistic s(x): `distance` = min_k delta_k(x), or `subspace` (the default) = the share of x's
  energy outside its nearest center's filter, 1 - ||U_k*^T x||^2 / ||x||^2, from the same coordinates;
  g(x) = sigmoid(slope * (log s(x) - log q) / T) with the atlas's threshold log q and slope;
- the conditioning knob c: g -> 1 - c + c g and z -> c z; at c = 0 neither is computed (plain LoRA).
Per module, A Pi x = A x - sum_k w_k (A U_k)(U_k^T x) = A x - (A U) z with A U = (A U_1 .. A U_K)
of shape (r, K R): one addmm on top of LoRA's A x. A U depends only on A, so without autograd
(evaluation, decoding) it is kept until A is next modified. The gate scales the r-wide rows
g(x) A Pi(x) x, and when the factors have the backbone's dtype one addmm adds s (.) B^T to W x.

A single row without autograd (batch-1 decoding, one new token per step) takes another route to the same equation
(`AtlasSite.condition_row`, `AtlasLinear.forward_row`): there every operation costs its fixed few microseconds and
the arithmetic is nothing. k* comes from one float64 matrix-vector product with the K centers (and |x|^2), the
subspace gate from U_k*'s R coordinates alone, the argmin and the gate's scalar arithmetic run on Python floats, and
each module applies A Pi_k* = A - (A U_k*) U_k*^T, kept per center (K times A's size, recomputed only when A, the
filters or c change), so its residual is LoRA's two products with g(x) folded into the scale of the last. On micro
that is 152 torch operations per generated token more than LoRA's, where the batched forms take 760 more (profiler
count over a 32-token batch-1 `generate`; docs/performance.md).

Hard assignment still takes all K coordinates in the one matmul: selecting U_{k*} per token moves
n d R filter values (a gather), more than the d K R the shared matmul reads once n > K, and K
per-cluster matmuls would cost K launches per site.
"""

from __future__ import annotations

import math
import operator
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from atlas.atlas import EPS, SiteAtlas
from atlas.kmeans import WeightedCenters, nearest_centers, pairwise_sq_dists


class AtlasSite(nn.Module):
    """A site's frozen atlas as buffers, plus the per-input conditioning shared by the modules reading it.

    `condition(x)` returns the gate g(x) (n, 1), the assignment weights (n, K) — the one-hot of k*
    (in x's dtype) for hard assignment, softmax(-delta_k / tau) for soft — the weighted filter coordinates
    z = (w_k U_k^T x)_k flattened center-major to (n, K R), and k* (n,); at conditioning 0 or with gate and
    filter off all four are None (plain LoRA: not even k* is computed). The result for the most recent input tensor is reused (q/k/v and
    gate/up read the same tensor).
    """

    def __init__(self, site: SiteAtlas, *, assign: str, gate_temperature: float, assign_temperature: float,
                 use_gate: bool, use_filter: bool, gate_signal: str, conditioning: float) -> None:
        super().__init__()
        self.register_buffer("centers", site.centers.clone())
        self.register_buffer("inv_sigma2", 1.0 / site.sigma2.float().clamp_min(EPS))
        self.register_buffer("filters", site.filters.clone())
        self.register_buffer("ranks", site.ranks.clone())
        self.register_buffer("log_q", site.log_q.float().clone().reshape(()))
        self.register_buffer("gate_slope", site.gate_slope.float().clone().reshape(()).to(site.centers.device))
        # Layouts derived from the atlas for the one-matmul forms above (not part of the state dict).
        k, d = site.centers.shape
        self.register_buffer("filter_cols", site.filters.permute(1, 0, 2).reshape(d, -1).contiguous(),
                             persistent=False)  # (d, K R): column k * R + j is U_k[:, j]
        # With a shared filter basis V (d, P) the coordinates are (x V) W: two products of d P + P K R per row
        # instead of one of d K R.
        self.register_buffer("basis", None if site.basis is None else site.basis.clone(), persistent=False)
        self.register_buffer("coef_cols", None if site.coefs is None else
                             site.coefs.permute(1, 0, 2).reshape(site.coefs.shape[1], -1).contiguous(), persistent=False)
        self.register_buffer("center_ids", torch.arange(k, device=site.centers.device), persistent=False)
        self.assign, self.use_gate, self.use_filter = assign, use_gate, use_filter
        self.gate_temperature, self.assign_temperature = gate_temperature, assign_temperature
        self.gate_signal, self.conditioning = gate_signal, float(conditioning)
        self._last: Optional[tuple] = None
        self._last_row: Optional[tuple] = None
        self._prepared: Optional[tuple] = None
        self._row_consts: Optional[tuple] = None

    def distances(self, flat: torch.Tensor) -> torch.Tensor:
        """(n, K) normalised squared distances delta_k(x) = ||x - c_k||^2 / sigma_k^2 of the rows of `flat`, float32,
        from the differences (`atlas.kmeans.pairwise_sq_dists`: no expansion that cancels)."""
        return pairwise_sq_dists(flat.float(), self.centers.float()) * self.inv_sigma2

    def weighted_centers(self) -> WeightedCenters:
        """The centers and 1 / sigma_k^2 prepared for the nearest-center search, kept until either changes."""
        key = (self.centers.data_ptr(), self.centers._version, self.inv_sigma2.data_ptr(), self.inv_sigma2._version,
               self.centers.device)
        if self._prepared is None or self._prepared[0] != key:
            self._prepared = (key, WeightedCenters(self.centers, self.inv_sigma2))
        return self._prepared[1]

    def nearest(self, flat: torch.Tensor) -> torch.Tensor:
        """(n,) k*(x) = argmin_k delta_k(x) of the rows of `flat` (`atlas.kmeans.nearest_centers`, no gradient)."""
        return nearest_centers(flat, self.weighted_centers())

    def filter_coords(self, flat: torch.Tensor) -> torch.Tensor:
        """(n, K R) U_k^T x of the rows of `flat` for every k, center-major, in `flat`'s dtype."""
        if self.basis is None:
            return flat @ self.filter_cols.to(flat.dtype)
        return (flat @ self.basis.to(flat.dtype)) @ self.coef_cols.to(flat.dtype)

    def condition(self, x: torch.Tensor):
        if self._last is not None and self._last[0]() is x:
            return self._last[1]
        if self.conditioning == 0.0 or not (self.use_gate or self.use_filter):  # plain LoRA: not even k* is needed
            return None, None, None, None
        flat = x.reshape(-1, x.shape[-1])
        n, k = flat.shape[0], self.centers.shape[0]
        lam = self.conditioning
        soft = self.assign == "soft" and self.use_filter
        distance_gate = self.use_gate and self.gate_signal == "distance"
        if soft:  # every delta_k is needed, exactly
            delta_k = self.distances(flat)
            delta, kstar = delta_k.min(1)
        else:
            kstar = self.nearest(flat)
            if distance_gate:  # delta_k* from the difference itself, with its gradient
                diff = flat.float() - self.centers.float()[kstar]
                delta = diff.square().sum(1) * self.inv_sigma2[kstar]
        gate = weights = z = None
        coords = onehot = None
        if self.use_filter or (self.use_gate and self.gate_signal == "subspace"):
            coords = self.filter_coords(flat).view(n, k, -1)  # (n, K, R): U_k^T x for every k
            onehot = (kstar.unsqueeze(1) == self.center_ids).to(flat.dtype)  # (n, K)
            kept = coords * onehot.unsqueeze(2)  # U_k*^T x in block k*, zeros elsewhere
        if self.use_gate:
            if self.gate_signal == "subspace":  # the share of x's energy outside its nearest center's filter
                energy = flat.float().square().sum(1)
                signal = (energy - kept.view(n, -1).float().square().sum(1)).clamp_min(0.0) / energy.clamp_min(EPS)
            else:
                signal = delta
            logit = (signal.clamp_min(EPS).log() - self.log_q) * self.gate_slope
            if self.gate_temperature != 1.0:
                logit = logit / self.gate_temperature
            gate = torch.sigmoid(logit).unsqueeze(1)
            if lam != 1.0:  # the conditioning knob: 1 - lam + lam g, from no gate (0) to the full gate (1)
                gate = torch.lerp(torch.ones_like(gate), gate, lam)
        if self.use_filter:
            if soft:
                weights = torch.softmax(-delta_k / self.assign_temperature, dim=1)
                z = (coords * weights.unsqueeze(2).to(coords.dtype)).view(n, -1)
            else:
                weights, z = onehot, kept.view(n, -1)
            if lam != 1.0:  # A Pi_lam x = A x - lam (A U) z: from no filter (0) to the full filter (1)
                z = z * lam
        out = (gate, weights, z, kstar)
        self._last = (weakref.ref(x), out)
        return out

    @property
    def row_path(self) -> bool:
        """Whether `condition_row` computes this site's conditioning: hard assignment (or no filter), which needs only
        the nearest center's filter."""
        return self.assign == "hard" or not self.use_filter

    def _row_constants(self) -> tuple:
        """For `condition_row`: -2 w_k c_k (K, d) in float64 (w_k = 1 / sigma_k^2); w_k |c_k|^2 and w_k as Python
        floats; U_k^T (R, d) for each k, contiguous; the centers in float32 (distance gate); 1 / sigma_k^2 as floats;
        log q; slope. Kept until a buffer is replaced (a move or a reassignment) or changed in place (its version
        counter); the buffers are held, so a replaced one cannot be mistaken for its successor."""
        # The buffers straight from `_buffers`: at one row nn.Module.__getattr__ (about 1 us a buffer) is a visible
        # share of a site's conditioning.
        b = self._buffers
        bufs = filters, centers, inv_sigma2, log_q, slope = (b["filters"], b["centers"], b["inv_sigma2"], b["log_q"],
                                                             b["gate_slope"])
        versions = tuple([t._version for t in bufs])
        rc = self._row_consts
        if rc is None or rc[1] != versions or not all(map(operator.is_, rc[0], bufs)):
            wc = self.weighted_centers()
            rc = self._row_consts = (bufs, versions, wc.cross, wc.offset.tolist(), wc.weights.tolist(),
                                     [u.T.contiguous() for u in filters.detach().unbind(0)],
                                     list(centers.float().unbind(0)), inv_sigma2.tolist(), float(log_q), float(slope))
        return rc[2:]

    def condition_row(self, x: torch.Tensor):
        """`condition` for a single input row without autograd (batch-1 decoding): (g, k*) with the gate g(x) as a
        float (None without the gate) and k* as an int; (None, None) at conditioning 0 or with gate and filter off.
        Hard assignment only (`row_path`); the filter itself is applied by the module (`AtlasLinear.filtered_a_rows`).

        The same equation by fewer operations than `condition`: at one row every operation is a few microseconds of
        fixed cost and the arithmetic is nothing, so k* comes from one float64 matrix-vector product with the K
        centers' cross terms and |x|^2, only U_k*'s coordinates are computed (for the subspace gate), and the rest
        (the argmin, the energy outside U_k*, the gate) is done on Python floats. k* agrees with `nearest_centers`
        but for ties within float64 rounding; the gate rounds differently from `condition`'s, within float32 rounding
        (a test checks both against the float64 equation). Cached for the most recent input tensor like
        `condition`."""
        if self._last_row is not None and self._last_row[0]() is x:
            return self._last_row[1]
        if self.conditioning == 0.0 or not (self.use_gate or self.use_filter):
            return None, None
        lam = self.conditioning
        cross, offset, weights, filters_t, centers, inv_sigma2, log_q, slope = self._row_constants()
        flat = x.reshape(-1)
        x64 = flat.double()
        energy = float(torch.dot(x64, x64))
        dist = [o + t + w * energy for o, t, w in zip(offset, torch.mv(cross, x64).tolist(), weights)]
        k = dist.index(min(dist))  # the first of equal minima, as argmin
        gate = None
        if self.use_gate:
            if self.gate_signal == "subspace":  # the share of x's energy outside U_k*
                u_t = filters_t[k]
                coords = torch.mv(u_t, flat if flat.dtype == u_t.dtype else flat.to(u_t.dtype)).tolist()
                inside = sum(v * v for v in coords)
                signal = max(energy - inside, 0.0) / max(energy, EPS)
            else:  # delta_k* from the difference itself, as in `condition`
                diff = flat.float() - centers[k]
                signal = float(diff.dot(diff)) * inv_sigma2[k]
            logit = (math.log(max(signal, EPS)) - log_q) * slope / self.gate_temperature
            gate = 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))
            if lam != 1.0:
                gate = 1.0 + lam * (gate - 1.0)
        out = (gate, k)
        self._last_row = (weakref.ref(x), out)
        return out

    def clear(self) -> None:
        self._last = None
        self._last_row = None


class AtlasLinear(nn.Module):
    """A frozen Linear plus the atlas-conditioned shared low-rank residual of docs/method.md."""

    def __init__(self, base: nn.Linear, site: AtlasSite, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.site = site
        # Half-precision backbones keep the trainable factors in float32 (as peft does for LoRA),
        # so optimizer updates are not lost to bf16 rounding; the residual is added back in x's dtype.
        dtype = torch.float32 if base.weight.dtype in (torch.bfloat16, torch.float16) else base.weight.dtype
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=dtype, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # LoRA's init: the model equals the base at step 0
        self.scaling = alpha / rank
        self.scale_factor = 1.0
        self._filtered_a: Optional[tuple] = None
        self._filtered_a_rows: Optional[tuple] = None

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def filtered_a(self) -> torch.Tensor:
        """A U = (A U_1 .. A U_K), (r, K R). Under autograd with A trainable it is recomputed on every
        call; otherwise it is kept and recomputed only once A or the filters have changed (in-place
        updates bump the version counter, a move or reassignment changes the storage)."""
        a, u = self.lora_A, self.site.filter_cols
        if torch.is_grad_enabled() and a.requires_grad:
            return a @ u.to(a.dtype)
        key = (a._version, a.data_ptr(), a.dtype, u._version, u.data_ptr())
        cached = self._filtered_a
        if cached is None or cached[0] != key or (cached[1].is_inference() and not torch.is_inference_mode_enabled()):
            with torch.no_grad():
                value = a @ u.to(a.dtype)
            # The source tensors are held so their storage cannot be reused under the same key.
            cached = self._filtered_a = (key, value, a.detach(), u)
        return cached[1]

    def filtered_a_rows(self) -> list[torch.Tensor]:
        """A Pi_k = A - c (A U_k) U_k^T for each center k, (r, d_in) in A's dtype, from float64 products (no autograd;
        for `forward_row`): with k* known, A Pi(x) x = A Pi_k* x is one product. K times A's size. Kept until A or the
        filters change in place (version counters) or move (A's storage, the filters' tensor), or the conditioning
        knob c changes; the source tensors are held, so their storage cannot be reused under the same key."""
        site = self._modules["site"]  # direct lookups, as in `AtlasSite._row_constants`
        a, u, lam = self._parameters["lora_A"], site._buffers["filters"], site.conditioning
        c = self._filtered_a_rows
        if c is None or c[0] != (a._version, a.data_ptr(), u._version, lam) or c[2] is not u:
            with torch.no_grad():
                a64, u64 = a.detach().double(), u.detach().double()  # (r, d), (K, d, R)
                inside = torch.einsum("qe,kej,kdj->kqd", a64, u64, u64)  # (A U_k) U_k^T, (K, r, d)
                rows = list((a64.unsqueeze(0) - lam * inside).to(a.dtype).unbind(0))
            c = self._filtered_a_rows = ((a._version, a.data_ptr(), u._version, lam), rows, u, a.detach())
        return c[1]

    def forward_row(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """W x + s g(x) B A Pi_k* x for a single row without autograd, y = W x given (`AtlasSite.condition_row`):
        LoRA's two products, with A Pi_k* in place of A and the gate folded into the scale."""
        site = self._modules["site"]  # direct lookups, as in `AtlasSite._row_constants`
        gate, k = site.condition_row(x)
        a = self._parameters["lora_A"] if k is None or not site.use_filter else self.filtered_a_rows()[k]
        ax = F.linear(x.reshape(1, -1), a)  # (1, r)
        scale = self.scaling * self.scale_factor * (1.0 if gate is None else gate)
        return torch.addmm(y.reshape(1, -1), ax, self._parameters["lora_B"].T, alpha=scale).view(y.shape)

    def gated_low_rank(self, x: torch.Tensor) -> torch.Tensor:
        """g(x) * A Pi(x) x, (n, r) in the factors' dtype (the gate scales the r-wide rows, not the output)."""
        gate, _, z, _ = self.site.condition(x)
        a = self.lora_A
        ax = x.reshape(-1, x.shape[-1]).to(a.dtype) @ a.T  # (n, r)
        if z is not None:
            ax = torch.addmm(ax, z.to(a.dtype), self.filtered_a().T, alpha=-1.0)  # A x - (A U) z
        return ax if gate is None else ax * gate.to(ax.dtype)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """s * g(x) * B A Pi(x) x for inputs (..., d_in), without forming d x d matrices."""
        out = (self.gated_low_rank(x) @ self.lora_B.T) * (self.scaling * self.scale_factor)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Submodules and B straight from their dicts (nn.Module.__getattr__ costs about 1 us a lookup, a visible share
        # of a batch-1 decoding step, which runs this for every module and token).
        y = self._modules["base"](x)
        b = self._parameters["lora_B"]
        if y.dtype != b.dtype:  # half-precision backbone: the residual is added in x's dtype
            return y + self.residual(x)
        if x.numel() == x.shape[-1] and not torch.is_grad_enabled() and self._modules["site"].row_path:
            return self.forward_row(x, y)  # one row (batch-1 decoding): fewer, smaller operations
        # W x + s (g A Pi x) B^T in one addmm: the scale, B and the sum fused
        out = torch.addmm(y.reshape(-1, b.shape[0]), self.gated_low_rank(x), b.T,
                          alpha=self.scaling * self.scale_factor)
        return out.view(y.shape)
