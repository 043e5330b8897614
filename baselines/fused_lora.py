"""peft's LoRA Linear with the adapter's scale and sum inside one matrix product.

peft computes `result + lora_B(lora_A(dropout(x))) * scaling`: besides the two thin products, a multiply and an add
over the whole (tokens, out_features) output, and both again in the backward pass. On small backbones those
element-wise passes cost as much as the adapter's products (micro: about a tenth of a training step). In the plain
case (one active adapter, no LoRA variant such as DoRA, no dropout, unmerged, adapter and output of one dtype)
`FusedLoraLinear.forward` computes W x + s B (A x) as one `torch.addmm` on top of W x, the same sum in another
order. Everything else (initialisation, state dict, merging, saving, `set_scale`) is peft's `lora.Linear`, which
this subclass is; any other case runs peft's forward unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import Linear


class FusedLoraLinear(Linear):
    """peft `lora.Linear` whose plain forward is W x + s B A x in one addmm (module docstring)."""

    def _fused_adapter(self, x: torch.Tensor, args: tuple, kwargs: dict):
        """The one adapter the fused form applies to, or None where peft's own forward must run."""
        if args or kwargs or self.disable_adapters or self.merged or len(self.active_adapters) != 1:
            return None
        name = self.active_adapters[0]
        if name not in self.lora_A or name in self.lora_variant:
            return None
        dropout = self.lora_dropout[name]
        if not isinstance(dropout, torch.nn.Identity) and self.training and dropout.p > 0:
            return None
        weight = getattr(self.get_base_layer(), "weight", None)
        dtype = self.lora_A[name].weight.dtype
        if weight is None or weight.dtype != dtype or x.dtype != dtype or torch.is_autocast_enabled(x.device.type):
            return None  # mixed precision: peft's casts
        return name

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        name = self._fused_adapter(x, args, kwargs)
        if name is None:
            return super().forward(x, *args, **kwargs)
        y = self.base_layer(x)
        low = x.reshape(-1, x.shape[-1]) @ self.lora_A[name].weight.T
        return torch.addmm(y.reshape(-1, y.shape[-1]), low, self.lora_B[name].weight.T,
                           alpha=self.scaling[name]).view(y.shape)
