"""InfLoRA (Liang & Li, CVPR 2024, arXiv 2404.00228) as the authors' code defines it, with the retained
domains as the one earlier task.

Per site (the tensor a group of adapted modules reads), with C_R and C_T the uncentered second moments
(d x d, mean of x x^T over tokens) of the retained and the target inputs:

    M  = the top m eigenvectors of C_R, m = max(#{k : sum_{i<=k} l_i^2 / sum_i l_i^2 < epsilon}, 1),
         l_i the eigenvalues (= singular values) of C_R                  (DualGPM after the first task)
    A  = the top r left singular vectors of (I - M M^T) C_T, as rows, each divided by sqrt(3), frozen
    h  = W0 x + B A x,   B = 0 at init, the only trained tensor          (no alpha / r factor)

Retained inputs are the site's inputs on calibration prompts + the base's own responses (reference
cache); target inputs are its inputs on the target training split encoded with `experiments.prompts`
(prompt + response, as the training loop sees them). Every row of A lies in the complement of M, so for
retained inputs ||Delta W X_R||_F <= ||Delta W||_2 ||X_R (I - M M^T)||_F whatever B learns; the
criterion counts *squared* eigenvalues, so the retained energy left outside M is usually far more than
1 - epsilon of the (linear) energy. Directions of (I - M M^T) C_T with no real target energy (singular
value under 1e-5 of the largest, or beyond the complement's d - m dimensions) leave rows of A zero; the
authors' SVD would fill them with arbitrary null-space vectors. Their 'retain' form (m >= d/2: the
complement's basis Q stored, the moment projected by Q Q^T) is the same projector I - M M^T, so one form serves.

*Adaptation*: the authors' earlier tasks (continual vision tasks) are the retained domains, pooled as one
task, so their threshold schedule (lame - lamb) t / T + lamb is `epsilon` (= their `lamb`, published
0.95 ... 0.99); they adapt only k and v of each ViT attention (one A per attention input), here the
suite's target modules, one A per site. Built on peft LoRA with alpha = rank (scale 1): A is overwritten
and frozen after `get_peft_model`, so export, reload and post-hoc scale are peft's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from baselines.common import lora_layers, site_inputs
from baselines.lora import LoRA, LoRAParams
from experiments.calibration import target_examples
from experiments.methods import RunContext, SiteStatisticsParams, is_int, require

SUBSPACE_FILE = "inflora_subspaces.safetensors"
DEFINITION = "authors"  # the only definition that runs; records of the suite's first one ("2026-11") stay readable
A_ROW_NORM = 1.0 / math.sqrt(3.0)  # the authors' A: unit singular vectors divided by sqrt(3)


def retained_basis(retained: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(d, m) M: the top eigenvectors of the retained second moment C_R = X^T X / n, m = max(r, 1) with r the
    number of leading prefixes whose share of the *squared* eigenvalues is strictly under `epsilon`.

    C_R's eigenvalues are s^2 / n for the singular values s of X, so the shares are s^4 / sum s^4 (float64);
    no d x d matrix is formed. No retained energy: M is empty (d x 0).
    """
    d = retained.shape[1]
    if retained.shape[0] == 0:
        return retained.new_zeros(d, 0, dtype=torch.float32)
    _, s, vh = torch.linalg.svd(retained.float(), full_matrices=False)
    power = s.double().pow(4)
    if not power.numel() or power.sum() <= 0:
        return retained.new_zeros(d, 0, dtype=torch.float32)
    share = torch.cumsum(power, 0) / power.sum()
    m = max(int((share < epsilon).sum()), 1)
    return vh[:m].T.contiguous()


