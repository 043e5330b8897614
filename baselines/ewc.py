"""EWC (Kirkpatrick et al., PNAS 2017, arXiv 1612.00796) on a LoRA update (as in Xiang et al., NeurIPS 2023),
normalised as the reference implementation (avalanche's `EWCPlugin`) so that published lambda values mean the same.

Loss = L_task + ewc_lambda * sum_modules sum F ⊙ (s B A)^2

(avalanche's penalty, no 1/2: Kirkpatrick's L + (lambda_K / 2) sum F Delta^2 is this with ewc_lambda = lambda_K / 2.)

F is the diagonal Fisher of the *base* weights W0 of each adapted module (not of the LoRA tensors: at init the
Fisher of A is zero because B = 0), as avalanche's importance: the squared gradient of a mini-batch's *mean* loss,
averaged over the mini-batches (the last one may be smaller; it counts as one):

    F = (1 / M) sum_m (d/dW0 [ (1 / T_m) sum_{n in batch m} sum_t -log p_base(y_nt | x_n, y_n<t) ])^2

T_m the response tokens of mini-batch m (the training loss's token mean, `experiments.batching.sft_loss_sum`).
Mini-batches are `fisher_batch_size` consecutive calibration pairs (null = the run's `train.batch_size`, avalanche's
`train_mb_size`); padding is masked, so a padded batch gives the same F as each sequence at its own length.
Adaptation: the old task is the retained domains, its data the retained calibration prompts x_n with the base's own
responses y_n from the reference cache (sampled at the reference temperature, 1.0 by default; greedy with
`eval.reference_sampling: false`), since the base's training data is not available.

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
from experiments.batching import sft_loss_sum, target_count
from experiments.calibration import CalibrationPair, calibration_pairs, pair_example, seeded_subset
from experiments.methods import MethodConfigError, RunContext, is_int, require
from experiments.prompts import collate
from experiments.progress import progress_bar
from experiments.tensor_files import load_tensors, save_tensors

FISHER_FORMAT_VERSION = 2  # 2: avalanche's normalisation (mean loss per mini-batch; 1 summed log p per sequence)
FISHER_FILE = "fisher.safetensors"


def fisher_root(reference_cache_dir: Path) -> Path:
    """`<reference cache folder>/../fisher`, next to the run's reference cache (`RunContext.cache_dir`)."""
    return Path(reference_cache_dir).parent / "fisher"


def fisher_batches(pairs: Sequence[CalibrationPair], batch_size: int) -> list[list[CalibrationPair]]:
    """`pairs` cut into consecutive mini-batches of `batch_size` (the last may be smaller), as a DataLoader without
    shuffling cuts a dataset."""
    return [list(pairs[i: i + batch_size]) for i in range(0, len(pairs), batch_size)]


def diagonal_fisher(
    model: torch.nn.Module,
    modules: dict[str, torch.nn.Linear],
    pairs: Sequence[CalibrationPair],
    device: torch.device,
    batch_size: int,
    pad_id: int,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Module name -> mean over mini-batches of `batch_size` pairs of the squared gradient, w.r.t. its weight, of the
    mini-batch's mean response-token negative log-likelihood (nats per token).

    Each mini-batch is one right-padded forward + backward; padded positions carry no label and come after each
    row's tokens, so they change no row's logits nor the mean. Only the listed weights require grad while this
    runs; flags are restored afterwards.
    """
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    was_training = model.training
    fisher = {n: torch.zeros_like(m.weight, dtype=torch.float32) for n, m in modules.items()}
    batches = fisher_batches(pairs, batch_size)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for m in modules.values():
            m.weight.requires_grad_(True)
        model.eval()
        for chunk in progress_bar(batches, desc="EWC Fisher", disable=not progress):
            batch = collate([pair_example(p) for p in chunk], pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.enable_grad():
                loss = sft_loss_sum(model, batch) / target_count(batch)
                grads = torch.autograd.grad(loss, [m.weight for m in modules.values()])
            for name, g in zip(modules, grads):
                fisher[name] += g.float().pow(2)
        for f in fisher.values():
            f /= max(len(batches), 1)
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
        model.train(was_training)
    return fisher


def ewc_penalty(fisher: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum over modules of sum F ⊙ delta^2 (unweighted; the loss adds ewc_lambda times it)."""
    return torch.stack([(fisher[n].to(d.dtype) * d.pow(2)).sum() for n, d in deltas.items()]).sum()


@dataclass(kw_only=True)
class EWCParams(LoRAParams):
    """LoRA's, plus the penalty weight `ewc_lambda` (avalanche's: no 1/2), the calibration sequences the Fisher
    averages over (`max_sequences`, null = all), its mini-batch size (`fisher_batch_size`, null = the run's
    `train.batch_size`) and `definition` ("authors"; records of "2026-11" stay readable, that definition no longer
    runs)."""

    ewc_lambda: float
    max_sequences: Optional[int]
    fisher_batch_size: Optional[int]
    definition: str

    def __post_init__(self) -> None:
        super().__post_init__()
        require("definition", self.definition, self.definition == "authors",
                '"authors" (records of the earlier definition "2026-11" stay readable; it no longer runs)')
        require("ewc_lambda", self.ewc_lambda, self.ewc_lambda >= 0, ">= 0")
        require("fisher_batch_size", self.fisher_batch_size,
                self.fisher_batch_size is None or (is_int(self.fisher_batch_size) and self.fisher_batch_size > 0),
                "null (the run's train.batch_size) or an integer > 0")
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

    def fisher_batch_size(self, ctx: RunContext) -> int:
        """Pairs per Fisher mini-batch: `fisher_batch_size`, else the run's training micro-batch size."""
        size = self.params.fisher_batch_size or ctx.batch_size
        if size is None:
            raise MethodConfigError("method.fisher_batch_size is null and this run context has no train batch size; "
                                    "set method.fisher_batch_size to an integer > 0")
        return int(size)

    def fisher_key(self, ctx: RunContext, targets: list[str]) -> tuple[str, dict]:
        """sha256 of backbone key + reference cache key + seed + settings (the resolved Fisher batch size included)."""
        components = {
            "format_version": FISHER_FORMAT_VERSION,
            "backbone": ctx.backbone_key,
            "reference": ctx.reference().key,
            "seed": int(ctx.seed),
            "target_modules": sorted(targets),
            "max_sequences": self.params.max_sequences,
            "fisher_batch_size": self.fisher_batch_size(ctx),
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
            size = components["fisher_batch_size"]
            fisher = diagonal_fisher(model, modules, pairs, ctx.device, size, ctx.tokenizer.pad_token_id,
                                     progress=ctx.progress)
            save_tensors(folder / FISHER_FILE, fisher)
            return {"n_sequences": len(pairs), "n_batches": len(fisher_batches(pairs, size))}

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
            fisher_batches=entry.manifest.get("n_batches"),
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
        return self.params.ewc_lambda * self.penalty(model)
