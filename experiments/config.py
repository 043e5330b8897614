"""Structured schema of the run config and its validation (before any compute).

Hydra composes YAML from `conf/`; `validate_config` merges it onto these dataclasses (types are
checked by OmegaConf) and then checks ranges and cross-field rules. Every error is one `ConfigError`
line, `<key>=<value> is not allowed: <what is>` (`experiments.validation`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from experiments.evaluation.config import EvalConfig
from experiments.methods import build_params, hyperparameters, method_class
from experiments.rerun import resolve_commit
from experiments.validation import (
    MISSING_VALUE,
    is_int,
    not_allowed,
    require,
    require_finite,
)
from suite_schema import registry

DTYPES = ("float32", "bfloat16", "float16")
SCHEDULERS = ("constant", "linear", "cosine")
LOGGERS = ("none", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
DATA_KINDS = ("math", "choice", "code_problem", "code_instruction")
BENCHMARK_SPLITS = ("dev", "test")
HOLDOUT_PARTS = ("dev", "rest")
RETAINED_KINDS = ("math", "choice")
#: What `seed` may be: the seeds numpy's global generator takes (torch's and Python's take these and more).
SEED_RANGE = (0, 2**32 - 1)


def train_config(name: str = "default", **overrides: Any) -> "TrainConfig":
    """A `TrainConfig` with the values of conf/train/<name>.yaml and `overrides` (not validated)."""
    return TrainConfig(**{**registry.group_values("train", name), **overrides})


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
class FarSpec:
    """The *far* items of a retained domain (read from the domain's own data): questions in templates, phrasings,
    facts or relations its calibration split never uses. Evaluated only, on `dev` or `evaluation` (test) as the run's
    split; no method reads them."""

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
    # Far items per retained domain (null: none, the earlier micro world and the real datasets): evaluated next to
    # each domain's own (near) evaluation split, recorded as `metrics.retained_far`.
    far: Optional[Dict[str, FarSpec]] = None


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
    group: Optional[str] = None  # None: derived (experiments.logger.wandb_group)
    job_type: Optional[str] = None  # None: the method's name


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


def _positive(key: str, value: Any) -> None:
    require(key, value, value is None or value > 0, "a number > 0")


def structured(cfg: Any) -> DictConfig:
    """Merge `cfg` (a DictConfig or its resolved container) onto the schema; type errors become `ConfigError`
    naming key and value."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data.pop("hydra", None)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RunConfig), data)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        reason = str(getattr(exc, "msg", None) or exc).splitlines()[0]
        if isinstance(exc, ConfigKeyError):
            parent = key.rsplit(".", 1)[0] if "." in key else "the config"
            reason = f"a key of {parent} ({reason})"
        raise not_allowed(key, _value_at(data, key), reason) from None
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        group = missing[0].split(".")[0]
        where = f"the YAML of its group (conf/{group}/)" if (registry.CONF / group).is_dir() else "conf/config.yaml"
        raise not_allowed(missing[0], MISSING_VALUE, f"a value: every key has its value in {where} or on the command "
                          f"line ({missing[0]}=...)")
    return typed


def _value_at(data: Any, dotted: str) -> Any:
    """The value at `dotted` (`a.b[0].c`) in a plain mapping, or `???` where the path does not lead to one."""
    node = data
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return MISSING_VALUE
    return node


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
    require_finite(data)
    lo, hi = SEED_RANGE
    require("seed", typed.seed, is_int(typed.seed) and lo <= typed.seed <= hi,
            f"an integer in [{lo}, {hi}] (the seeds numpy takes)")
    method = typed.method
    require("method", method, isinstance(method, DictConfig) and "name" in method,
            "a method config with `_target_` and `name` (see conf/method/)")
    target, values = hyperparameters(method)
    build_params(method_class(target), values)  # every hyperparameter checked now, before any job is launched

    bb = typed.backbone
    require("backbone.dtype", bb.dtype, bb.dtype in DTYPES, f"one of {list(DTYPES)}")
    for key in ("train_batch_size", "grad_accum", "eval_batch_size", "max_length"):
        _positive(f"backbone.{key}", bb[key])

    tr = typed.train
    require("train.lr", tr.lr, tr.lr >= 0, "a number >= 0")
    require("train.weight_decay", tr.weight_decay, tr.weight_decay >= 0, "a number >= 0")
    require("train.max_grad_norm", tr.max_grad_norm, tr.max_grad_norm >= 0, "a number >= 0 (0 = no clipping)")
    require("train.steps", tr.steps, tr.steps >= 0, "an integer >= 0")
    require("train.scheduler", tr.scheduler, tr.scheduler in SCHEDULERS, f"one of {list(SCHEDULERS)}")
    for key in ("batch_size", "grad_accum", "max_length", "checkpoint_every", "keep_checkpoints", "log_every", "num_threads",
                "length_groups"):
        _positive(f"train.{key}", tr[key])
    require("train.warmup_steps", tr.warmup_steps, tr.warmup_steps >= 0, "an integer >= 0")

    if typed.rerun_before is not None:
        require("rerun_before", typed.rerun_before, resolve_commit(str(typed.rerun_before)) is not None,
                "a commit of this checkout (a sha, tag or branch git can resolve)")
    for i, root in enumerate(typed.reuse_training_from):
        require(f"reuse_training_from[{i}]", root, Path(str(root)).is_dir(),
                "a folder: the run root of finished runs (e.g. the dev sweep's)")

    lg = typed.logger
    require("logger.kind", lg.kind, lg.kind in LOGGERS, f"one of {list(LOGGERS)}")
    if lg.kind == "wandb":
        require("logger.mode", lg.mode, lg.mode in WANDB_MODES, f"one of {list(WANDB_MODES)}")
        require("logger.project", lg.project, bool(lg.project), "a W&B project name")
        for key in ("group", "job_type"):  # W&B allows at most 128 characters for either
            require(f"logger.{key}", lg[key], lg[key] is None or 0 < len(lg[key]) <= 128,
                    "null (derived) or a name of 1 to 128 characters")

    bm = typed.benchmark
    require("benchmark.split", bm.split, bm.split in BENCHMARK_SPLITS, f"one of {list(BENCHMARK_SPLITS)}")
    specs = [("benchmark.target.train", bm.target.train)]
    specs += [(f"benchmark.target.evaluation.{k}", v) for k, v in bm.target.evaluation.items()]
    specs += [(f"benchmark.target.dev.{k}", v) for k, v in bm.target.dev.items()]
    specs += [(f"benchmark.retained.{k}", v) for k, v in bm.retained.items()]
    for key, spec in specs:
        require(f"{key}.kind", spec.kind, spec.kind in DATA_KINDS, f"one of {list(DATA_KINDS)}")
        require(f"{key}.local", spec.local, bool(spec.hub or spec.local), "a local path, or a hub id in `hub`")
    require("benchmark.target.train.kind", bm.target.train.kind, bm.target.train.kind == "code_instruction",
            "code_instruction")
    require("benchmark.target.evaluation", {}, bool(bm.target.evaluation), "at least one evaluation suite")
    require("benchmark.target.dev", {}, bm.split != "dev" or bool(bm.target.dev),
            "at least one dev suite when benchmark.split=dev")
    split_specs = [("benchmark.target.train", bm.target.train)]
    split_specs += [(f"benchmark.target.{part}.{k}", v) for part in ("evaluation", "dev")
                    for k, v in bm.target[part].items()]
    for name, spec in bm.retained.items():
        require(f"benchmark.retained.{name}.kind", spec.kind, spec.kind in RETAINED_KINDS,
                f"one of {list(RETAINED_KINDS)}")
        require(f"benchmark.retained.{name}.dev", None, bm.split != "dev" or spec.dev is not None,
                "a dev split spec when benchmark.split=dev")
        split_specs += [(f"benchmark.retained.{name}.{part}", spec[part]) for part in ("calibration", "evaluation", "dev")
                        if spec[part] is not None]
    for name, spec in (bm.far or {}).items():
        require(f"benchmark.far.{name}", name, name in bm.retained,
                f"a retained domain, one of {sorted(bm.retained)}")
        require(f"benchmark.far.{name}.dev", None, bm.split != "dev" or spec.dev is not None,
                "a dev split spec when benchmark.split=dev")
        split_specs += [(f"benchmark.far.{name}.{part}", spec[part]) for part in ("evaluation", "dev")
                        if spec[part] is not None]
    for key, spec in split_specs:
        _positive(f"{key}.max_items", spec.max_items)
        require(f"{key}.holdout", spec.holdout, spec.holdout is None or spec.holdout in HOLDOUT_PARTS,
                f"null or one of {list(HOLDOUT_PARTS)}")
        id_range = None if spec.id_range is None else list(spec.id_range)
        require(f"{key}.id_range", id_range, id_range is None or (len(id_range) == 2 and id_range[0] <= id_range[1]),
                "null or [lo, hi] with lo <= hi")
    if bm.protect is not None:
        protect = list(bm.protect)
        require("benchmark.protect", protect, bool(protect) and set(protect) <= set(bm.retained)
                and len(set(protect)) == len(protect),
                f"null or a non-empty list of distinct retained domains from {sorted(bm.retained)}")
    OmegaConf.to_object(typed.eval).validate()
    return typed
