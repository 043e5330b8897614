"""Full fine-tuning of the adapted modules: the unconstrained reference.

Every weight of the backbone's target modules (the Linears the LoRA-based methods adapt, e.g.
q/k/v/o and gate/up/down projections) trains; everything else (embeddings, norms, biases, the LM
head) stays frozen. h = W x with W = W0 at init, so the model is the base at step 0. The learning
rate is the run's `train.lr`: full fine-tuning usually wants a smaller one than LoRA (see
`conf/method/fullft.yaml`).

Post-hoc scale (WiSE-FT, Wortsman et al., arXiv 2109.01903): W0 + alpha (W - W0) for every adapted
weight, exactly. A host copy of W0 is kept for the adapted modules only (`w0_copy_bytes` in the
costs); the trained weights are kept while scaled away from 1, so alpha = 0 restores W0 and alpha = 1
the trained weights bit for bit, and every other alpha is one rounding of the float32 interpolation.

Export: the adapted modules' weights in the backbone's dtype (`adapted_weights.safetensors`, keys
`<module>.weight`); the stored bytes are that file's. `load_fullft_export(base, export_dir)` copies
them into a freshly loaded base.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

from experiments.activations import target_linears
from experiments.methods import AdapterParams, Method, RunContext
from experiments.tensor_files import save_tensors, verify_tensors

WEIGHTS_FILE = "adapted_weights.safetensors"
EXPORT_FORMAT = "atlas-fullft-v1"


def load_fullft_export(model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
    """The backbone `model` with the adapted weights of a `FullFT` export copied in (in place); returns it."""
    path = Path(export_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no full fine-tuning export at {path}")
    params = dict(model.named_parameters())
    if verify_tensors(path).get("format") != EXPORT_FORMAT:  # a damaged file raises DamagedFile here
        raise ValueError(f"{path} is not a full fine-tuning export ({EXPORT_FORMAT})")
    with safe_open(str(path), framework="pt") as fh:
        keys = list(fh.keys())
        missing = [k for k in keys if k not in params]
        if missing:
            raise KeyError(f"the export holds weights the model lacks: {missing[:5]}")
        with torch.no_grad():
            for key in keys:
                tensor = fh.get_tensor(key)
                if tuple(tensor.shape) != tuple(params[key].shape):
                    raise ValueError(f"{key}: exported shape {tuple(tensor.shape)} != "
                                     f"model shape {tuple(params[key].shape)}")
                params[key].copy_(tensor.to(params[key].device, params[key].dtype))
    return model


class FullFT(Method):
    """Train the full weights of the adapted modules; scale(alpha) = W0 + alpha (W - W0)."""

    Params = AdapterParams

    def __init__(self, params: AdapterParams) -> None:
        super().__init__(params)
        self.w0: dict[str, torch.Tensor] = {}  # module name -> W0 (host copy)
        self.alpha_now = 1.0
        self._trained: Optional[dict[str, torch.Tensor]] = None  # module name -> trained W while scaled away from 1

    def adapted(self, model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
        """Module name -> adapted Linear, in module order."""
        return {n: m for n, m in model.named_modules() if n in self.w0}

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        linears = target_linears(model, targets)
        for p in model.parameters():
            p.requires_grad_(False)
        for module in linears.values():
            module.weight.requires_grad_(True)
        self.w0 = {n: m.weight.detach().to("cpu", copy=True) for n, m in linears.items()}
        self.alpha_now, self._trained = 1.0, None
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        if checkpointing and hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()  # frozen embeddings: let checkpointed blocks see a grad-requiring input
        self._costs.update(w0_copy_bytes=sum(t.numel() * t.element_size() for t in self.w0.values()),
                           adapted_modules=len(self.w0))
        return model

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """W0 + alpha (W - W0) for every adapted weight (W = the trained weight)."""
        alpha = float(alpha)
        modules = self.adapted(model)
        if self._trained is None:
            if alpha == 1.0:
                return
            self._trained = {n: m.weight.detach().to("cpu", copy=True) for n, m in modules.items()}
        with torch.no_grad():
            for name, module in modules.items():
                weight = module.weight
                w0, trained = self.w0[name], self._trained[name]
                if alpha == 1.0:
                    weight.copy_(trained)
                elif alpha == 0.0:
                    weight.copy_(w0)
                else:
                    w0f = w0.to(weight.device).float()
                    weight.copy_((w0f + alpha * (trained.to(weight.device).float() - w0f)).to(weight.dtype))
        if alpha == 1.0:
            self._trained = None
        self.alpha_now = alpha

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """The adapted modules' weights (safetensors, the backbone's dtype); returns the file's bytes."""
        if not self.w0:
            raise RuntimeError("fullft: export before prepare")
        if self.alpha_now != 1.0:
            raise RuntimeError(f"fullft: export at scale {self.alpha_now}; call scale(model, 1.0) first")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {f"{n}.weight": m.weight.detach().contiguous().cpu() for n, m in self.adapted(model).items()}
        return save_tensors(out_dir / WEIGHTS_FILE, state,
                            {"format": EXPORT_FORMAT, "modules": json.dumps(sorted(self.w0))})

    @classmethod
    def load_export(cls, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """`load_fullft_export`: the base `model` with the exported adapted weights copied in."""
        return load_fullft_export(model, export_dir)
