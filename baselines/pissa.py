"""PiSSA (Meng et al., NeurIPS 2024, arXiv 2404.02948) through peft: train the principal subspace of W0.

For each adapted Linear, with the SVD  W0 = U S V^T  (singular values in decreasing order), peft's
`init_lora_weights="pissa"` sets

    B0 = U_r sqrt(S_r / s),   A0 = sqrt(S_r / s) V_r^T,   W_res = W0 - s B0 A0     (the FIRST r components)

so h = W_res x + s B A x equals the base at init and training moves the r directions W0 uses most.
In the retained setting it is the contrast to MiLoRA (the last r components) and CorDA: it should
forget more.

SVD choice: `svd_niter: null` (the default) is peft's exact `torch.linalg.svd` ("pissa"): no
randomness, so a resumed run rebuilds the very same W_res, B0 and A0. `svd_niter: K` is peft's fast
randomized SVD ("pissa_niter_K", `torch.svd_lowrank` with K subspace iterations), an approximation of
the principal components for large backbones; its random draws are seeded from the run's seed
alone (a forked RNG), so it too rebuilds identically on resume.

Post-hoc scale and export are `baselines.common.ResidualLoRA`'s: scale(alpha) = W0 + alpha D against
the true W0 with D = s (B A - B0 A0), and the export is D as a plain rank-2r LoRA (peft's
`path_initial_model_for_weight_conversion`) that loads onto the unmodified base.
Knobs: rank, train.steps / train.lr and the post-hoc scale.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from baselines.common import ResidualLoRA, target_module_names
from experiments.backbones import check_target_modules
from experiments.methods import RunContext, require


class PiSSA(ResidualLoRA):
    """peft PiSSA adapters (principal singular components of each adapted weight; W0 replaced by the residual)."""

    init_dir_name = "pissa_init"

    def __init__(
        self,
        name: str = "pissa",
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Optional[Sequence[str]] = None,
        svd_niter: Optional[int] = None,
    ) -> None:
        require("svd_niter", svd_niter, svd_niter is None or (isinstance(svd_niter, int) and not isinstance(svd_niter, bool)
                                                             and svd_niter > 0),
                "null (exact SVD) or an integer > 0 (randomized SVD with that many subspace iterations)")
        super().__init__(name, rank=rank, alpha=alpha, dropout=dropout, target_modules=target_modules)
        self.hparams.update(svd_niter=svd_niter)
        self.svd_niter = svd_niter

    @property
    def init_lora_weights(self) -> str:
        """peft's name of the initialisation: "pissa" (exact SVD) or "pissa_niter_K"."""
        return "pissa" if self.svd_niter is None else f"pissa_niter_{self.svd_niter}"

    def lora_config(self, ctx: RunContext):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=target_module_names(ctx, self.target_modules), bias="none", task_type="CAUSAL_LM",
            init_lora_weights=self.init_lora_weights,
        )

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        from peft import get_peft_model

        config = self.lora_config(ctx)
        check_target_modules(model, list(config.target_modules), key="method.target_modules")
        t0 = time.perf_counter()
        if self.svd_niter is None:
            model = get_peft_model(model, config)
        else:
            # torch.svd_lowrank draws from the global RNG of the weight's device: fork it, seeded by the run.
            devices = list(range(torch.cuda.device_count())) if torch.device(ctx.device).type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(ctx.seed)
                model = get_peft_model(model, config)
        self._costs.update(svd_seconds=time.perf_counter() - t0)
        self.remember_init(model, Path(ctx.run_dir))
        return model
