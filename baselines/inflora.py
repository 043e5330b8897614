"""InfLoRA (Liang & Li, CVPR 2024, arXiv 2404.00228), adapted from continual ViT tasks to retained domains.

Per site (the tensor a group of adapted modules reads):

    M     = eigenvectors of the retained inputs' uncentered second moment covering energy epsilon
    A     = the top-r right singular vectors (rows) of X_target (I - M M^T), frozen
    h     = W0 x + s B A x,   B = 0 at init, the only trained tensor

Retained inputs are the site's inputs on calibration prompts + the base's own responses (reference
cache); target inputs are its inputs on the target training split encoded with `experiments.prompts`
(prompt + response, as the training loop sees them). Every row of A lies in the orthogonal
complement of M, so for a retained input x, Delta W x = s B A x = s B A (I - M M^T) x, whose size is
bounded by the retained energy outside M (at most 1 - epsilon of it on the calibration inputs),
whatever B learns. When the complement holds fewer than r directions with target energy, the
remaining rows of A are zero (those columns of B receive no gradient).

*Adaptation*: the paper designs A from the new task's gradient-free input subspace against earlier
tasks' subspaces in ViTs; here "earlier tasks" are the retained domains. Built on peft LoRA: A is
overwritten and frozen after `get_peft_model`, so export, reload and post-hoc scale are peft's.
Knob: epsilon (0.9 ... 0.99).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from baselines.common import lora_layers, site_inputs
from baselines.lora import LoRA, LoRAParams
from experiments.activations import second_moment_basis
from experiments.calibration import target_examples
from experiments.methods import RunContext, SiteStatisticsParams, is_int, require

SUBSPACE_FILE = "inflora_subspaces.safetensors"


def complement_down_projection(retained: torch.Tensor, target: torch.Tensor, epsilon: float, rank: int,
                               rel_tol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [rank, d], M [d, m]): M covers `epsilon` of the retained second moment's energy; A's rows are the
    top right singular vectors of target (I - M M^T).

    A direction is kept only if it is a real one: its singular value exceeds `rel_tol` times the
    largest, it is among the first d - m (the complement's dimension), and re-projecting it onto the
    complement keeps its norm (a rounding-noise direction would not). The other rows are zero.
    """
    d = retained.shape[1]
    m = second_moment_basis(retained.float(), epsilon)
    projected = target.float() - (target.float() @ m) @ m.T
    a = torch.zeros(rank, d, dtype=torch.float32, device=retained.device)
    if projected.shape[0] == 0:
        return a, m
    _, s, vh = torch.linalg.svd(projected, full_matrices=False)
    if not s.numel() or s.max() <= 0:
        return a, m
    keep = min(int((s > rel_tol * s.max()).sum()), rank, d - m.shape[1])
    rows = vh[:keep]
    rows = rows - (rows @ m) @ m.T  # exactly in the complement (removes rounding leakage into M)
    real = rows.norm(dim=1) > 0.5
    rows = rows[real]
    a[: len(rows)] = rows / rows.norm(dim=1, keepdim=True)
    return a, m


@dataclass(kw_only=True)
class InfLoRAParams(LoRAParams, SiteStatisticsParams):
    """LoRA's, plus the retained energy threshold `epsilon`, the calibration tokens per site (`max_tokens`)
    and the target sequences the down-projection is fitted on (`max_target_sequences`, null = all)."""

    epsilon: float
    max_target_sequences: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("epsilon", self.epsilon, 0.0 < self.epsilon < 1.0, "in (0, 1); the paper's range is 0.9 ... 0.99")
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
