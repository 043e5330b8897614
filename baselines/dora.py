"""DoRA (Liu et al., ICML 2024, arXiv 2402.09353) through peft (`LoraConfig(use_dora=True)`).

Each adapted weight is split into a magnitude and a direction:

    W' = m ⊙ (W0 + s B A) / ||W0 + s B A||_row,    h = W' x
    m  = ||W0||_row at init (one entry per output feature), A Kaiming-uniform, B = 0

peft's "row" norm is the norm of each output feature's row (its `lora_magnitude_vector`), and the
norm is detached from the gradient as the paper prescribes (section 4.3). A, B and m train; the model
equals the base at init (B = 0 and m / ||W0||_row = 1).

Post-hoc scale against the true W0. DoRA is not additive in B A, so peft's `set_scale` would not
give W0 + alpha Delta (a trained m / ||W0||_row != 1 stays in force at scale 0). With the trained
W_t = D (W0 + s B_t A), D = diag(m_t / ||W0 + s B_t A||_row), the wanted weight is

    W0 + alpha (W_t - W0) = G W0 + alpha D s B_t A,    G = diag(1 - alpha + alpha D)

which is again a DoRA layer: up-projection B' = (alpha D / G) B_t (row-wise) and magnitude
m' = G ||W0 + s B' A||_row (norms computed as peft's forward computes them). `scale(alpha)` sets
these (the trained B_t, m_t are kept while scaled away from 1); alpha = 0 gives B' = 0 and m' =
||W0||_row, the base exactly; `scale(1)` restores B_t and m_t bit for bit.

Export: peft `save_pretrained` (A, B and m); reload with `baselines.common.load_peft_export`.
Knobs: rank, train.steps / train.lr and the post-hoc scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from baselines.common import lora_layers
from baselines.lora import LoRA, LoRAParams
from experiments.methods import RunContext


def dora_row_norm(layer: torch.nn.Module, adapter: str = "default") -> torch.Tensor:
    """||W0 + s B A||_row of a peft DoRA layer, exactly as its forward pass computes it (detached)."""
    dora = layer.lora_magnitude_vector[adapter]
    weight = layer.get_base_layer().weight
    lora_weight = dora.get_lora_weight(lora_A=layer.lora_A[adapter], lora_B=layer.lora_B[adapter]).to(weight.dtype)
    return dora.get_weight_norm(weight, lora_weight.detach(), layer.scaling[adapter]).detach()


def dora_effective_weight(layer: torch.nn.Module, adapter: str = "default") -> torch.Tensor:
    """W' = m ⊙ (W0 + s B A) / ||W0 + s B A||_row of a peft DoRA layer (float32, detached)."""
    weight = layer.get_base_layer().weight.float()
    a, b = layer.lora_A[adapter].weight.float(), layer.lora_B[adapter].weight.float()
    direction = weight + layer.scaling[adapter] * (b @ a)
    magnitude = layer.lora_magnitude_vector[adapter].weight.float()
    return ((magnitude / dora_row_norm(layer, adapter).float())[:, None] * direction).detach()


class DoRA(LoRA):
    """peft DoRA: LoRA on the direction of each adapted weight plus a trained per-output magnitude."""

    Params = LoRAParams
    params: LoRAParams

    def __init__(self, params: LoRAParams) -> None:
        super().__init__(params)
        self.alpha_now = 1.0
        self._trained: Optional[dict[str, tuple[torch.Tensor, torch.Tensor]]] = None  # module -> (B_t, m_t)

    def peft_init(self) -> dict:
        return {"use_dora": True}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        model = super().prepare(model, ctx)
        self.alpha_now, self._trained = 1.0, None
        return model

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """The peft DoRA adapter (A, B, magnitudes); returns its bytes. Refuses at a scale other than 1."""
        if self.alpha_now != 1.0:
            raise RuntimeError(f"dora: export at scale {self.alpha_now}; call scale(model, 1.0) first")
        return super().export(model, out_dir)

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """W0 + alpha (W_t - W0) per adapted weight: B' = (alpha D / G) B_t, m' = G ||W0 + s B' A||_row."""
        alpha = float(alpha)
        layers = lora_layers(model)
        if self._trained is None:
            if alpha == 1.0:
                return
            self._trained = {n: (m.lora_B["default"].weight.detach().clone(),
                                 m.lora_magnitude_vector["default"].weight.detach().clone()) for n, m in layers.items()}
        with torch.no_grad():
            for name, layer in layers.items():
                b = layer.lora_B["default"].weight
                magnitude = layer.lora_magnitude_vector["default"].weight
                b_t, m_t = self._trained[name]
                b.copy_(b_t)
                magnitude.copy_(m_t)
                if alpha == 1.0:
                    continue
                d = m_t.float() / dora_row_norm(layer).float()
                g = 1.0 - alpha + alpha * d
                if bool((g.abs() < 1e-6).any()):
                    raise ValueError(f"dora: scale {alpha} makes a row of {name} vanish (1 - alpha + alpha D = 0)")
                b.copy_((b_t.float() * (alpha * d / g)[:, None]).to(b.dtype))
                magnitude.copy_((g * dora_row_norm(layer).float()).to(magnitude.dtype))
        if alpha == 1.0:
            self._trained = None
        self.alpha_now = alpha
