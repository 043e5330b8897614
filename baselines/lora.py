"""LoRA (Hu et al., ICLR 2022, arXiv 2106.09685) through peft: h = W0 x + (alpha / r) B A x.

A is Kaiming-uniform and B = 0 (peft's default init), so the adapted model equals the base at
step 0. Knobs: training steps / learning rate, and the post-hoc scale.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

from baselines.fused_lora import FusedLoraLinear
from experiments.methods import AdapterParams, Method, RunContext, is_int, require, require_rank_fits
from experiments.tensor_files import library_writes


def save_peft(model: torch.nn.Module, out_dir: Path, **kwargs) -> None:
    """peft's `save_pretrained(out_dir, **kwargs)`, its safetensors files written as the suite's own are
    (`experiments.tensor_files.library_writes`: the errno of a failed write, the user's umask)."""
    with library_writes(Path(out_dir)):
        model.save_pretrained(str(out_dir), **kwargs)


@dataclass(kw_only=True)
class LoRAParams(AdapterParams):
    """peft LoRA's hyperparameters: rank r, scale numerator alpha (s = alpha / r), dropout on the adapter input."""

    rank: int
    alpha: float
    dropout: float

    def __post_init__(self) -> None:
        super().__post_init__()
        require("rank", self.rank, is_int(self.rank) and self.rank > 0, "an integer > 0")
        require("alpha", self.alpha, self.alpha > 0, "> 0")
        require("dropout", self.dropout, 0.0 <= self.dropout < 1.0, "in [0, 1)")


class LoRA(Method):
    """peft LoRA on the backbone's (or the configured) target modules."""

    Params = LoRAParams
    params: LoRAParams

    def peft_init(self) -> dict:
        """Extra `LoraConfig` keywords of a LoRA variant (its initialisation); none for plain LoRA."""
        return {}

    def lora_config(self, targets: list[str], **extra):
        """The peft `LoraConfig` this method applies to `targets`."""

        p = self.params
        config = LoraConfig(r=p.rank, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=list(targets),
                            bias="none", task_type="CAUSAL_LM", **self.peft_init(), **extra)
        config._register_custom_module({torch.nn.Linear: FusedLoraLinear})  # peft's layer, one fused product
        return config

    def check_shapes(self, model: torch.nn.Module, targets: list[str]) -> None:
        """The rank fits every adapted layer (`require_rank_fits`)."""
        require_rank_fits(model, targets, self.params.rank)

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        return get_peft_model(model, self.lora_config(self.resolve_targets(model, ctx)))

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save the peft adapter (adapter_model.safetensors + adapter_config.json); return its bytes."""
        save_peft(model, out_dir)
        return sum(os.path.getsize(p) for p in Path(out_dir).glob("adapter_model.*"))

    @classmethod
    def load_export(cls, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """The backbone `model` with the exported peft adapter loaded on top, for inference."""
        return PeftModel.from_pretrained(model, str(export_dir))

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Set every LoRA layer's scale to alpha * (lora_alpha / r): alpha = 0 is the base, 1 the trained model."""
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for adapter in module.active_adapters:
                    module.set_scale(adapter, alpha)
