"""The Method contract: hooks that every method (ATLAS and each baseline) plugs into the one training loop.

A method is a small class with one hyperparameter dataclass (`Params`, as peft's `LoraConfig`);
`experiments.train.train` calls its hooks in this order:

    model = method.prepare(model, ctx)            # inject adapters, build statistics from calibration data
    for each optimizer step:
        examples = method.mix_batches(examples, ctx)   # e.g. replay mixes in retained examples
        loss = SFT loss (+ method.extra_loss(model, batch, ctx) when not None)
        optimizer step; method.after_step(model, ctx)  # e.g. projections
    method.export(model, dir)                     # what is stored (its bytes are a reported cost)
    method.scale(model, alpha)                    # post-hoc interpolation toward the base
    model = type(method).load_export(base, dir)   # the exported method on a freshly loaded base

Hyperparameter values live in `conf/method/<name>.yaml` only; a `Params` dataclass declares their
types (no defaults) and checks their ranges in `__post_init__`, subclassing its parent method's.
`experiments` never imports `atlas` or `baselines`: methods are built from config (`_target_`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Optional

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from experiments import records, scale_refinement, validation
from experiments.activations import load_or_build_site_tensors
from experiments.backbones import check_target_modules
from experiments.log import timed_phase
from experiments.tensor_files import load_tensors, save_tensors
from experiments.validation import ConfigError, is_int  # noqa: F401  (is_int: part of the API of a method's Params)
from suite_schema import registry

PARAMS_FILE = "method.json"
STATE_FILE = "method_state.safetensors"


class MethodConfigError(ConfigError):
    """A method hyperparameter is not allowed; the message names key, value and what is allowed."""


def require(key: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise `MethodConfigError` naming `method.<key>` unless `ok` (`experiments.validation.require`)."""
    validation.require(f"method.{key}", value, ok, allowed, MethodConfigError)


@dataclass(kw_only=True)
class MethodParams:
    """What every method's hyperparameters hold: its name (records, tables, figures)."""

    name: str

    def __post_init__(self) -> None:
        require("name", self.name, isinstance(self.name, str) and bool(self.name.strip()), "a non-empty string")


@dataclass(kw_only=True)
class AdapterParams(MethodParams):
    """A method that adapts a set of Linear modules: their names (null = the backbone's `target_modules`)."""

    target_modules: Optional[list[str]]

    def __post_init__(self) -> None:
        super().__post_init__()
        ok = self.target_modules is None or (isinstance(self.target_modules, (list, tuple)) and len(self.target_modules) > 0
                                              and all(isinstance(t, str) and t for t in self.target_modules))
        require("target_modules", self.target_modules, ok, "null (the backbone's) or a non-empty list of module names")
        if self.target_modules is not None:
            self.target_modules = list(self.target_modules)


@dataclass(kw_only=True)
class SiteStatisticsParams(MethodParams):
    """A method that fits statistics on the inputs of the adapted modules: calibration tokens per site
    (`max_tokens`, a seeded subsample) and sequences per forward pass (`calibration_batch_size`)."""

    max_tokens: int
    calibration_batch_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        require("max_tokens", self.max_tokens, is_int(self.max_tokens) and self.max_tokens > 0, "an integer > 0")
        require("calibration_batch_size", self.calibration_batch_size,
                is_int(self.calibration_batch_size) and self.calibration_batch_size > 0, "an integer > 0")


