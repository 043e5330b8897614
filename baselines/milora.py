"""MiLoRA (Wang et al., NAACL 2025, arXiv 2406.09044): PiSSA's construction on the MINOR singular components.

For each adapted Linear, with the SVD  W0 = U S V^T  (singular values in decreasing order),

    B0 = U_r sqrt(S_r / s),   A0 = sqrt(S_r / s) V_r^T,   W_res = W0 - s B0 A0     (the LAST r components)

so s B0 A0 = U_r S_r V_r^T is the minor part of W0, W_res its principal part, h = W_res x + s B A x
equals the base at init, and training starts in the directions W0 uses least (the paper's
argument: the principal components hold the pre-trained knowledge, leave them alone).

Hand-written because peft has no MiLoRA initialisation (its `init_lora_weights` options take the
principal components (PiSSA), the covariance-weighted ones (CorDA), a QR (OLoRA), or, with "mica",
the minor left singular vectors with A = 0 and B frozen, which is a different method). It is built on a
normal peft LoRA model: `get_peft_model` with the default init, then the factors and the residual
base weight are set here (`baselines.common.set_residual_init`). So export, reload and post-hoc scale
are peft's machinery, exactly as for PiSSA and CorDA (`baselines.common.ResidualLoRA`): scale(alpha) =
W0 + alpha D against the true W0 with D = s (B A - B0 A0); the export is D as a plain rank-2r LoRA
(peft's `path_initial_model_for_weight_conversion`) that loads onto the unmodified base.

The factors are saved in the run folder (`milora_factors.safetensors`) at the first prepare, so a
resumed run rebuilds exactly the same W_res, B0 and A0 whatever the SVD routine returns on its device.
Knobs: rank, train.steps / train.lr and the post-hoc scale.
"""

from __future__ import annotations

from pathlib import Path

import torch

from baselines.common import ResidualLoRA, lora_layers, set_residual_init
from experiments.methods import RunContext

FACTORS_FILE = "milora_factors.safetensors"


def minor_factors(weight: torch.Tensor, rank: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B0 [out, rank], A0 [rank, in]) with s B0 A0 = U_r S_r V_r^T, the LAST `rank` singular components of `weight`.

    Computed in float32 (float64 inputs stay float64); the square root of S_r / s is split evenly between B0 and A0.
    """
    w = weight.detach().double() if weight.dtype == torch.float64 else weight.detach().float()
    if not 0 < rank <= min(w.shape):
        raise ValueError(f"rank {rank} needs 0 < rank <= min{tuple(w.shape)}")
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    root = (s[-rank:] / scaling).sqrt()
    return u[:, -rank:] * root, root[:, None] * vh[-rank:]


class MiLoRA(ResidualLoRA):
    """LoRA initialised from the minor singular components of each adapted weight; W0 replaced by the residual."""

    run_files = (FACTORS_FILE,)

    init_dir_name = "milora_init"

    def build_factors(self, layers: dict[str, torch.nn.Module]):
        """(`<module>/B0`, `<module>/A0` for every adapted module, module -> [module]) from the current base weights."""
        out = {}
        for name, layer in layers.items():
            b0, a0 = minor_factors(layer.get_base_layer().weight, self.params.rank, layer.scaling["default"])
            out[f"{name}/B0"], out[f"{name}/A0"] = b0, a0
        return out, {name: [name] for name in layers}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        model = super().prepare(model, ctx)  # plain peft LoRA layers (LoRA.prepare), factors set below
        layers = lora_layers(model)  # the rank fits every one of them (LoRA.check_shapes)
        tensors, _ = self.run_statistics(ctx, FACTORS_FILE, lambda: self.build_factors(layers), "svd_seconds",
                                         "factors_reused")
        for name, layer in layers.items():
            if f"{name}/A0" not in tensors:
                raise RuntimeError(f"MiLoRA's saved factors lack adapted module {name}")
            set_residual_init(layer, tensors[f"{name}/B0"], tensors[f"{name}/A0"])
        self.remember_init(model, Path(ctx.run_dir))
        return model
