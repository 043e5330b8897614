"""What the LoRA-based baselines share: deterministic per-step draws, per-module access to peft's
LoRA layers, site input statistics, and `ResidualLoRA`, the LoRA whose initial factors are carved out
of W0 (PiSSA, MiLoRA, LoRA-Null, CorDA). Retained calibration data: `experiments.calibration`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch
from peft.tuners.lora import LoraLayer

from baselines.lora import LoRA, save_peft
from experiments.activations import Site, collect_inputs, discover_sites
from experiments.calibration import calibration_pairs, pair_example
from experiments.methods import RunContext, SiteStatisticsParams

PEFT_PREFIX = "base_model.model."


# -- determinism ---------------------------------------------------------------------------------
def step_generator(seed: int, step: int, index: int, salt: str) -> torch.Generator:
    """A CPU generator seeded from (salt, seed, step, index) alone: the same draw on resume, no global RNG."""
    digest = hashlib.sha256(f"{salt}|{seed}|{step}|{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


class MicroCounter:
    """Index of the current micro-batch within an optimizer step (hooks run once per micro-batch)."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.index = 0

    def next(self, step: int) -> int:
        if step != self.step:
            self.step, self.index = step, 0
        else:
            self.index += 1
        return self.index


# -- peft LoRA layers ----------------------------------------------------------------------------
def base_name(peft_name: str) -> str:
    """A module's name in the unwrapped backbone (peft prefixes `base_model.model.`)."""
    return peft_name[len(PEFT_PREFIX):] if peft_name.startswith(PEFT_PREFIX) else peft_name


def lora_layers(model: torch.nn.Module, adapter: str = "default") -> dict[str, torch.nn.Module]:
    """Backbone module name -> peft LoRA layer holding `adapter`, in module order."""
    return {base_name(n): m for n, m in model.named_modules()
            if isinstance(m, LoraLayer) and adapter in getattr(m, "lora_A", {})}


def lora_delta(layer: torch.nn.Module, adapter: str = "default") -> torch.Tensor:
    """(out, in) update s * B A of one LoRA layer (differentiable)."""
    a = layer.lora_A[adapter].weight
    b = layer.lora_B[adapter].weight
    return layer.scaling[adapter] * (b @ a)


# -- site statistics -----------------------------------------------------------------------------
def probe_ids(ctx: RunContext) -> torch.Tensor:
    return torch.tensor([[ctx.tokenizer.eos_token_id or 0] * 4], device=ctx.device)


def site_inputs(
    model: torch.nn.Module,
    ctx: RunContext,
    targets: Sequence[str],
    params: SiteStatisticsParams,
    sequences: Optional[Sequence[dict]] = None,
    sites: Optional[list[Site]] = None,
) -> tuple[list[Site], dict[str, torch.Tensor]]:
    """Sites of the (unwrapped) backbone and each site's (n_tokens, dim) inputs over `sequences` (default: the
    run's retained calibration pairs, prompt + the base's response), `params.max_tokens` of them drawn with the
    run's seed, `params.calibration_batch_size` sequences per forward pass."""
    if sequences is None:
        sequences = [pair_example(pair) for pair in calibration_pairs(ctx)]
    sites = sites or discover_sites(model, targets, probe_ids(ctx))
    inputs = collect_inputs(model, sites, sequences, pad_id=ctx.tokenizer.pad_token_id,
                            batch_size=params.calibration_batch_size, max_tokens=params.max_tokens, seed=ctx.seed,
                            device=ctx.device, progress=ctx.progress)
    return sites, inputs


# -- LoRA with a residual base weight -----------------------------------------------------------
def set_residual_init(layer: torch.nn.Module, b0: torch.Tensor, a0: torch.Tensor, adapter: str = "default") -> None:
    """Give a peft LoRA layer the factors (B0, A0) and the base weight W_res = W0 - s B0 A0 (W0 = its current base
    weight), so that W_res + s B0 A0 = W0 and the layer's output is unchanged.

    The product is taken in float32 from the factors as the layer stores them, then cast to the base dtype.
    """
    weight = layer.get_base_layer().weight
    a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
    with torch.no_grad():
        a.copy_(a0.to(a.device, a.dtype))
        b.copy_(b0.to(b.device, b.dtype))
        residual = weight.float() - layer.scaling[adapter] * (b.float() @ a.float()).to(weight.device)
        weight.copy_(residual.to(weight.dtype))