def complement_down_projection(retained: torch.Tensor, target: torch.Tensor, epsilon: float, rank: int,
                               rel_tol: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [rank, d], M [d, m]): M = `retained_basis(retained, epsilon)`; A's rows are the top left singular
    vectors of (I - M M^T) C_T, C_T = X_T^T X_T / n the target second moment, each of norm 1 / sqrt(3).

    With X_T = U S V^T, (I - M M^T) C_T = (I - M M^T) V S^2 V^T / n has the left singular vectors of the thin
    (d, k) matrix (I - M M^T) V S^2, which is what is decomposed. A direction is kept only if it is a real
    one: its singular value exceeds `rel_tol` times the largest, it is among the first d - m (the
    complement's dimension), and re-projecting it onto the complement keeps its norm. The other rows are zero.
    """
    d = retained.shape[1]
    m = retained_basis(retained, epsilon).to(target.device)
    a = torch.zeros(rank, d, dtype=torch.float32, device=target.device)
    if target.shape[0] == 0:
        return a, m
    _, s, vh = torch.linalg.svd(target.float(), full_matrices=False)
    z = vh.T * s.square()  # (d, k): C_T n = z V^T
    z = z - m @ (m.T @ z)
    u, sz, _ = torch.linalg.svd(z, full_matrices=False)
    if not sz.numel() or sz.max() <= 0:
        return a, m
    keep = min(int((sz > rel_tol * sz.max()).sum()), rank, d - m.shape[1])
    rows = u[:, :keep].T
    rows = rows - (rows @ m) @ m.T  # exactly in the complement (removes rounding leakage into M)
    rows = rows[rows.norm(dim=1) > 0.5]
    a[: len(rows)] = rows / rows.norm(dim=1, keepdim=True) * A_ROW_NORM
    return a, m


@dataclass(kw_only=True)
class InfLoRAParams(LoRAParams, SiteStatisticsParams):
    """LoRA's (alpha = rank: scale 1), plus the definition (`authors`), the retained threshold `epsilon` (the
    authors' `lamb`), the calibration tokens per site (`max_tokens`) and the target sequences the
    down-projection is fitted on (`max_target_sequences`, null = all)."""

    definition: str
    epsilon: float
    max_target_sequences: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("definition", self.definition, self.definition == DEFINITION,
                f"{DEFINITION!r} (the authors' InfLoRA; records of the suite's first definition '2026-11' stay "
                "readable, but that definition no longer runs)")
        require("alpha", self.alpha, self.alpha == self.rank,
                f"equal to rank ({self.rank}): the authors' update is B A x, with no alpha / r factor")
        require("epsilon", self.epsilon, 0.0 < self.epsilon < 1.0,
                "in (0, 1); the authors' published lamb is 0.95 ... 0.99")
        require("max_target_sequences", self.max_target_sequences,
                self.max_target_sequences is None or (is_int(self.max_target_sequences) and self.max_target_sequences > 0),
                "null (all) or an integer > 0")


class InfLoRA(LoRA):
    """LoRA whose frozen down-projection reads only directions outside the retained input subspace."""

    run_files = (SUBSPACE_FILE,)

    Params = InfLoRAParams
    params: InfLoRAParams

    def __init__(self, params: InfLoRAParams) -> None:
        super().__init__(params)
        self.retained_basis: dict[str, torch.Tensor] = {}  # backbone module name -> M [d, m]

    def build_subspaces(self, model: torch.nn.Module, ctx: RunContext, targets: list[str]):
        """(`<site>/A` [r, d] and `<site>/M` [d, m] for every site, site -> modules)."""
        p = self.params
        sites, retained = site_inputs(model, ctx, targets, p)
        _, target = site_inputs(model, ctx, targets, p, target_examples(ctx, p.max_target_sequences, ctx.seed), sites)
        out = {}
        for site in sites:
            a, m = complement_down_projection(retained[site.name].to(ctx.device), target[site.name].to(ctx.device),
                                              p.epsilon, p.rank)
            out[f"{site.name}/A"], out[f"{site.name}/M"] = a, m
        return out, {site.name: site.modules for site in sites}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        tensors, sites = self.run_statistics(ctx, SUBSPACE_FILE, lambda: self.build_subspaces(model, ctx, targets),
                                             "subspace_build_seconds", "subspace_reused")
        spaces = {f"{m}.{what}": tensors[f"{site}/{what}"] for site, modules in sites.items() for m in modules
                  for what in ("A", "M")}
        model = super().prepare(model, ctx)
        layers = lora_layers(model)
        with torch.no_grad():
            for name, layer in layers.items():
                if f"{name}.A" not in spaces:
                    raise RuntimeError(f"InfLoRA has no subspace for adapted module {name}")
                weight = layer.lora_A["default"].weight
                weight.copy_(spaces[f"{name}.A"].to(weight.device, weight.dtype))
                weight.requires_grad_(False)
                self.retained_basis[name] = spaces[f"{name}.M"].to(ctx.device)
        dims = [int(m.shape[1]) for m in self.retained_basis.values()]
        self._costs["retained_subspace_dim_mean"] = sum(dims) / max(len(dims), 1)
        return model
