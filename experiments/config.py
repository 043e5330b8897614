"""Structured schema of the run config and its validation (before any compute).

Hydra composes YAML from `conf/`; `validate_config` merges it onto these dataclasses (types are
checked by OmegaConf) and then checks ranges and cross-field rules. Every error is one line that
names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.evaluation.config import EvalConfig

DTYPES = ("float32", "bfloat16", "float16")
SCHEDULERS = ("constant", "linear", "cosine")
LOGGERS = ("none", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
DATA_KINDS = ("math", "choice", "code_problem", "code_instruction")
BENCHMARK_SPLITS = ("dev", "test")
HOLDOUT_PARTS = ("dev", "rest")
RETAINED_KINDS = ("math", "choice")


CONF = Path(__file__).resolve().parents[1] / "conf"


def group_values(group: str, name: str) -> dict:
    """The values of `conf/<group>/<name>.yaml` over those of the same-group files its `defaults` list names
    (as Hydra composes them), outside a Hydra run: what tests, benchmarks and tools start from."""
    path = CONF / group / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        raise ConfigError(f"{group}={name!r} is not allowed: one of {options}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    out: dict = {}
    for parent in raw.pop("defaults", []):
        if isinstance(parent, str) and parent != "_self_":
            out.update(group_values(group, parent))
    out.update(raw)
    return out


def train_config(name: str = "default", **overrides: Any) -> "TrainConfig":
    """A `TrainConfig` with the values of conf/train/<name>.yaml and `overrides`."""
    return TrainConfig(**{**group_values("train", name), **overrides})


class ConfigError(ValueError):
    """A config value is not allowed; the message names key, value and what is allowed."""


@dataclass
class SplitSpec:
    """One split of a dataset and which of its items to keep.

    `holdout: dev` keeps only the split's fixed held-out tenth, `holdout: rest` everything else
    (`experiments.data.benchmark.in_holdout`: a dev split carved from a training set);
    `id_range: [lo, hi]` keeps items whose numeric task id is in lo..hi (MBPP's official splits
    are id ranges); `max_items` then takes a seeded subset (null = all).
    """

    split: str = MISSING
    max_items: Optional[int] = None
    holdout: Optional[str] = None
    id_range: Optional[List[int]] = None


@dataclass
class DatasetSpec:
    """Where a dataset lives: a hub id and/or a local path (relative to `benchmark.data_root` or the repo)."""

    kind: str = MISSING
    hub: Optional[str] = None
    hub_config: Optional[str] = None
    local: Optional[str] = None
    files: Dict[str, str] = field(default_factory=dict)


@dataclass
class TargetSplitSpec(DatasetSpec):
    """A target dataset and the split used from it (`holdout`, `id_range`: as in `SplitSpec`)."""

    split: str = MISSING
    max_items: Optional[int] = None
    holdout: Optional[str] = None
    id_range: Optional[List[int]] = None


@dataclass
class TargetSpec:
    """Target training data and the target evaluation suites (name -> problems): `evaluation` on
    the test split, `dev` on the dev split."""

    train: TargetSplitSpec = MISSING
    evaluation: Dict[str, TargetSplitSpec] = field(default_factory=dict)
    dev: Dict[str, TargetSplitSpec] = field(default_factory=dict)


@dataclass
class RetainedSpec(DatasetSpec):
    """A retained domain: its data and the disjoint calibration, dev and evaluation (test) splits."""

    calibration: SplitSpec = MISSING
    evaluation: SplitSpec = MISSING
    dev: Optional[SplitSpec] = None


@dataclass
class BenchmarkConfig:
    """Which data a run trains and evaluates on."""

    name: str = MISSING
    data_root: Optional[str] = MISSING
    seed: int = MISSING
    # Which split a run evaluates on: `dev` for every choice (defaults, knob ranges, designs),
    # `test` (the evaluation split) once, for the final numbers.
    split: str = MISSING
    target: TargetSpec = MISSING
    retained: Dict[str, RetainedSpec] = MISSING
    # The retained domains whose calibration data the methods may use (null = all). Evaluation
    # always measures every retained domain, so a run protecting only math shows what happens
    # to the unprotected ones.
    protect: Optional[List[str]] = MISSING


@dataclass
class BackboneConfig:
    """A pretrained causal LM: where it loads from and how it is run."""

    name: str = MISSING
    path: str = MISSING  # hub id or local folder (relative paths resolve against the repo root)
    revision: Optional[str] = MISSING
    dtype: str = MISSING
    target_modules: List[str] = MISSING
    chat_template: bool = MISSING
    chat_template_kwargs: Dict[str, Any] = MISSING
    train_batch_size: int = MISSING
    grad_accum: int = MISSING
    eval_batch_size: int = MISSING
    max_length: int = MISSING
    gradient_checkpointing: bool = MISSING
    attn_implementation: Optional[str] = MISSING
    trust_remote_code: bool = MISSING
    shapes: Dict[str, int] = MISSING  # architecture sizes for weightless cost estimates


@dataclass
class TrainConfig:
    """The training loop's settings; values live in conf/train/*.yaml. `batch_size`, `grad_accum` and
    `max_length` may be null there (= the backbone's); `resolved_train` fills them in before `train()`."""

    steps: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    warmup_steps: int = MISSING
    scheduler: str = MISSING
    max_grad_norm: float = MISSING
    batch_size: Optional[int] = MISSING
    grad_accum: Optional[int] = MISSING
    max_length: Optional[int] = MISSING
    checkpoint_every: int = MISSING
    keep_checkpoints: int = MISSING
    log_every: int = MISSING
    progress: bool = MISSING
    num_threads: Optional[int] = MISSING
    length_groups: int = MISSING


@dataclass
class LoggerConfig:
    """Experiment logging: `none` or W&B (its settings in conf/logger/wandb.yaml)."""

    kind: str = MISSING
    project: Optional[str] = None
    entity: Optional[str] = None
    mode: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class RunConfig:
    """The whole composed config of one run."""

    method: Any = MISSING
    backbone: BackboneConfig = MISSING
    benchmark: BenchmarkConfig = MISSING
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    seed: int = MISSING
    run_root: str = MISSING
    rerun_before: Optional[str] = MISSING
    wait_if_running: bool = MISSING
    reuse_training_from: list[str] = MISSING
    hydra: Any = None
    experiment: Any = None


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _positive(key: str, value: Any) -> None:
    if value is not None and value <= 0:
        _fail(key, value, "must be > 0")


def structured(cfg: Any) -> DictConfig:
    """Merge `cfg` (a DictConfig or its resolved container) onto the schema; type errors become `ConfigError`
    naming key and value."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data.pop("hydra", None)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RunConfig), data)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(f"{key}: {exc.msg if hasattr(exc, 'msg') else exc}".splitlines()[0]) from None
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        group = missing[0].split(".")[0]
        raise ConfigError(f"{missing[0]}: no value; every key has its value in the YAML of its group "
                          f"(conf/{group}/) or on the command line ({missing[0]}=...)")
    return typed


#: Configs validated in this process, by their canonical JSON: a run's config is composed for its run
#: directory, by the sweep planner and by the job, and validated once.
_VALIDATED: dict[str, DictConfig] = {}
_VALIDATED_MAX = 256


def validate_config(cfg: DictConfig) -> DictConfig:
    """Return the typed config (read-only), or raise `ConfigError` for the first value that is not allowed."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data.pop("hydra", None)
    key = json.dumps(data, sort_keys=True, default=str)
    if key not in _VALIDATED:
        typed = _validate(data)
        OmegaConf.set_readonly(typed, True)
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.pop(next(iter(_VALIDATED)))
        _VALIDATED[key] = typed
    return _VALIDATED[key]


def resolved_train(typed: DictConfig) -> TrainConfig:
    """The run's `TrainConfig` with null batch size, accumulation and sequence cap taken from the backbone."""
    tr, bb = OmegaConf.to_object(typed.train), typed.backbone
    return dataclasses.replace(tr, batch_size=tr.batch_size or bb.train_batch_size,
                               grad_accum=tr.grad_accum or bb.grad_accum, max_length=tr.max_length or bb.max_length)


def eval_config(typed: DictConfig) -> EvalConfig:
    """The run's validated `EvalConfig` (validated in `validate_config`)."""
    return OmegaConf.to_object(typed.eval)


def _validate(data: dict) -> DictConfig:
    typed = structured(data)
    method = typed.method
    if not isinstance(method, DictConfig) or "_target_" not in method or "name" not in method:
        _fail("method", method, "a method config with `_target_` and `name` (see conf/method/)")
    from experiments.methods import DISPLAY_KEY, build_params, method_class

    values = OmegaConf.to_container(method, resolve=True)
    cls = method_class(values.pop("_target_"))
    values.pop(DISPLAY_KEY, None)
    build_params(cls, values)  # every hyperparameter checked now, before any job is launched

    bb = typed.backbone
    if bb.dtype not in DTYPES:
        _fail("backbone.dtype", bb.dtype, f"one of {list(DTYPES)}")
    for key in ("train_batch_size", "grad_accum", "eval_batch_size", "max_length"):
        _positive(f"backbone.{key}", bb[key])

    tr = typed.train
    if tr.lr < 0:
        _fail("train.lr", tr.lr, "must be >= 0")
    if tr.steps < 0:
        _fail("train.steps", tr.steps, "must be >= 0")
    if tr.scheduler not in SCHEDULERS:
        _fail("train.scheduler", tr.scheduler, f"one of {list(SCHEDULERS)}")
    for key in ("batch_size", "grad_accum", "max_length", "checkpoint_every", "keep_checkpoints", "log_every", "num_threads",
                "length_groups"):
        _positive(f"train.{key}", tr[key])
    if tr.warmup_steps < 0:
        _fail("train.warmup_steps", tr.warmup_steps, "must be >= 0")

    if typed.rerun_before is not None:
        from experiments.rerun import resolve_commit

        if resolve_commit(str(typed.rerun_before)) is None:
            _fail("rerun_before", typed.rerun_before, "a commit of this checkout (a sha, tag or branch git can resolve)")
    for i, root in enumerate(typed.reuse_training_from):
        if not Path(str(root)).is_dir():
            _fail(f"reuse_training_from[{i}]", root, "a folder: the run root of finished runs (e.g. the dev sweep's)")

    lg = typed.logger
    if lg.kind not in LOGGERS:
        _fail("logger.kind", lg.kind, f"one of {list(LOGGERS)}")
    if lg.kind == "wandb" and lg.mode not in WANDB_MODES:
        _fail("logger.mode", lg.mode, f"one of {list(WANDB_MODES)}")
    if lg.kind == "wandb" and not lg.project:
        _fail("logger.project", lg.project, "a W&B project name")

    bm = typed.benchmark
    if bm.split not in BENCHMARK_SPLITS:
        _fail("benchmark.split", bm.split, f"one of {list(BENCHMARK_SPLITS)}")
    specs = [("benchmark.target.train", bm.target.train)]
    specs += [(f"benchmark.target.evaluation.{k}", v) for k, v in bm.target.evaluation.items()]
    specs += [(f"benchmark.target.dev.{k}", v) for k, v in bm.target.dev.items()]
    specs += [(f"benchmark.retained.{k}", v) for k, v in bm.retained.items()]
    for key, spec in specs:
        if spec.kind not in DATA_KINDS:
            _fail(f"{key}.kind", spec.kind, f"one of {list(DATA_KINDS)}")
        if not spec.hub and not spec.local:
            _fail(f"{key}.local", spec.local, "a local path or a hub id (`hub`) is required")
    if bm.target.train.kind != "code_instruction":
        _fail("benchmark.target.train.kind", bm.target.train.kind, "code_instruction")
    if not bm.target.evaluation:
        _fail("benchmark.target.evaluation", {}, "at least one evaluation suite")
    if bm.split == "dev" and not bm.target.dev:
        _fail("benchmark.target.dev", {}, "at least one dev suite when benchmark.split=dev")
    split_specs = [("benchmark.target.train", bm.target.train)]
    split_specs += [(f"benchmark.target.{part}.{k}", v) for part in ("evaluation", "dev")
                    for k, v in bm.target[part].items()]
    for name, spec in bm.retained.items():
        if spec.kind not in RETAINED_KINDS:
            _fail(f"benchmark.retained.{name}.kind", spec.kind, f"one of {list(RETAINED_KINDS)}")
        if bm.split == "dev" and spec.dev is None:
            _fail(f"benchmark.retained.{name}.dev", None, "a dev split spec when benchmark.split=dev")
        split_specs += [(f"benchmark.retained.{name}.{part}", spec[part]) for part in ("calibration", "evaluation", "dev")
                        if spec[part] is not None]
    for key, spec in split_specs:
        _positive(f"{key}.max_items", spec.max_items)
        if spec.holdout is not None and spec.holdout not in HOLDOUT_PARTS:
            _fail(f"{key}.holdout", spec.holdout, f"null or one of {list(HOLDOUT_PARTS)}")
        if spec.id_range is not None and (len(spec.id_range) != 2 or spec.id_range[0] > spec.id_range[1]):
            _fail(f"{key}.id_range", list(spec.id_range), "null or [lo, hi] with lo <= hi")
    if bm.protect is not None:
        unknown = [d for d in bm.protect if d not in bm.retained]
        if unknown or not bm.protect or len(set(bm.protect)) != len(bm.protect):
            _fail("benchmark.protect", list(bm.protect),
                  f"null or a non-empty list of distinct retained domains from {sorted(bm.retained)}")
    try:
        OmegaConf.to_object(typed.eval).validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return typed