@dataclass
class RunContext:
    """What hooks may read, resolved once from the run's config (methods never read the raw config).

    `target_modules`: the backbone's adapted module names; `max_length`: the sequence cap of every
    encoded example (`train.max_length`, else `backbone.max_length`); `chat_template`: whether prompts
    go through the tokenizer's chat template; `backbone_key`: the identity of the weights (cache keys);
    `dtype`: the backbone's dtype name; `cache_dir`: the reference-cache folder as evaluation resolves
    it (disk caches of method statistics live next to it); `progress`: show progress bars; `batch_size`: the
    sequences per training micro-batch (`train.batch_size`, else the backbone's; None outside a run).
    """

    tokenizer: Any
    benchmark: Any
    run_dir: Path
    device: torch.device = torch.device("cpu")
    seed: int = 0
    target_modules: list[str] = field(default_factory=list)
    max_length: int = 512
    chat_template: bool = False
    backbone_key: str = ""
    dtype: str = "float32"
    cache_dir: Optional[Path] = None
    progress: bool = True
    reference_fn: Optional[Callable[[], Any]] = None
    step: int = 0
    batch_size: Optional[int] = None
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
    """Base class: a method that trains whatever `prepare` leaves trainable, with no extra terms.

    It owns what every method shares: its `params`, the cost bookkeeping (`timed`, `costs`), the
    target modules of a run (`resolve_targets`), per-run statistics saved in the run folder
    (`run_statistics`), and an `export` / `load_export` pair (trainable tensors + params by default).
    """

    Params: ClassVar[type[MethodParams]] = MethodParams
    trains: ClassVar[bool] = True
    #: Whether `load_export` reproduces the trained model bit for bit (False where the export is a
    #: converted update, equal up to float rounding).
    exact_export: ClassVar[bool] = True
    #: Files `prepare` saves in the run folder and loads, bit for bit, instead of building again on a later attempt of
    #: the run (an atlas, a basis, a decomposition): what a run that resumes another run's training copies along with
    #: its checkpoint (`experiments.reuse`).
    run_files: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: MethodParams) -> None:
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes {self.Params.__name__}, not {type(params).__name__}")
        self.params = params
        self.name = params.name
        self._costs: dict = {}

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

    # -- shared prepare steps ----------------------------------------------------------------------
    def resolve_targets(self, model: torch.nn.Module, ctx: RunContext) -> list[str]:
        """The module names this run adapts (`method.target_modules`, else the backbone's), checked on `model`."""
        return self.check_model(model, list(ctx.target_modules))

    def check_model(self, model: torch.nn.Module, backbone_targets: list[str]) -> list[str]:
        """The module names this run adapts (`method.target_modules`, else `backbone_targets`), checked on `model`, a
        loaded or a weightless (meta-device) one: each names a Linear, and the shapes allow the hyperparameters
        (`check_shapes`)."""
        targets = list(getattr(self.params, "target_modules", None) or backbone_targets)
        check_target_modules(model, targets, key="method.target_modules")
        self.check_shapes(model, targets)
        return targets

    def check_shapes(self, model: torch.nn.Module, targets: list[str]) -> None:
        """Raise `MethodConfigError` for a hyperparameter the shapes of `model`'s `targets` rule out (none here)."""

    @contextmanager
    def timed(self, cost: str) -> Iterator[None]:
        """Add the seconds the block takes to the cost `cost` (reported in the record's `cost`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._costs[cost] = self._costs.get(cost, 0.0) + time.perf_counter() - t0

    def run_statistics(self, ctx: RunContext, filename: str, build: Callable[[], tuple[dict, dict]],
                       seconds_cost: str, reused_cost: str) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
        """Per-site tensors of this run: loaded from `<run_dir>/<filename>` when an earlier attempt saved
        them (a resumed run reuses them bit for bit), else built by `build` and saved. The seconds go to
        the cost `seconds_cost`, whether they were reused to `reused_cost`."""
        def build_logged() -> tuple[dict, dict]:
            with timed_phase(logging.getLogger("suite.train"), f"{self.name}: building {filename}"):
                return build()

        with self.timed(seconds_cost):
            tensors, sites, loaded = load_or_build_site_tensors(Path(ctx.run_dir) / filename, build_logged)
        self._costs[reused_cost] = loaded
        return tensors, sites

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

    def write_params(self, out_dir: Path) -> None:
        """`<out_dir>/method.json`: the method's class and hyperparameters, what `load_export` rebuilds it from."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        target = f"{type(self).__module__}.{type(self).__qualname__}"
        (out_dir / PARAMS_FILE).write_text(json.dumps({"_target_": target, **self.describe()}, indent=2) + "\n")

    @classmethod
    def read_params(cls, export_dir: Path) -> MethodParams:
        """The hyperparameters `write_params` stored in `export_dir`; a field added to the method after the export
        was written takes the value the method had before it (`Params.EXPORT_DEFAULTS`)."""
        stored = json.loads((Path(export_dir) / PARAMS_FILE).read_text())
        stored.pop("_target_", None)
        return cls.Params(**{**getattr(cls.Params, "EXPORT_DEFAULTS", {}), **stored})

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save the trainable tensors and the params into `out_dir`; return the stored tensor bytes."""
        self.write_params(out_dir)
        state = {n: t.contiguous() for n, t in self.state_dict(model).items()}
        if not state:
            return 0
        return save_tensors(Path(out_dir) / STATE_FILE, state)

    @classmethod
    def load_export(cls, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """A freshly loaded base `model` turned into the exported method's trained model (mirrors `export`)."""
        method = cls(cls.read_params(export_dir))
        path = Path(export_dir) / STATE_FILE
        if path.is_file():
            method.load_state_dict(model, load_tensors(path)[0])
        return model

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Post-hoc interpolation toward the base: the method's update is multiplied by `alpha`."""
        raise NotImplementedError(f"method {self.name!r} has no post-hoc scale")

    def costs(self) -> dict:
        """Method-specific costs for the record (e.g. atlas bytes, build seconds); merged into `cost`."""
        return dict(self._costs)

    def diagnostics(self, model: torch.nn.Module, ctx: RunContext) -> dict:
        """What the method's mechanism did on held-out data, for the record's `diagnostics` (none by default)."""
        return {}

    def describe(self) -> dict:
        """Name and hyperparameters, for the result record."""
        return dataclasses.asdict(self.params)


