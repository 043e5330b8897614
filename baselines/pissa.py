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

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from peft import get_peft_model

from baselines.common import ResidualLoRA
from baselines.lora import LoRAParams
from experiments.log import timed_phase
from experiments.methods import RunContext, is_int, require

log = logging.getLogger("suite.train")


@dataclass(kw_only=True)
class PiSSAParams(LoRAParams):
    """LoRA's, plus the SVD: `svd_niter` null = exact, K = randomized with K subspace iterations."""

    svd_niter: Optional[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        require("svd_niter", self.svd_niter, self.svd_niter is None or (is_int(self.svd_niter) and self.svd_niter > 0),
                "null (exact SVD) or an integer > 0 (randomized SVD with that many subspace iterations)")


class PiSSA(ResidualLoRA):
    """peft PiSSA adapters (principal singular components of each adapted weight; W0 replaced by the residual)."""

    Params = PiSSAParams
    params: PiSSAParams
    init_dir_name = "pissa_init"

    def peft_init(self) -> dict:
        """peft's name of the initialisation: "pissa" (exact SVD) or "pissa_niter_K"."""
        niter = self.params.svd_niter
        return {"init_lora_weights": "pissa" if niter is None else f"pissa_niter_{niter}"}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        config = self.lora_config(self.resolve_targets(model, ctx))
        with self.timed("svd_seconds"), timed_phase(log, "PiSSA: SVD of the adapted weights"):
            model = self.initialised(model, config, ctx)
        self.remember_init(model, Path(ctx.run_dir))
        return model

    def initialised(self, model: torch.nn.Module, config, ctx: RunContext) -> torch.nn.Module:
        """peft's PiSSA initialisation; the randomized SVD's draws are seeded from the run's seed alone."""
        if self.params.svd_niter is None:
            return get_peft_model(model, config)
        # torch.svd_lowrank draws from the global RNG of the weight's device: fork it, seeded by the run.
        devices = list(range(torch.cuda.device_count())) if torch.device(ctx.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(ctx.seed)
            return get_peft_model(model, config)
