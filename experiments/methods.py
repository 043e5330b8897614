"""The Method contract: hooks that every method (ATLAS and each baseline) plugs into the one training loop.

A method is a small class; `experiments.train.train` calls its hooks in this order:

    model = method.prepare(model, ctx)            # inject adapters, build statistics from calibration data
    for each optimizer step:
        examples = method.mix_batches(examples, ctx)   # e.g. replay mixes in retained examples
        loss = SFT loss (+ method.extra_loss(model, batch, ctx) when not None)
        optimizer step; method.after_step(model, ctx)  # e.g. projections
    method.export(model, dir)                     # what is stored (its bytes are a reported cost)
    method.scale(model, alpha)                    # post-hoc interpolation toward the base

`experiments` never imports `atlas` or `baselines`: methods are built from config (`_target_`).
"""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch


class MethodConfigError(ValueError):
    """A method hyperparameter is not allowed; the message names key, value and what is allowed."""


@dataclass
class RunContext:
    """What hooks may read: the run's config, tokenizer, benchmark, a lazy reference cache and the device."""

    cfg: Any
    tokenizer: Any
    benchmark: Any
    run_dir: Path
    device: torch.device = torch.device("cpu")
    seed: int = 0
    reference_fn: Optional[Callable[[], Any]] = None
    step: int = 0
    extras: dict = field(default_factory=dict)

    def reference(self):
        """The base model's reference cache (built on first use, shared by every run of a sweep)."""
        if self.reference_fn is None:
            raise RuntimeError("this run has no reference cache available")
        if "reference" not in self.extras:
            self.extras["reference"] = protected_view(self.reference_fn(), self.benchmark)
        return self.extras["reference"]


def protected_view(reference: Any, benchmark: Any) -> Any:
    """The reference cache as methods see it: only the domains `benchmark.protect` names.

    The view's key gains the protected domains, so statistics cached under it (EWC's Fisher) never
    mix runs that protect different domains. Evaluation reads the full cache, not this view.
    """
    protect = getattr(benchmark, "protect", None)
    if protect is None or not hasattr(reference, "domains"):
        return reference
    names = sorted(protect)
    return dataclasses.replace(reference, key=f"{reference.key}/protect={','.join(names)}",
                               domains={n: reference.domains[n] for n in names})


class Method:
    """Base class: a method that trains whatever `prepare` leaves trainable, with no extra terms."""

    name: str = "method"
    trains: bool = True

    def __init__(self, name: str, **hparams: Any) -> None:
        self.name = name
        self.hparams = hparams

    # -- hooks -------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Wrap or modify the model before training; return the model to train."""
        return model

    def extra_loss(self, model: torch.nn.Module, batch: dict, ctx: RunContext) -> Optional[torch.Tensor]:
        """An additional loss term for this batch (already weighted), or None."""
        return None

    def mix_batches(self, examples: list[dict], ctx: RunContext) -> list[dict]:
        """The encoded examples of one micro-batch, possibly with others mixed in."""
        return examples

    def after_step(self, model: torch.nn.Module, ctx: RunContext) -> None:
        """Called after every optimizer step (e.g. projections)."""

    # -- state ---------------------------------------------------------------------------------
    def trainable_parameters(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates."""
        return [p for p in model.parameters() if p.requires_grad]

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """What a checkpoint must hold to restore the method's trained state (trainable tensors by default)."""
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def load_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` saved."""
        params = dict(model.named_parameters())
        missing = [n for n in state if n not in params]
        if missing:
            raise KeyError(f"checkpoint holds tensors the model lacks: {missing[:5]}")
        with torch.no_grad():
            for n, t in state.items():
                params[n].copy_(t)

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save what this method adds to the backbone into `out_dir`; return the stored bytes."""
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        state = {n: t.contiguous() for n, t in self.state_dict(model).items()}
        if not state:
            return 0
        path = out_dir / "method_state.safetensors"
        save_file(state, str(path))
        return os.path.getsize(path)

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Post-hoc interpolation toward the base: the method's update is multiplied by `alpha`."""
        raise NotImplementedError(f"method {self.name!r} has no post-hoc scale")

    def costs(self) -> dict:
        """Method-specific costs for the record (e.g. atlas bytes, build seconds); merged into `cost`."""
        return {}

    def describe(self) -> dict:
        """Name and hyperparameters, for the result record."""
        return {"name": self.name, **self.hparams}


class BaseMethod(Method):
    """No training: the frozen backbone, evaluated exactly like every trained method."""

    trains = False

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """The base has no update: every scale gives the base."""


def build_method(method_cfg: Any) -> Method:
    """Instantiate the method a `conf/method/*.yaml` names through its `_target_`.

    Unknown hyperparameters and values the method rejects raise `MethodConfigError` naming the key.
    """
    import inspect

    from hydra.utils import get_class
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.to_container(method_cfg, resolve=True) if isinstance(method_cfg, DictConfig) else dict(method_cfg)
    target = cfg.pop("_target_")
    try:
        cls = get_class(target)
    except Exception as exc:
        raise MethodConfigError(f"method._target_={target!r} cannot be imported: {exc}") from None
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        allowed = sorted(k for k in params if k != "self")
        unknown = sorted(set(cfg) - set(allowed))
        if unknown:
            raise MethodConfigError(f"method.{unknown[0]}={cfg[unknown[0]]!r} is not a parameter of {target}; allowed: {allowed}")
    return cls(**cfg)


def require(key: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise `MethodConfigError` naming `method.<key>` unless `ok`."""
    if not ok:
        raise MethodConfigError(f"method.{key}={value!r} is not allowed: {allowed}")
