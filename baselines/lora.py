"""LoRA (Hu et al., ICLR 2022, arXiv 2106.09685) through peft: h = W0 x + (alpha / r) B A x.

A is Kaiming-uniform and B = 0 (peft's default init), so the adapted model equals the base at
step 0. Knobs: training steps / learning rate, and the post-hoc scale.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import torch

from experiments.backbones import check_target_modules
from experiments.methods import Method, RunContext, require


class LoRA(Method):
    """peft LoRA on the backbone's (or the configured) target modules."""

    def __init__(
        self,
        name: str = "lora",
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Optional[Sequence[str]] = None,
    ) -> None:
        require("rank", rank, isinstance(rank, int) and rank > 0, "an integer > 0")
        require("alpha", alpha, alpha > 0, "> 0")
        require("dropout", dropout, 0.0 <= dropout < 1.0, "in [0, 1)")
        super().__init__(name, rank=rank, alpha=alpha, dropout=dropout, target_modules=target_modules)
        self.rank, self.alpha, self.dropout = rank, alpha, dropout
        self.target_modules = list(target_modules) if target_modules else None

    def lora_config(self, ctx: RunContext):
        """The peft `LoraConfig` this method applies."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules or list(ctx.cfg.backbone.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        from peft import get_peft_model

        config = self.lora_config(ctx)
        check_target_modules(model, list(config.target_modules), key="method.target_modules")
        return get_peft_model(model, config)

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save the peft adapter (adapter_model.safetensors + adapter_config.json); return its bytes."""
        model.save_pretrained(str(out_dir))
        return sum(os.path.getsize(p) for p in Path(out_dir).glob("adapter_model.*"))

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Set every LoRA layer's scale to alpha * (lora_alpha / r): alpha = 0 is the base, 1 the trained model."""
        from peft.tuners.lora import LoraLayer

        for module in model.modules():
            if isinstance(module, LoraLayer):
                for adapter in module.active_adapters:
                    module.set_scale(adapter, alpha)