class BaseMethod(Method):
    """No training: the frozen backbone, evaluated exactly like every trained method."""

    trains = False

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """The base has no update: every scale gives the base."""


def require_rank_fits(model: torch.nn.Module, targets: list[str], rank: int, key: str = "rank") -> None:
    """Refuse `method.<key>=rank` above the width of an adapted layer, the smaller of its in and out features: an
    update `B A` of that layer has at most that rank, and the extra rows would only cost memory."""
    widths = [(min(m.in_features, m.out_features), name, m) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    if widths:
        width, name, layer = min(widths, key=lambda w: w[0])
        require(key, rank, rank <= width, f"at most {width}, the width of the adapted layer {name} "
                f"({layer.in_features} in, {layer.out_features} out)")


def method_class(target: str) -> type[Method]:
    """The Method subclass a `_target_` names (MethodConfigError when it cannot be imported or is not one)."""
    try:
        cls = get_class(target)
    except Exception as exc:
        raise validation.not_allowed("method._target_", target, f"an importable class ({exc})",
                                     MethodConfigError) from None
    require("_target_", target, isinstance(cls, type) and issubclass(cls, Method),
            "a subclass of experiments.methods.Method")
    return cls


def required_scales(typed: Any) -> list[float]:
    """The post-hoc scales (eval.scales besides 1.0) that need a record of their own: none for a
    method that does not train (the base model is the same at every scale)."""
    try:
        trains = method_class(typed.method._target_).trains
    except MethodConfigError:
        trains = True  # build_method reports an unimportable target with its own message
    return records.extra_scales(typed.eval.scales) if trains else []


def required_refinement(typed: Any) -> Optional[dict]:
    """The settings of the scale refinement (`eval.refine_scales`, `experiments.scale_refinement.settings`) a complete
    run must have run, for `records.is_complete`: None when it is off, or when there are no post-hoc scales to refine
    between (the method does not train, or `eval.scales` has no scale besides 1)."""
    refine = typed.eval.refine_scales
    if refine is None or refine.max_evals == 0 or not required_scales(typed):
        return None
    return scale_refinement.settings(refine.max_gap, refine.max_evals)


def param_names(cls: type[Method]) -> list[str]:
    """The hyperparameters `cls` takes (the fields of its `Params`), in declaration order."""
    return [f.name for f in dataclasses.fields(cls.Params)]


def build_params(cls: type[Method], values: dict) -> MethodParams:
    """`cls.Params` from a mapping of hyperparameters: unknown or missing keys and rejected values raise
    `MethodConfigError` naming the key and what is allowed."""
    allowed = param_names(cls)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        require(unknown[0], values[unknown[0]], False,
                f"a parameter of {cls.__module__}.{cls.__qualname__}, one of {sorted(allowed)}")
    missing = [k for k in allowed if k not in values]
    if missing:
        require(missing[0], validation.MISSING_VALUE, False,
                f"a value; {cls.__qualname__} needs {allowed} (values live in conf/method/<name>.yaml)")
    validation.require_finite(values, "method", MethodConfigError)
    return cls.Params(**values)


def hyperparameters(method_cfg: Any) -> tuple[str, dict]:
    """The `_target_` of a method config (a DictConfig or mapping) and its hyperparameter values: every key but
    `registry.NOT_HYPERPARAMETERS` (the display block is how analysis shows the method)."""
    cfg = OmegaConf.to_container(method_cfg, resolve=True) if isinstance(method_cfg, DictConfig) else dict(method_cfg)
    if "_target_" not in cfg:
        raise MethodConfigError(f"method={cfg!r:.120} is not allowed: a method config with `_target_` and `name` "
                                "(see conf/method/)")
    return cfg["_target_"], {k: v for k, v in cfg.items() if k not in registry.NOT_HYPERPARAMETERS}


def build_method(method_cfg: Any) -> Method:
    """Instantiate the method a `conf/method/*.yaml` names through its `_target_`."""
    target, values = hyperparameters(method_cfg)
    cls = method_class(target)
    return cls(build_params(cls, values))


def build_named(option: str, **overrides: Any) -> Method:
    """The registered method `conf/method/<option>.yaml` configures, with hyperparameter overrides."""
    spec = registry.methods().get(option)
    if spec is None:
        raise MethodConfigError(f"method={option!r} is not allowed: one of {registry.method_names()}")
    return build_method({"_target_": spec.target, **spec.values, **overrides})
