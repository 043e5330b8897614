"""EWC (Kirkpatrick et al., PNAS 2017, arXiv 1612.00796) on a LoRA update (as in Xiang et al., NeurIPS 2023).

Loss = L_task + (lambda / 2) * sum_modules sum F ⊙ (s B A)^2

F is the diagonal Fisher of the *base* weights W0 of each adapted module (not of the LoRA tensors:
at init the Fisher of A is zero because B = 0):

    F = (1 / N) sum_n (d/dW0 log p_base(y_n | x_n))^2,   y_n ~ p_base(. | x_n)

with x_n the retained calibration prompts and y_n the base's own sampled responses from the
reference cache (sampled at the reference temperature, 1.0 by default, so this is the true Fisher,
not the empirical one; with `eval.reference_sampling: false` the responses are greedy).
log p(y | x) is the sum over response tokens; each sample's gradient is its own backward pass
(batch size 1), so squares are per sample.

The Fisher is computed once per backbone x calibration data x seed x settings and stored on disk
like the reference cache (`experiments.disk_cache`: keyed folder, exclusive lock, atomic rename),
in `fisher/` next to the reference-cache folder (`eval.cache_dir`, else $ATLAS_CACHE_DIR, else
~/.cache/atlas-suite/reference). Knob: ewc_lambda.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from baselines.common import lora_delta, lora_layers
from baselines.lora import LoRA, LoRAParams
from experiments import disk_cache
from experiments.activations import target_linears
from experiments.calibration import CalibrationPair, calibration_pairs, seeded_subset
from experiments.methods import RunContext, is_int, require
from experiments.progress import progress_bar
from experiments.tensor_files import load_tensors, save_tensors

FISHER_FORMAT_VERSION = 1
FISHER_FILE = "fisher.safetensors"


def fisher_root(reference_cache_dir: Path) -> Path:
    """`<reference cache folder>/../fisher`, next to the run's reference cache (`RunContext.cache_dir`)."""
    return Path(reference_cache_dir).parent / "fisher"


def diagonal_fisher(
    model: torch.nn.Module,
    modules: dict[str, torch.nn.Linear],
    pairs: Sequence[CalibrationPair],
    device: torch.device,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Module name -> mean over `pairs` of the squared gradient of log p(response | prompt) w.r.t. its weight.

    One forward + backward per pair (no padding, so each gradient is exactly one sample's).
    Only the listed weights require grad while this runs; flags are restored afterwards.
    """
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    was_training = model.training
    fisher = {n: torch.zeros_like(m.weight, dtype=torch.float32) for n, m in modules.items()}
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for m in modules.values():
            m.weight.requires_grad_(True)
        model.eval()
        for pair in progress_bar(pairs, desc="EWC Fisher", disable=not progress):
            ids = torch.tensor([pair.prompt_ids + pair.response_ids], device=device)
            n_p, n_r = len(pair.prompt_ids), len(pair.response_ids)
            with torch.enable_grad():
                logits = model(input_ids=ids).logits[0, n_p - 1: n_p + n_r - 1].float()
                logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, n_p:].unsqueeze(-1)).sum()
                grads = torch.autograd.grad(logp, [m.weight for m in modules.values()])
            for name, g in zip(modules, grads):
                fisher[name] += g.float().pow(2)
        for f in fisher.values():
            f /= max(len(pairs), 1)
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
        model.train(was_training)
    return fisher


def ewc_penalty(fisher: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum over modules of sum F ⊙ delta^2 (unweighted; the loss adds lambda / 2)."""
    return torch.stack([(fisher[n].to(d.dtype) * d.pow(2)).sum() for n, d in deltas.items()]).sum()


@dataclass(kw_only=True)
class EWCParams(LoRAParams):
    """LoRA's, plus the penalty weight `ewc_lambda` and the calibration sequences the Fisher averages over
    (`max_sequences`, null = all)."""

    ewc_lambda: float
    max_sequences: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("ewc_lambda", self.ewc_lambda, self.ewc_lambda >= 0, ">= 0")
        require("max_sequences", self.max_sequences,
                self.max_sequences is None or (is_int(self.max_sequences) and self.max_sequences > 0),
                "null (all calibration sequences) or an integer > 0")


class EWC(LoRA):
    """LoRA with a diagonal-Fisher quadratic penalty on its weight update."""

    Params = EWCParams
    params: EWCParams

    def __init__(self, params: EWCParams) -> None:
        super().__init__(params)
        self.fisher: dict[str, torch.Tensor] = {}

    # -- Fisher ------------------------------------------------------------------------------------
    def fisher_pairs(self, ctx: RunContext) -> list[CalibrationPair]:
        return seeded_subset(calibration_pairs(ctx), self.params.max_sequences, ctx.seed)

    def fisher_key(self, ctx: RunContext, targets: list[str]) -> tuple[str, dict]:
        """sha256 of backbone key + reference cache key + seed + settings."""
        components = {
            "format_version": FISHER_FORMAT_VERSION,
            "backbone": ctx.backbone_key,
            "reference": ctx.reference().key,
            "seed": int(ctx.seed),
            "target_modules": sorted(targets),
            "max_sequences": self.params.max_sequences,
            "max_length": ctx.max_length,
            "dtype": ctx.dtype,
        }
        return disk_cache.sha256_of(components), components

    def load_or_compute_fisher(self, model: torch.nn.Module, ctx: RunContext, targets: list[str]) -> dict[str, torch.Tensor]:
        key, components = self.fisher_key(ctx, targets)
        path = disk_cache.entry_path(fisher_root(ctx.cache_dir), "fisher",
                                     components["backbone"], key)
        modules = target_linears(model, targets)

        def build(folder: Path) -> dict:
            pairs = self.fisher_pairs(ctx)
            fisher = diagonal_fisher(model, modules, pairs, ctx.device, progress=ctx.progress)
            save_tensors(folder / FISHER_FILE, fisher)
            return {"n_sequences": len(pairs)}

        t0 = time.perf_counter()
        entry = disk_cache.get_or_build(path, key, build, components)
        fisher, _ = load_tensors(entry.path / FISHER_FILE)
        missing = sorted(set(modules) - set(fisher))
        if missing:
            raise RuntimeError(f"Fisher cache {entry.path} lacks modules {missing[:5]}")
        self._costs.update(
            fisher_build_seconds=entry.manifest["build_s"],
            fisher_cache_hit=entry.stats["hit"],
            fisher_load_seconds=time.perf_counter() - t0,
            fisher_sequences=entry.manifest.get("n_sequences"),
            fisher_mean=float(sum(f.double().sum() for f in fisher.values()) / sum(f.numel() for f in fisher.values())),
        )
        self.fisher_path = entry.path
        return fisher

    # -- hooks -------------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        fisher = self.load_or_compute_fisher(model, ctx, targets)
        model = super().prepare(model, ctx)
        dtype = next(model.parameters()).dtype
        keep = torch.float32 if dtype == torch.float16 else dtype  # float16 would underflow small Fisher entries
        self.fisher = {n: fisher[n].to(ctx.device, keep) for n in lora_layers(model)}
        return model

    def penalty(self, model: torch.nn.Module) -> torch.Tensor:
        """sum F ⊙ (s B A)^2 over adapted modules (unweighted)."""
        return ewc_penalty(self.fisher, {n: lora_delta(m) for n, m in lora_layers(model).items()})

    def extra_loss(self, model: torch.nn.Module, batch: dict, ctx: RunContext) -> Optional[torch.Tensor]:
        if self.params.ewc_lambda == 0:
            return None
        return 0.5 * self.params.ewc_lambda * self.penalty(model)
