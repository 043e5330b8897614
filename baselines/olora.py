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

import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from baselines.common import (
    calibration_pairs,
    lora_layers,
    load_or_build_site_tensors,
    pair_example,
    sequence_max_length,
    site_inputs,
    target_module_names,
)
from baselines.lora import LoRA
from experiments.activations import second_moment_basis
from experiments.backbones import check_target_modules
from experiments.methods import RunContext, require

BASIS_FILE = "olora_basis.safetensors"


def orthogonality_penalty(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum over (A_prev, A) pairs of sum_{j,k} |(A_prev A^T)_{jk}|."""
    return torch.stack([(a_prev.to(a.dtype) @ a.T).abs().sum() for a_prev, a in pairs]).sum()


class OLoRA(LoRA):
    """LoRA + an L1 orthogonality penalty between A and the retained principal input directions."""

    def __init__(
        self,
        name: str = "olora",
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Optional[Sequence[str]] = None,
        lambda1: float = 0.5,
        lambda2: float = 0.0,
        prev_rank: Optional[int] = None,
        max_tokens: int = 4096,
        calibration_batch_size: int = 16,
    ) -> None:
        require("lambda1", lambda1, lambda1 >= 0, ">= 0")
        require("lambda2", lambda2, lambda2 >= 0, ">= 0")
        require("prev_rank", prev_rank, prev_rank is None or (isinstance(prev_rank, int) and prev_rank > 0),
                "null (= rank) or an integer > 0")
        require("max_tokens", max_tokens, isinstance(max_tokens, int) and max_tokens > 0, "an integer > 0")
        require("calibration_batch_size", calibration_batch_size, calibration_batch_size > 0, "> 0")
        super().__init__(name, rank=rank, alpha=alpha, dropout=dropout, target_modules=target_modules)
        self.hparams.update(lambda1=lambda1, lambda2=lambda2, prev_rank=prev_rank, max_tokens=max_tokens,
                            calibration_batch_size=calibration_batch_size)
        self.lambda1, self.lambda2 = float(lambda1), float(lambda2)
        self.prev_rank = prev_rank or rank
        self.max_tokens, self.calibration_batch_size = max_tokens, calibration_batch_size
        self.a_prev: dict[str, torch.Tensor] = {}  # backbone module name -> (prev_rank, d_in)
        self._costs: dict = {}

    def build_bases(self, model: torch.nn.Module, ctx: RunContext, targets: list[str]):
        """(`<site>/A_prev` rows from the retained calibration inputs of each site, site -> modules)."""
        seqs = [pair_example(p) for p in calibration_pairs(ctx.reference(), sequence_max_length(ctx))]
        sites, inputs = site_inputs(model, ctx, targets, seqs, max_tokens=self.max_tokens, seed=ctx.seed,
                                    batch_size=self.calibration_batch_size)
        out = {f"{site.name}/A_prev": second_moment_basis(inputs[site.name].to(ctx.device), 1.0, self.prev_rank).T
               for site in sites}
        return out, {site.name: site.modules for site in sites}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = target_module_names(ctx, self.target_modules)
        check_target_modules(model, targets, key="method.target_modules")
        t0 = time.perf_counter()
        tensors, sites, loaded = load_or_build_site_tensors(Path(ctx.run_dir) / BASIS_FILE,
                                                            lambda: self.build_bases(model, ctx, targets))
        bases = {m: tensors[f"{site}/A_prev"] for site, modules in sites.items() for m in modules}
        self._costs.update(basis_build_seconds=time.perf_counter() - t0, basis_reused=loaded)
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
        if self.lambda1 == 0 and self.lambda2 == 0:
            return None
        ortho, sq = self.penalty_terms(model)
        return self.lambda1 * ortho + self.lambda2 * sq

    def costs(self) -> dict:
        return dict(self._costs)
