"""One run, end to end: validate, skip if done, load, prepare the method, train, evaluate, record.

`run(cfg)` is what `run.py` calls for every job of a sweep. Everything that can be checked
cheaply (config values, method hyperparameters, data paths, target modules) is checked before
the backbone's weights are loaded or any training starts.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments import read_ledger, records, rerun, reuse, run_lock, scale_refinement
from experiments.backbones import (
    BackboneError,
    backbone_key,
    load_backbone,
    load_model,
    model_summary,
    peak_memory_bytes,
    preflight_backbone,
    require_available,
)
from experiments.calibration import encode_target_item
from experiments.config import eval_config, resolved_train, validate_config
from experiments.data.benchmark import Benchmark, build_benchmark
from experiments.data.loaders import DataError
from experiments.evaluation.evaluate import evaluate_run
from experiments.evaluation.reference_cache import get_reference
from experiments.failure import failure_guard, set_phase
from experiments.log import console, run_log, timed_phase
from experiments.run_summary import summary_lines
from experiments.logger import make_logger, run_name, wandb_group
from experiments.methods import (
    Method,
    MethodConfigError,
    RunContext,
    build_method,
    required_refinement,
    required_scales,
)
from experiments.prompts import apply_template, boundary_agrees, code_instruction_prompt, code_instruction_response
from experiments.run_dir import check_run_dir
from experiments.train import TrainResult, seed_everything, train
from experiments.validation import ConfigError
from sandbox import SandboxUnavailable, isolation_report
from suite_schema import layout, run_identity

log = logging.getLogger("suite.run")

# Errors that mean "this config cannot run (here)": one line, no traceback, exit code 2.
USER_ERRORS = (ConfigError, MethodConfigError, BackboneError, DataError, SandboxUnavailable)


def run_id_for(cfg: DictConfig) -> str:
    """The run id of a composed config (schema defaults filled in, presentation keys dropped)."""
    try:
        typed = validate_config(cfg)
        data = OmegaConf.to_container(typed, resolve=True)
    except USER_ERRORS:
        data = OmegaConf.to_container(cfg, resolve=True)
    return run_identity.run_id_of(data)


def resolve_run_dir(typed: DictConfig, run_id: str) -> Path:
    """The run directory: Hydra's job output dir when running under Hydra, else <run_root>/<run_id>. Raises
    `RunDirError` when Hydra's is neither <run_root>/<run_id> nor a folder holding this run's record
    (`experiments.run_dir`): a run writes and cleans only its own directory."""
    if HydraConfig.initialized():
        out = Path(HydraConfig.get().runtime.output_dir)
        check_run_dir(out, typed.run_root, run_id, "hydra.runtime.output_dir", out)
        return out
    return Path(typed.run_root) / run_id


#: How many training items `encode_target` checks against whole-text tokenisation.
BOUNDARY_CHECK_ITEMS = 64


def encode_target(benchmark: Benchmark, tokenizer: Any, chat_template: bool, max_length: int) -> list[dict]:
    """Encoded SFT examples (prompt + response, loss on the response) of the target training split."""
    items = list(benchmark.target_train)
    if not items:
        raise DataError("benchmark.target.train: the target training split is empty")
    out = [encode_target_item(tokenizer, item, chat_template, max_length) for item in items]
    checked = items[:BOUNDARY_CHECK_ITEMS]
    disagree = sum(not boundary_agrees(tokenizer, apply_template(tokenizer, code_instruction_prompt(item), chat_template),
                                       code_instruction_response(item)) for item in checked)
    if disagree:
        log.warning("warning: for %d of the first %d training items this tokenizer splits prompt + response "
                    "differently from the whole text (experiments.prompts.split_boundary); the model is prompted at "
                    "a token boundary its pretraining may not have had", disagree, len(checked))
    return out


def discard_rejected_run_dir() -> None:
    """Remove the run directory Hydra made for a run rejected before any work (one holding nothing but `.hydra/`),
    so a bad config leaves no folder behind for the report to count as a run."""
    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra: nothing was made
        return
    if out.is_dir() and {p.name for p in out.iterdir()} <= {".hydra"}:
        shutil.rmtree(out)


def run(cfg: DictConfig) -> dict:
    """Run (or skip) one job and return its result record."""
    console()
    records.code_version()  # the code this process imported, before anything can be committed meanwhile
    typed = validate_config(cfg)
    resolved = OmegaConf.to_container(typed, resolve=True)
    run_id = run_identity.run_id_of(resolved)
    run_dir = resolve_run_dir(typed, run_id)
    scales, refinement = required_scales(typed), required_refinement(typed)
    if records.is_complete(run_dir, run_id, scales, refinement) and not rerun.requested(typed.rerun_before, run_dir):
        return _skipped(run_id, run_dir, typed)

    method: Method = build_method(typed.method)
    require_available(typed.backbone)
    method.check_model(preflight_backbone(typed.backbone), list(typed.backbone.target_modules))
    benchmark = build_benchmark(typed.benchmark)
    # Every run scores coding solutions in the sandbox: a machine where it cannot run stops here, before training,
    # not after it (the probe's result is kept for the evaluation).
    isolation_report()
    with run_lock.hold(run_dir, wait=typed.wait_if_running):
        reason = rerun.requested(typed.rerun_before, run_dir)
        if reason:
            kept = rerun.supersede(run_dir)
            log.info("%s: %s (rerun_before=%s): running it again from scratch; the old records are in %s",
                     run_id, reason, typed.rerun_before, kept)
        elif records.is_complete(run_dir, run_id, scales, refinement):  # finished by the launch this one waited for
            return _skipped(run_id, run_dir, typed)
        return _launch(typed, resolved, run_id, run_dir, method, benchmark)


def _skipped(run_id: str, run_dir: Path, typed: DictConfig) -> dict:
    """A complete run: nothing to compute. With logger=wandb its record is logged to W&B unless its W&B run already
    holds it (`experiments.wandb_sync.log_finished`)."""
    log.info("%s: complete record in %s; skipped (nothing to do)", run_id, run_dir)
    if typed.logger.kind == "wandb":
        # here, not at the top: only logger=wandb needs it
        from experiments.wandb_sync import log_finished

        try:
            log.info("W&B: %s", log_finished(run_dir, typed.logger, wandb_group(typed.logger.group)))
        except Exception as exc:  # the run is complete either way; W&B being unreachable is no failure of it
            log.warning("W&B: %s: its record was not logged (%s: %s); `python -m experiments.wandb_sync %s` logs it",
                        run_id, type(exc).__name__, exc, run_dir)
    return records.read_record(run_dir)


def _launch(typed: DictConfig, resolved: dict, run_id: str, run_dir: Path, method: Method,
            benchmark: Benchmark) -> dict:
    """Write the run's log and record while the job loads, prepares, trains and evaluates (under the run's lock)."""
    with run_log(run_dir):
        for dom in benchmark.retained.values():
            if dom.dropped_calibration:
                log.info("%s: %d calibration items dropped (their question is in the dev or test split)",
                         dom.name, dom.dropped_calibration)
        _set_aside_unreadable(run_id, run_dir)
        _clear_a_killed_attempt(run_id, run_dir)
        started = datetime.now(timezone.utc)
        science = run_identity.scientific_config(resolved)
        base_record = {
            "schema_version": layout.SCHEMA_VERSION,
            "run_id": run_id,
            "status": layout.STATUS_RUNNING,
            "method": method.name,
            "backbone": typed.backbone.name,
            # dev runs carry the split in the benchmark label, so no table or plot ever pools them with test runs
            "benchmark": layout.benchmark_label(typed.benchmark.name, typed.benchmark.split),
            "split": typed.benchmark.split,
            "seed": typed.seed,
            "knobs": method.describe(),
            "config": science,
            "started": started.isoformat(),
            "process": {"host": socket.gethostname(), "pid": os.getpid()},
        }
        # The run's record from its first moment: `running`, with who runs it; whatever attempt came before
        # (an `interrupted` record naming a checkpoint since replaced) no longer speaks for the run.
        records.atomic_write_json(run_dir / layout.RECORD_NAME,
                                  {**base_record, "provenance": records.provenance(started)})
        name = run_name(method.name, typed.backbone.name, typed.seed, run_id)
        logger = make_logger(typed.logger, run_id, run_dir, science, name, job_type=method.name)
        job = Job(typed, run_id, run_dir, method, benchmark, logger, base_record, started)
        with failure_guard(run_dir, base_record, logger):
            return job.run()


def _set_aside_unreadable(run_id: str, run_dir: Path) -> None:
    """Under the run's lock: move aside each record file that is no record of this run instead of writing over it
    (`records.set_aside_unreadable`), one line each."""
    for moved, why in records.set_aside_unreadable(run_dir, run_id):
        log.warning("%s: %s is no record of this run (%s); moved aside to %s, running the run again", run_id,
                    moved.with_name(layout.RECORD_NAME), why, moved.name)


def _clear_a_killed_attempt(run_id: str, run_dir: Path) -> None:
    """Under the run's lock, no other process writes this run: a `running` record is what a killed attempt
    (SIGKILL, out of memory, a lost node) left, and its temporary files were never results. Say so and remove them."""
    previous = records.read_record(run_dir)
    if previous and previous.get("status") == layout.STATUS_RUNNING:
        proc = records.part(previous, "process")
        log.info("%s: the previous attempt (pid %s on %s, started %s) stopped without a record (killed?); starting "
                 "again", run_id, proc.get("pid", "?"), proc.get("host", "?"), previous.get("started", "?"))
    partial = records.partial_files(run_dir)
    for path in partial:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if partial:
        log.info("%s: removed %d partial file(s) a stopped writer left: %s", run_id, len(partial),
                 ", ".join(str(p.relative_to(run_dir)) for p in partial[:5]))


def run_context(typed: DictConfig, tokenizer: Any, benchmark: Benchmark, run_dir: Path,
                device: torch.device = torch.device("cpu"), reference_fn: Optional[Any] = None) -> RunContext:
    """The `RunContext` of a validated config: everything methods read, resolved once."""
    bb, train_cfg = typed.backbone, resolved_train(typed)
    return RunContext(tokenizer=tokenizer, benchmark=benchmark, run_dir=Path(run_dir), device=device, seed=typed.seed,
                      target_modules=list(bb.target_modules), max_length=train_cfg.max_length,
                      chat_template=bb.chat_template, backbone_key=backbone_key(bb), dtype=bb.dtype,
                      cache_dir=eval_config(typed).resolved_cache_dir(), progress=train_cfg.progress,
                      reference_fn=reference_fn, batch_size=train_cfg.batch_size)


@dataclass
class Job:
    """One run's pieces after validation: what `run` hands over to load, prepare, train, evaluate and record."""

    typed: DictConfig
    run_id: str
    run_dir: Path
    method: Method
    benchmark: Benchmark
    logger: Any
    base_record: dict
    started: datetime
    reused: Optional[dict] = None  # where this run's training came from (experiments.reuse), when not trained here

    def load_and_prepare(self) -> tuple[torch.nn.Module, RunContext, Any]:
        """Seed, load the backbone and apply the method (`prepare`): the model to train, its context, and the
        resolved training settings."""
        typed, method, bb = self.typed, self.method, self.typed.backbone
        train_cfg, self.eval_cfg = resolved_train(typed), eval_config(typed)
        if train_cfg.num_threads:
            torch.set_num_threads(train_cfg.num_threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        seed_everything(typed.seed)
        log.info("%s: %s on %s/%s, seed %d -> %s", self.run_id, method.name, bb.name, self.benchmark.name, typed.seed,
                 self.run_dir)

        set_phase("load")
        with timed_phase(log, f"loading the backbone {bb.name} ({bb.path})"):
            model, self.tokenizer = load_backbone(bb, self.device)
        if bb.gradient_checkpointing and method.trains:
            model.gradient_checkpointing_enable()
        self.key, self._base = backbone_key(bb), None
        ctx = run_context(typed, self.tokenizer, self.benchmark, self.run_dir, self.device, self.reference)
        set_phase("prepare")
        return method.prepare(model, ctx), ctx, train_cfg

    def run(self) -> dict:
        method, bb = self.method, self.typed.backbone
        steps = resolved_train(self.typed).steps if method.trains else 0
        # Before prepare: a reused training's statistics files must be in place for prepare to load them.
        self.reused = reuse.reuse_training([Path(str(r)) for r in self.typed.reuse_training_from],
                                           run_identity.training_id_of(OmegaConf.to_container(self.typed, resolve=True)),
                                           steps, self.run_dir, method.run_files, self.typed.rerun_before)
        model, ctx, train_cfg = self.load_and_prepare()
        summary = model_summary(model)

        result = None
        if method.trains and train_cfg.steps > 0:
            with timed_phase(log, f"encoding {len(self.benchmark.target_train)} training examples"):
                examples = encode_target(self.benchmark, self.tokenizer, bb.chat_template, train_cfg.max_length)
            set_phase("train")
            with timed_phase(log, f"training {method.name}: {train_cfg.steps} steps"):
                result = train(model, method, examples, ctx, train_cfg, log_fn=self.logger.log)
        set_phase("evaluate")
        with timed_phase(log, f"exporting the trained {method.name} to {self.run_dir / 'export'}"):
            stored_bytes = method.export(model, self.run_dir / "export")
        model.eval()
        self.diagnostics = method.diagnostics(model, ctx)  # at scale 1, before any post-hoc scale

        costs = {"summary": summary, "stored_bytes": stored_bytes, "result": result}
        scales = records.extra_scales(self.eval_cfg.scales) if method.trains else []
        todo = [a for a in scales if not records.is_complete(layout.scale_dir(self.run_dir, a),
                                                             layout.scale_run_id(self.run_id, a))]
        self.log_test_read([*todo, 1.0])
        # Each post-hoc scale first, each record written whole, then the refined ones; the run's own record (scale 1)
        # last, so a complete record.json means every requested and every refined scale is there too.
        for alpha in scales:
            out, scaled_id = layout.scale_dir(self.run_dir, alpha), layout.scale_run_id(self.run_id, alpha)
            if records.is_complete(out, scaled_id):
                log.info("%s: scale %s already evaluated", self.run_id, layout.scale_label(alpha))
                continue
            log.info("%s: evaluating at post-hoc scale %s", self.run_id, layout.scale_label(alpha))
            method.scale(model, alpha)
            scaled = self.evaluate(model, out, {"run_id": scaled_id, "scale": alpha, "train_run_id": self.run_id},
                                   **costs)
            self.logger.summary({f"scale/{layout.scale_label(alpha)}": {"metrics": scaled["metrics"]}})
        if scales:
            method.scale(model, 1.0)
        record = self.measure(model, self.run_dir, {"scale": 1.0} if scales else {}, **costs)
        refinement = required_refinement(self.typed) if method.trains else None
        if refinement:
            record[records.REFINEMENT_KEY] = self.refine(model, scales, record, refinement, costs)
            record["provenance"] = records.provenance(self.started)  # its end time: after the refined scales
            method.scale(model, 1.0)
        records.atomic_write_json(self.run_dir / layout.RECORD_NAME, record)
        self.logger.summary({"metrics": record["metrics"], "cost": record["cost"]})
        self.logger.log_run_files(self.run_dir, record)
        result = logging.getLogger("suite.result")
        for line in summary_lines(record, self.run_dir / layout.RECORD_NAME):
            result.info("%s", line)
        log.info("%s: complete; record %s", self.run_id, self.run_dir / layout.RECORD_NAME)
        return record

    def refine(self, model: torch.nn.Module, scales: list[float], record: dict, settings: dict, costs: dict) -> dict:
        """Evaluate the scales `experiments.scale_refinement` adds between the fixed `scales` (and 1, `record`, the
        run's own record not yet written), each written as a scale record marked `scale_refined`; a scale whose
        complete record is already there (an earlier launch) is read, not evaluated again. Returns what the run's
        record says of it: the `settings`, the scales added, why it stopped, the widest pass@1 gap left."""
        measured = {1.0: _pass_at_1(record)}
        for alpha in scales:
            measured[alpha] = _pass_at_1(records.read_record(layout.scale_dir(self.run_dir, alpha)))

        def measure(alpha: float) -> Optional[float]:
            out, scaled_id = layout.scale_dir(self.run_dir, alpha), layout.scale_run_id(self.run_id, alpha)
            if records.is_complete(out, scaled_id):
                log.info("%s: refined scale %s already evaluated", self.run_id, layout.scale_label(alpha))
                return _pass_at_1(records.read_record(out))
            log.info("%s: evaluating at refined post-hoc scale %s", self.run_id, layout.scale_label(alpha))
            self.method.scale(model, alpha)
            scaled = self.evaluate(model, out, {"run_id": scaled_id, "scale": alpha, "train_run_id": self.run_id,
                                                "scale_refined": True}, **costs)
            self.logger.summary({f"scale/{layout.scale_label(alpha)}": {"metrics": scaled["metrics"]}})
            return _pass_at_1(scaled)

        done = scale_refinement.refine(measured, measure, settings["max_gap"], settings["max_evals"],
                                       settings["min_width"])
        log.info("%s: scale refinement added %s (stopped: %s; widest pass@1 gap left %s)", self.run_id,
                 ", ".join(layout.scale_label(a) for a in done.added) or "no scale", done.stopped, done.widest_gap)
        return {**settings, "added": done.added, "stopped": done.stopped, "widest_gap": done.widest_gap}

    def log_test_read(self, scales: list[float]) -> None:
        """On the test split: append this evaluation's line to `<run_root>/test_reads.jsonl` (`experiments.read_ledger`)
        as it starts reading the split, before any metric, so a run that crashes or is killed while evaluating is
        counted too. `scales`: the post-hoc scales this evaluation will read the split at. A dev run appends nothing.
        (The base model's reference cache also reads the split; that is no read of a method's results.)"""
        if self.benchmark.split != layout.EVALUATION_SPLIT:
            return
        sha, dirty = records.code_version()
        train_cfg = self.base_record["config"].get("train") or {}
        line = read_ledger.ledger_line(
            run_id=self.run_id, method=self.method.name, knobs=self.base_record["knobs"],
            train={key: train_cfg.get(key) for key in layout.TRAIN_KNOBS}, seed=self.typed.seed,
            backbone=self.base_record["backbone"], benchmark=self.base_record["benchmark"], split=self.benchmark.split,
            scales=scales, content_sha256=read_ledger.content_hash(self.benchmark), git_sha=sha, git_dirty=dirty)
        path = read_ledger.log_read(Path(self.typed.run_root), line)
        log.info("%s: test split read (scales %s) logged in %s", self.run_id,
                 ", ".join(layout.scale_label(a) for a in scales), path)

    def base_model(self) -> torch.nn.Module:
        """A separately loaded frozen base: the reference is never the adapted model with adapters disabled."""
        if self._base is None:
            with timed_phase(log, "loading the frozen base model (the reference the retained KL is measured against)"):
                self._base = load_model(self.typed.backbone, self.device)
            for p in self._base.parameters():
                p.requires_grad_(False)
        return self._base

    def reference(self):
        """The base model's reference cache of this benchmark (built on first use)."""
        return get_reference(self.base_model(), self.tokenizer, self.benchmark, self.eval_cfg, self.key,
                             self.typed.backbone.chat_template, progress=bool(self.typed.train.progress))

    def evaluate(self, model: torch.nn.Module, out_dir: Path, fields: dict, **costs: Any) -> dict:
        """Evaluate `model` as it is now and write its code samples, retained samples and complete record into
        `out_dir`."""
        record = self.measure(model, out_dir, fields, **costs)
        records.atomic_write_json(out_dir / layout.RECORD_NAME, record)
        return record

    def measure(self, model: torch.nn.Module, out_dir: Path, fields: dict, *, summary: dict, stored_bytes: int,
                result: Optional[TrainResult]) -> dict:
        """Evaluate `model` as it is now, write its code samples and retained samples into `out_dir` and return its
        complete record (not written)."""
        base = model if not self.method.trains else self.base_model
        t_eval = time.perf_counter()
        with timed_phase(log, "evaluating: retained KL and answers, pass@1"):
            metrics = evaluate_run(model, base, self.tokenizer, self.benchmark, self.eval_cfg, self.key,
                                   self.typed.backbone.chat_template, progress=bool(self.typed.train.progress))
        records.atomic_write_json(out_dir / layout.CODE_SAMPLES_NAME, metrics.pop("code_samples", []))
        records.atomic_write_json(out_dir / layout.RETAINED_SAMPLES_NAME, metrics.pop("retained_samples", []))
        timing = metrics.pop("timing", {})
        record = {
            **self.base_record, **fields,
            "status": layout.STATUS_COMPLETE,
            "metrics": metrics,
            "train": None if result is None else {
                "steps": result.steps,
                "final_loss": result.final_loss,
                "losses": result.losses,
                "resumed_from": result.resumed_from,
                **({"reused_from": self.reused} if self.reused else {}),
            },
            "cost": {
                "train_seconds": 0.0 if result is None else result.train_seconds,
                "tokens_seen": 0 if result is None else result.tokens_seen,
                "peak_memory_bytes": peak_memory_bytes(self.device),
                "trainable_params": summary["params_trainable"],
                "total_params": summary["params_total"],
                "stored_bytes": stored_bytes,
                "decode_tokens_per_s": timing.get("decode_tokens_per_s"),
                "eval_seconds": time.perf_counter() - t_eval,
                "threads": torch.get_num_threads(),  # intra-op threads the seconds above were measured with
                **self.method.costs(),
            },
            "timing": timing,
            **({"diagnostics": self.diagnostics} if self.diagnostics else {}),
            "provenance": records.provenance(self.started),
        }
        return record


def _pass_at_1(record: Optional[dict]) -> Optional[float]:
    """pass@1 (share of problems) of a record's target metrics; None where the record has none."""
    value = records.part(records.part(record, "metrics"), "target").get("pass@1")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
