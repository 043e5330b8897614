"""Every knob of one evaluation (the `eval` config group), as an OmegaConf-compatible structured config.

Only simple types, lists and `Optional` are used, so `OmegaConf.structured(EvalConfig)` works and
Hydra can compose it. `validate()` runs before any compute and raises `ConfigError` naming the
key, the offending value and what is allowed (`experiments.validation`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from experiments.validation import is_int, is_number, require
from sandbox.types import SandboxLimits
from suite_schema import registry

DEFAULT_CACHE_SUBDIR = Path(".cache") / "atlas-suite" / "reference"
CACHE_ENV = "ATLAS_CACHE_DIR"
LOGPROB_DTYPES = ("float16", "float32")


@dataclass
class ScaleRefinement:
    """`eval.refine_scales`: after the fixed post-hoc scales, bisect the adjacent pair of measured scales whose pass@1
    (share of problems solved) differs most, while that gap exceeds `max_gap`, for at most `max_evals` more
    evaluations of the trained run (`experiments.scale_refinement`)."""

    max_gap: float = MISSING  # pass@1 gap (share of problems) between adjacent measured scales still accepted
    max_evals: int = MISSING  # at most this many refined scales per trained run, one evaluation each; 0 = off


@dataclass
class EvalConfig:
    """Evaluation settings; values live in conf/eval/*.yaml (micro.yaml holds every key), meanings in
    docs/evaluation.md. Built from a composed config (`as_eval_config`) and validated once, in
    `experiments.config.validate_config`."""

    # Batch sizes (prompts per `generate` call, sequences per teacher-forced forward).
    generation_batch_size: int = MISSING
    scoring_batch_size: int = MISSING

    # Longest response generated, per kind of prompt.
    max_new_tokens_math: int = MISSING
    max_new_tokens_choice: int = MISSING
    max_new_tokens_code: int = MISSING

    # Reference decoding: the base responses that retained KL is teacher-forced on.
    # Sampled at `reference_temperature` (1.0 = the base's own distribution) with `reference_seed`;
    # `reference_sampling: false` uses greedy responses instead.
    reference_sampling: bool = MISSING
    reference_temperature: float = MISSING
    reference_seed: int = MISSING

    # Base log-probabilities in the cache, per split (calibration, evaluation): the full vocabulary when
    # vocab x the split's response tokens x bytes(logprob_dtype) fits half of `logprob_budget_mb`, else the base's
    # `top_k` log-probs + indices + one tail bucket.
    logprob_budget_mb: float = MISSING
    logprob_dtype: str = MISSING
    top_k: int = MISSING

    # Target (code) evaluation: pass@1 from the greedy completion; pass@k for k > 1 from
    # `n_samples` completions sampled at `sample_temperature` / `sample_top_p` with `sample_seed`.
    pass_k: List[int] = MISSING
    n_samples: int = MISSING
    sample_temperature: float = MISSING
    sample_top_p: float = MISSING
    sample_seed: int = MISSING
    max_target_problems: Optional[int] = MISSING

    # Post-hoc interpolation toward the base (WiSE-FT): a trained run is also evaluated at these
    # scales alpha of its update, W0 + alpha * Delta, one record each (1.0 is the run's own record).
    # Not part of the run id: adding scales to a finished run evaluates only the missing ones.
    scales: List[float] = MISSING
    # Dense fronts after the fixed scales: more scales bisecting the widest pass@1 gaps (`ScaleRefinement`), each a
    # record of its own; null = off. Not part of the run id either.
    refine_scales: Optional[ScaleRefinement] = MISSING

    # Sandbox limits for every generated program (see the `sandbox` package).
    sandbox_timeout_s: float = MISSING  # wall-clock limit per program
    sandbox_cpu_seconds: int = MISSING
    sandbox_memory_mb: int = MISSING
    sandbox_file_size_mb: int = MISSING
    sandbox_max_output_bytes: int = MISSING
    sandbox_max_processes: int = MISSING
    sandbox_network: bool = MISSING
    sandbox_workers: int = MISSING

    # Optional lm-evaluation-harness deltas. Task names `atlas_<domain>` are local tasks over the
    # benchmark's own retained evaluation items; any other name is an lm-eval (hub) task.
    lm_eval_tasks: List[str] = MISSING
    lm_eval_limit: Optional[int] = MISSING
    lm_eval_batch_size: int = MISSING
    lm_eval_include_path: Optional[str] = MISSING

    # Reference cache folder; null = $ATLAS_CACHE_DIR, else ~/.cache/atlas-suite/reference.
    cache_dir: Optional[str] = MISSING
    # First N items of each retained split (calibration and evaluation); null = all.
    max_items_per_domain: Optional[int] = MISSING

    def __post_init__(self) -> None:
        if isinstance(self.refine_scales, Mapping):  # a plain mapping (a group's YAML values, a record's config)
            allowed = {f.name for f in fields(ScaleRefinement)}
            for key, value in self.refine_scales.items():
                _require(f"refine_scales.{key}", value, key in allowed,
                         f"a key of eval.refine_scales, one of {sorted(allowed)}")
            self.refine_scales = ScaleRefinement(**self.refine_scales)

    @classmethod
    def from_group(cls, name: str = "micro", **overrides: Any) -> "EvalConfig":
        """The values of conf/eval/<name>.yaml with `overrides` (not validated: call `validate()`)."""
        return cls(**{**registry.group_values("eval", name), **overrides})

    def validate(self) -> "EvalConfig":
        """Raise `ConfigError` (a `ValueError`) on the first value that is not allowed; return self when all are."""
        for name in (
            "generation_batch_size",
            "scoring_batch_size",
            "max_new_tokens_math",
            "max_new_tokens_choice",
            "max_new_tokens_code",
            "top_k",
            "n_samples",
            "sandbox_cpu_seconds",
            "sandbox_memory_mb",
            "sandbox_file_size_mb",
            "sandbox_max_output_bytes",
            "sandbox_max_processes",
            "sandbox_workers",
            "lm_eval_batch_size",
        ):
            value = getattr(self, name)
            _require(name, value, is_int(value) and value >= 1, "an integer >= 1")
        for name in ("reference_seed", "sample_seed"):
            _require(name, getattr(self, name), is_int(getattr(self, name)), "an integer")
        for name in ("reference_sampling", "sandbox_network"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool), "true or false")
        for name in ("reference_temperature", "sample_temperature", "logprob_budget_mb", "sandbox_timeout_s"):
            value = getattr(self, name)
            _require(name, value, is_number(value) and value > 0, "a finite number > 0")
        top_p = self.sample_top_p
        _require("sample_top_p", top_p, is_number(top_p) and 0.0 < top_p <= 1.0, "a number in (0, 1]")
        _require("logprob_dtype", self.logprob_dtype, self.logprob_dtype in LOGPROB_DTYPES,
                 f"one of {list(LOGPROB_DTYPES)}")
        pass_k = list(self.pass_k)
        _require("pass_k", pass_k, bool(pass_k) and all(is_int(k) and k >= 1 for k in pass_k),
                 "a non-empty list of integers >= 1")
        _require("pass_k", pass_k, len(set(pass_k)) == len(pass_k), "distinct values")
        _require("n_samples", self.n_samples, max(pass_k) == 1 or self.n_samples >= max(pass_k),
                 f"an integer >= max(pass_k) = {max(pass_k)}")
        for name in ("max_target_problems", "max_items_per_domain", "lm_eval_limit"):
            value = getattr(self, name)
            _require(name, value, value is None or (is_int(value) and value >= 1), "null or an integer >= 1")
        scales = list(self.scales)
        _require("scales", scales, bool(scales) and len(set(scales)) == len(scales)
                 and all(is_number(a) and 0.0 <= a <= 10.0 for a in scales),
                 "a non-empty list of distinct numbers in [0, 10]")
        refine = self.refine_scales
        _require("refine_scales", refine, refine is None or isinstance(refine, ScaleRefinement),
                 "null or a mapping with max_gap and max_evals")
        if refine is not None:
            _require("refine_scales.max_gap", refine.max_gap,
                     is_number(refine.max_gap) and 0.0 < refine.max_gap <= 1.0, "a number in (0, 1] (a pass@1 gap)")
            _require("refine_scales.max_evals", refine.max_evals, is_int(refine.max_evals) and refine.max_evals >= 0,
                     "an integer >= 0 (0 = no refinement)")
        tasks = list(self.lm_eval_tasks)
        _require("lm_eval_tasks", tasks, all(isinstance(t, str) and t.strip() for t in tasks),
                 "a list of non-empty task names")
        for name in ("cache_dir", "lm_eval_include_path"):
            value = getattr(self, name)
            _require(name, value, value is None or (isinstance(value, str) and bool(value.strip())),
                     "null or a non-empty path string")
        return self

    def refinement(self) -> Optional[ScaleRefinement]:
        """The scale refinement asked for, or None when it is off (`refine_scales` null or `max_evals` 0)."""
        refine = self.refine_scales
        return refine if refine is not None and refine.max_evals > 0 else None

    def max_new_tokens(self, kind: str) -> int:
        """The generation length cap for prompts of kind `math`, `choice` or `code`."""
        try:
            return {
                "math": self.max_new_tokens_math,
                "choice": self.max_new_tokens_choice,
                "code": self.max_new_tokens_code,
            }[kind]
        except KeyError:
            raise ValueError(f"kind={kind!r} is not allowed: one of math, choice, code") from None

    def sandbox_limits(self) -> SandboxLimits:
        """The `SandboxLimits` every generated program runs under."""
        return SandboxLimits(
            wall_seconds=float(self.sandbox_timeout_s),
            cpu_seconds=int(self.sandbox_cpu_seconds),
            memory_mb=int(self.sandbox_memory_mb),
            file_size_mb=int(self.sandbox_file_size_mb),
            max_output_bytes=int(self.sandbox_max_output_bytes),
            max_processes=int(self.sandbox_max_processes),
            network=bool(self.sandbox_network),
        )

    def resolved_cache_dir(self) -> Path:
        """The reference cache folder: `cache_dir`, else $ATLAS_CACHE_DIR, else ~/.cache/atlas-suite/reference."""
        return resolve_cache_dir(self.cache_dir)


def resolve_cache_dir(cache_dir: Optional[str]) -> Path:
    """`cache_dir` if set, else $ATLAS_CACHE_DIR if set, else ~/.cache/atlas-suite/reference."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / DEFAULT_CACHE_SUBDIR


def as_eval_config(cfg: Any) -> EvalConfig:
    """An `EvalConfig` from an `EvalConfig`, an OmegaConf node or a plain mapping (unknown keys rejected)."""
    if isinstance(cfg, EvalConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    allowed = {f.name for f in fields(EvalConfig)}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        _require(unknown[0], cfg[unknown[0]], False, f"a key of the eval config, one of {sorted(allowed)}")
    return EvalConfig(**dict(cfg))


def require_eval_config(cfg: Any) -> EvalConfig:
    """`cfg` when it is an `EvalConfig`; evaluation takes a config validated once, where it was made
    (`experiments.config.validate_config`, or `EvalConfig(...).validate()`)."""
    if not isinstance(cfg, EvalConfig):
        raise TypeError(f"evaluation takes an EvalConfig (as_eval_config(...).validate()), not {type(cfg).__name__}")
    return cfg


def _require(name: str, value: Any, ok: bool, allowed: str) -> None:
    require(f"eval.{name}", value, ok, allowed)