def adapter_bytes(out_dir: Path) -> int:
    """Bytes of the adapter tensors peft's `save_pretrained` wrote into `out_dir`."""
    return sum(os.path.getsize(p) for p in Path(out_dir).glob("adapter_model.*"))


class ResidualLoRA(LoRA):
    """peft LoRA whose initial factors (B0, A0) are taken out of the base weight: W_res = W0 - s B0 A0, so
    h = W_res x + s B A x is the base at init and training starts from B = B0, A = A0.

    The trained model is W0 + D with the converted update D = s (B A - B0 A0). Subclasses build the
    factors in `prepare` (by peft's own initialisation or with `set_residual_init`) and then call
    `remember_init`, which keeps (B0, A0) and saves the initial adapter for peft's conversion.

    Post-hoc scale against the TRUE W0: `scale(alpha)` gives W0 + alpha D by setting the LoRA scale to
    alpha * s and the base weight to W_res + (1 - alpha) s B0 A0. W_res itself is kept (a copy on the
    host, taken at the first scale away from 1), so every scale is one rounding away from exact and
    `scale(1)` restores the trained base weights bit for bit.

    Export: peft's conversion (`save_pretrained(..., path_initial_model_for_weight_conversion=...)`) writes
    D as a plain rank-2r LoRA ([B | B0], [A ; -A0], alpha doubled) that loads onto the unmodified base.
    """

    init_dir_name = "lora_init"

    exact_export = False  # the export is the converted update: the same function, other float32 rounding

    def __init__(self, params) -> None:
        super().__init__(params)
        self.init_factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # module -> (B0, A0)
        self.init_dir: Optional[Path] = None
        self.alpha_now = 1.0
        self._trained_base: Optional[dict[str, torch.Tensor]] = None  # module -> W_res while scaled away from 1

    def remember_init(self, model: torch.nn.Module, run_dir: Path, save_adapter: bool = True) -> None:
        """Keep every layer's (B0, A0); with `save_adapter`, save the initial adapter into the run folder."""
        self.init_factors = {n: (m.lora_B["default"].weight.detach().clone(), m.lora_A["default"].weight.detach().clone())
                             for n, m in lora_layers(model).items()}
        self.alpha_now, self._trained_base = 1.0, None
        self.init_dir = None
        if save_adapter:
            self.init_dir = Path(run_dir) / self.init_dir_name
            shutil.rmtree(self.init_dir, ignore_errors=True)
            save_peft(model, self.init_dir)

    def check_exportable(self) -> None:
        if not self.init_factors:
            raise RuntimeError(f"{self.name}: export before prepare")
        if self.alpha_now != 1.0:
            raise RuntimeError(f"{self.name}: export at scale {self.alpha_now}; call scale(model, 1.0) first")

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """The converted update D = s (B A - B0 A0) as a plain rank-2r LoRA on the true base; returns its bytes."""
        self.check_exportable()
        if self.init_dir is None:
            raise RuntimeError(f"{self.name}: no initial adapter was saved at prepare")

        with warnings.catch_warnings():
            # peft warns that a base-rewriting adapter meets a second one: the initial adapter it loads to convert.
            warnings.filterwarnings("ignore", message=".*changes the base weights of the model.*")
            save_peft(model, out_dir, path_initial_model_for_weight_conversion=str(self.init_dir))
        return adapter_bytes(out_dir)

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """W0 + alpha * s (B A - B0 A0): LoRA scale alpha * s, base weight W_res + (1 - alpha) s B0 A0."""
        alpha = float(alpha)
        layers = lora_layers(model)
        with torch.no_grad():
            if alpha != 1.0 and self._trained_base is None:
                self._trained_base = {n: m.get_base_layer().weight.detach().to("cpu", copy=True) for n, m in layers.items()}
            if self._trained_base is not None:
                for name, layer in layers.items():
                    weight = layer.get_base_layer().weight
                    residual = self._trained_base[name].to(weight.device)
                    if alpha == 1.0:
                        weight.copy_(residual)
                        continue
                    b0, a0 = self.init_factors[name]
                    s = layer.lora_alpha["default"] / layer.r["default"]
                    shift = (1.0 - alpha) * s * (b0.float() @ a0.float()).to(weight.device)
                    weight.copy_((residual.float() + shift).to(weight.dtype))
                if alpha == 1.0:
                    self._trained_base = None
        LoRA.scale(self, model, alpha)
        self.alpha_now = alpha

