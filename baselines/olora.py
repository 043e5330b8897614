"""O-LoRA (Wang et al., Findings of EMNLP 2023, arXiv 2310.14152), adapted to the retained setting.

Loss = L_task + lambda1 * sum_modules sum_{j,k} |(A_prev A^T)_{jk}| + lambda2 * ||theta||^2

as in the official code (cmnlp/O-LoRA: `torch.abs(torch.mm(lora_A, loranew_A.T)).sum()` summed over
the adapted modules; an L1 of the entries, not a Frobenius norm). A is each adapted module's LoRA
down-projection (r x d_in); theta are the trainable LoRA tensors.

*Adaptation*: there is no earlier task adapter. A_prev of a module is the top `prev_rank`
eigenvectors (as rows, unit norm) of the uncentered second moment of its inputs on retained
calibration sequences (prompt + the base's own response, from the reference cache), so the new
adapter is pushed to read directions the retained domains do not use. Modules that read the same
tensor (a *site*, e.g. q/k/v) share A_prev. The official code's lambda2 term is a sum of per-tensor
L2 norms; here it is the squared norm the suite's spec names, and it is 0 by default.

Not peft's `init_lora_weights="olora"` (OLoRA, a QR initialisation): a different method.
Knob: lambda1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from baselines.common import lora_layers, site_inputs
from baselines.lora import LoRA, LoRAParams
from experiments.activations import second_moment_basis
from experiments.methods import RunContext, SiteStatisticsParams, is_int, require

BASIS_FILE = "olora_basis.safetensors"


def orthogonality_penalty(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum over (A_prev, A) pairs of sum_{j,k} |(A_prev A^T)_{jk}|."""
    return torch.stack([(a_prev.to(a.dtype) @ a.T).abs().sum() for a_prev, a in pairs]).sum()


@dataclass(kw_only=True)
class OLoRAParams(LoRAParams, SiteStatisticsParams):
    """LoRA's, plus the penalty weights lambda1 (orthogonality) and lambda2 (squared norm), the rows of
    A_prev per site (`prev_rank`, null = rank) and the calibration tokens per site (`max_tokens`)."""

    lambda1: float
    lambda2: float
    prev_rank: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("lambda1", self.lambda1, self.lambda1 >= 0, ">= 0")
        require("lambda2", self.lambda2, self.lambda2 >= 0, ">= 0")
        require("prev_rank", self.prev_rank, self.prev_rank is None or (is_int(self.prev_rank) and self.prev_rank > 0),
                "null (= rank) or an integer > 0")


class OLoRA(LoRA):
    """LoRA + an L1 orthogonality penalty between A and the retained principal input directions."""

    run_files = (BASIS_FILE,)

    Params = OLoRAParams
    params: OLoRAParams

    def __init__(self, params: OLoRAParams) -> None:
        super().__init__(params)
        self.a_prev: dict[str, torch.Tensor] = {}  # backbone module name -> (prev_rank, d_in)

    def build_bases(self, model: torch.nn.Module, ctx: RunContext, targets: list[str]):
        """(`<site>/A_prev` rows from the retained calibration inputs of each site, site -> modules)."""
        p = self.params
        sites, inputs = site_inputs(model, ctx, targets, p)
        out = {f"{site.name}/A_prev": second_moment_basis(inputs[site.name].to(ctx.device), 1.0,
                                                          p.prev_rank or p.rank).T
               for site in sites}
        return out, {site.name: site.modules for site in sites}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        tensors, sites = self.run_statistics(ctx, BASIS_FILE, lambda: self.build_bases(model, ctx, targets),
                                            "basis_build_seconds", "basis_reused")
        bases = {m: tensors[f"{site}/A_prev"] for site, modules in sites.items() for m in modules}
        model = super().prepare(model, ctx)
        layers = lora_layers(model)
        missing = sorted(set(layers) - set(bases))
        if missing:
            raise RuntimeError(f"O-LoRA has no retained basis for adapted modules {missing[:5]}")
        self.a_prev = {n: bases[n].to(ctx.device) for n in layers}
        self._costs["basis_rank_mean"] = sum(int(t.shape[0]) for t in self.a_prev.values()) / max(len(self.a_prev), 1)
        return model

    def penalty_terms(self, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(orthogonality sum, squared norm of the trainable LoRA tensors), unweighted."""
        layers = lora_layers(model)
        ortho = orthogonality_penalty([(self.a_prev[n], m.lora_A["default"].weight) for n, m in layers.items()])
        sq = torch.stack([p.float().pow(2).sum() for m in layers.values()
                          for p in (m.lora_A["default"].weight, m.lora_B["default"].weight) if p.requires_grad]).sum()
        return ortho, sq

    def extra_loss(self, model: torch.nn.Module, batch: dict, ctx: RunContext) -> Optional[torch.Tensor]:
        p = self.params
        if p.lambda1 == 0 and p.lambda2 == 0:
            return None
        ortho, sq = self.penalty_terms(model)
        return p.lambda1 * ortho + p.lambda2 * sq
