"""The conditioned residual: y = W x + s * g(x) * B A Pi(x) x, identical in training and inference.

Written by hand because no library offers an input-conditioned low-rank residual: peft's LoRA
layers add s B A x for every input. With gate and filter disabled this layer is exactly LoRA
(same init, same outputs, same gradients; a test checks it against peft).
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
from torch import nn

from atlas.atlas import EPS, SiteAtlas
from atlas.kmeans import pairwise_sq_dists


class AtlasSite(nn.Module):
    """A site's frozen atlas as buffers, plus the per-input conditioning shared by the modules reading it.

    `condition(x)` returns the gate g(x) (n, 1) and the filter coordinates: U_k^T x for every k (n, K, R)
    with the assignment weights (n, K) — one-hot for hard assignment, softmax(-delta_k / tau) for soft.
    The result for the most recent input tensor is reused (q/k/v and gate/up read the same tensor).
    """

    def __init__(self, site: SiteAtlas, assign: str = "hard", gate_temperature: float = 1.0,
                 assign_temperature: float = 1.0, use_gate: bool = True, use_filter: bool = True) -> None:
        super().__init__()
        self.register_buffer("centers", site.centers.clone())
        self.register_buffer("inv_sigma2", 1.0 / site.sigma2.float().clamp_min(EPS))
        self.register_buffer("filters", site.filters.clone())
        self.register_buffer("ranks", site.ranks.clone())
        self.register_buffer("log_q", site.log_q.float().clone().reshape(()))
        self.assign, self.use_gate, self.use_filter = assign, use_gate, use_filter
        self.gate_temperature, self.assign_temperature = gate_temperature, assign_temperature
        self._last: Optional[tuple] = None

    def condition(self, x: torch.Tensor):
        if self._last is not None and self._last[0]() is x:
            return self._last[1]
        flat = x.reshape(-1, x.shape[-1])
        delta_k = pairwise_sq_dists(flat.float(), self.centers.float()) * self.inv_sigma2  # (n, K)
        delta, kstar = delta_k.min(1)
        gate = None
        if self.use_gate:
            gate = torch.sigmoid((delta.clamp_min(EPS).log() - self.log_q) / self.gate_temperature).unsqueeze(1)
        weights = coords = None
        if self.use_filter:
            if self.assign == "soft":
                weights = torch.softmax(-delta_k / self.assign_temperature, dim=1)
            else:
                weights = torch.nn.functional.one_hot(kstar, delta_k.shape[1]).to(delta_k.dtype)
            coords = torch.einsum("nd,kdr->nkr", flat, self.filters.to(flat.dtype))
        out = (gate, weights, coords, kstar)
        self._last = (weakref.ref(x), out)
        return out

    def clear(self) -> None:
        self._last = None


class AtlasLinear(nn.Module):
    """A frozen Linear plus the atlas-conditioned shared low-rank residual of METHOD.md section 2."""

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

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """s * g(x) * B A Pi(x) x for inputs (..., d_in), without forming d x d matrices."""
        gate, weights, coords, _ = self.site.condition(x)
        flat = x.reshape(-1, x.shape[-1]).to(self.lora_A.dtype)
        ax = flat @ self.lora_A.T  # (n, r)
        if coords is not None:
            # A Pi x = A x - sum_k w_k (A U_k)(U_k^T x)
            a_u = torch.einsum("rd,kdR->krR", self.lora_A, self.site.filters.to(self.lora_A.dtype))
            ax = ax - torch.einsum("nk,nkR,krR->nr", weights.to(ax.dtype), coords.to(ax.dtype), a_u)
        out = (ax @ self.lora_B.T) * (self.scaling * self.scale_factor)
        if gate is not None:
            out = out * gate.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.residual(x)
