"""One run, end to end: validate, skip if done, load, prepare the method, train, evaluate, record.

`run(cfg)` is what `run.py` calls for every job of a sweep. Everything that can be checked
cheaply (config values, method hyperparameters, data paths, target modules) is checked before
the backbone's weights are loaded or any training starts.
"""

from __future__ import annotations

import os
import resource
import sys
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from experiments import records
from experiments.backbones import (
    BackboneError,
    backbone_key,
    check_target_modules,
    load_backbone,
    load_model,
    model_summary,
    resolve_path,
)
from experiments.config import ConfigError, validate_config
from experiments.data.benchmark import Benchmark, build_benchmark
from experiments.data.loaders import DataError
from experiments.logger import make_logger
from experiments.methods import Method, MethodConfigError, RunContext, build_method
from experiments.prompts import (apply_template, boundary_agrees, code_instruction_prompt, code_instruction_response,
                                encode_pair)
from experiments.train import Preempted, checkpoint_paths, seed_everything, train

# Errors that mean "the config asks for something impossible": one line, no traceback, exit code 2.
USER_ERRORS = (ConfigError, MethodConfigError, BackboneError, DataError)


def typed_config(cfg: DictConfig) -> DictConfig:
    """The validated config (raises one of USER_ERRORS)."""
    return validate_config(cfg)


def run_id_for(cfg: DictConfig) -> str:
    """The run id of a composed config (schema defaults filled in, presentation keys dropped)."""
    try:
        typed = validate_config(cfg)
        data = OmegaConf.to_container(typed, resolve=True)
    except USER_ERRORS:
        data = OmegaConf.to_container(cfg, resolve=True)
    return records.run_id_of(data)


def resolve_run_dir(typed: DictConfig, run_id: str) -> Path:
    """The run directory: Hydra's job output dir when running under Hydra, else <run_root>/<run_id>."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.output_dir)
    except ImportError:  # pragma: no cover
        pass
    return Path(typed.run_root) / run_id


def preflight_backbone(bb: Any) -> None:
    """Check the backbone's target modules on a weightless (meta-device) model built from its config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_path(bb.path), revision=bb.revision, trust_remote_code=bb.trust_remote_code)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=bb.trust_remote_code)
    check_target_modules(skeleton, list(bb.target_modules))


#: How many training items `encode_target` checks against whole-text tokenisation.
BOUNDARY_CHECK_ITEMS = 64


def encode_target(benchmark: Benchmark, tokenizer: Any, chat_template: bool, max_length: int) -> list[dict]:
    """Encoded SFT examples (prompt + response, loss on the response) of the target training split."""
    out = []
    disagree = 0
    for i, item in enumerate(benchmark.target_train):
        prompt = apply_template(tokenizer, code_instruction_prompt(item), chat_template)
        out.append(encode_pair(tokenizer, prompt, code_instruction_response(item), max_length))
        if i < BOUNDARY_CHECK_ITEMS:
            disagree += not boundary_agrees(tokenizer, prompt, code_instruction_response(item))
    if not out:
        raise DataError("benchmark.target.train: the target training split is empty")
    if disagree:
        print(f"[run] warning: for {disagree} of the first {min(len(out), BOUNDARY_CHECK_ITEMS)} training items this "
              "tokenizer splits prompt + response differently from the whole text (experiments.prompts.split_boundary); "
              "the model is prompted at a token boundary its pretraining may not have had", flush=True)
    return out


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else the process's peak resident set size, in bytes."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@contextmanager
def failure_guard(run_dir: Path, base_record: dict, logger: Any) -> Iterator[None]:
    """Record any exception (status failed, with traceback; or interrupted after a signal) and always close the logger."""
    exit_code = 0
    try:
        yield
    except Preempted as exc:
        exit_code = 1
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_INTERRUPTED, "interrupted": {"step": exc.step, "reason": str(exc)},
             "provenance": records.provenance(_started(base_record))},
        )
        raise
    except SystemExit as exc:
        # A signal handler ended the process, e.g. submitit's on USR2 after the loop's checkpoint: the
        # job was requeued and resumes, so the run is interrupted, not failed.
        exit_code = 1
        checkpoints = checkpoint_paths(run_dir)
        step = int(checkpoints[-1].stem.split("_")[1]) if checkpoints else None
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_INTERRUPTED,
             "interrupted": {"step": step, "reason": f"exit({exc.code}) during the run: requeued (or stopped) by a signal handler"},
             "provenance": records.provenance(_started(base_record))},
        )
        raise
    except BaseException as exc:
        exit_code = 1
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_FAILED,
             "error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()},
             "provenance": records.provenance(_started(base_record))},
        )
        raise
    finally:
        try:
            logger.close(exit_code)
        except Exception as exc:
            if not exit_code:
                raise
            # After a failure or a signal the logger's service may be gone already (a requeue kills the
            # job's processes): closing it must not hide why the run stopped.
            print(f"[run] closing the logger failed after the run stopped: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)


def required_scales(typed: Any) -> list[float]:
    """The post-hoc scales (eval.scales besides 1.0) that need a record of their own: none for a
    method that does not train (the base model is the same at every scale)."""
    from hydra.utils import get_class

    target = typed.method.get("_target_") if hasattr(typed.method, "get") else None
    try:
        trains = bool(getattr(get_class(target), "trains", True)) if target else True
    except Exception:
        trains = True  # build_method reports an unimportable target with its own message
    return records.extra_scales(typed.eval.scales) if trains else []


def _started(base_record: dict) -> datetime:
    return datetime.fromisoformat(base_record["started"])


def run(cfg: DictConfig) -> dict:
    """Run (or skip) one job and return its result record."""
    typed = typed_config(cfg)
    resolved = OmegaConf.to_container(typed, resolve=True)
    run_id = records.run_id_of(resolved)
    run_dir = resolve_run_dir(typed, run_id)
    if records.is_complete(run_dir, run_id, required_scales(typed)):
        print(f"[run] {run_id}: complete record in {run_dir}; skipped (nothing to do)", flush=True)
        return records.read_record(run_dir)

    method: Method = build_method(typed.method)
    preflight_backbone(typed.backbone)
    benchmark = build_benchmark(typed.benchmark)
    for dom in benchmark.retained.values():
        if dom.dropped_calibration:
            print(f"[run] {dom.name}: {dom.dropped_calibration} calibration items dropped (their question is in the "
                  "dev or test split)", flush=True)

    run_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    science = records.scientific_config(resolved)
    base_record = {
        "schema_version": records.SCHEMA_VERSION,
        "run_id": run_id,
        "status": "running",
        "method": method.name,
        "backbone": typed.backbone.name,
        # dev runs carry the split in the benchmark label, so no table or plot ever pools them with test runs
        "benchmark": typed.benchmark.name if typed.benchmark.split == "test" else f"{typed.benchmark.name}@dev",
        "split": typed.benchmark.split,
        "seed": typed.seed,
        "knobs": method.describe(),
        "config": science,
        "started": started.isoformat(),
    }
    name = f"{method.name}-{typed.backbone.name}-s{typed.seed}-{run_id[:8]}"
    logger = make_logger(typed.logger, run_id, run_dir, science, name)
    with failure_guard(run_dir, base_record, logger):
        return _run_body(typed, run_id, run_dir, method, benchmark, logger, base_record, started)


def _run_body(typed, run_id, run_dir, method, benchmark, logger, base_record, started) -> dict:
    from experiments.evaluation.config import as_eval_config
    from experiments.evaluation.evaluate import evaluate_run

    tr, bb = typed.train, typed.backbone
    if tr.num_threads:
        torch.set_num_threads(tr.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(typed.seed)
    print(f"[run] {run_id}: {method.name} on {bb.name}/{benchmark.name}, seed {typed.seed} -> {run_dir}", flush=True)

    model, tokenizer = load_backbone(bb, device)
    if bb.gradient_checkpointing and method.trains:
        model.gradient_checkpointing_enable()
    key = backbone_key(bb)
    eval_cfg = as_eval_config(typed.eval)
    base_cache: dict = {}

    def base_model():
        # A separately loaded frozen base: the reference is never the adapted model with adapters disabled.
        if "model" not in base_cache:
            base_cache["model"] = load_model(bb, device)
            for p in base_cache["model"].parameters():
                p.requires_grad_(False)
        return base_cache["model"]

    def reference():
        from experiments.evaluation.reference_cache import get_reference

        return get_reference(base_model(), tokenizer, benchmark, eval_cfg, key, bb.chat_template)

    ctx = RunContext(cfg=typed, tokenizer=tokenizer, benchmark=benchmark, run_dir=run_dir, device=device,
                     seed=typed.seed, reference_fn=reference)
    model = method.prepare(model, ctx)
    summary = model_summary(model)

    result = None
    if method.trains and tr.steps > 0:
        max_length = tr.max_length or bb.max_length
        examples = encode_target(benchmark, tokenizer, bb.chat_template, max_length)
        result = train(
            model, method, examples, ctx,
            steps=tr.steps, lr=tr.lr, batch_size=tr.batch_size or bb.train_batch_size,
            grad_accum=tr.grad_accum or bb.grad_accum, pad_id=tokenizer.pad_token_id,
            weight_decay=tr.weight_decay, warmup_steps=tr.warmup_steps, scheduler=tr.scheduler,
            max_grad_norm=tr.max_grad_norm, checkpoint_every=tr.checkpoint_every,
            keep_checkpoints=tr.keep_checkpoints, log_every=tr.log_every, progress=tr.progress,
            log_fn=logger.log,
        )
    stored_bytes = method.export(model, run_dir / "export")

    model.eval()
    base = model if not method.trains else base_model
    scales = records.extra_scales(eval_cfg.scales) if method.trains else []
    # Each post-hoc scale first, each record written whole; the run's own record (scale 1) last, so a
    # complete record.json means every requested scale is there too.
    for alpha in scales:
        out = records.scale_dir(run_dir, alpha)
        scaled_id = records.scale_run_id(run_id, alpha)
        if records.is_complete(out, scaled_id):
            print(f"[run] {run_id}: scale {records.scale_label(alpha)} already evaluated", flush=True)
            continue
        print(f"[run] {run_id}: evaluating at post-hoc scale {records.scale_label(alpha)}", flush=True)
        method.scale(model, alpha)
        t_eval = time.perf_counter()
        metrics = evaluate_run(model, base, tokenizer, benchmark, eval_cfg, key, bb.chat_template, progress=tr.progress)
        records.atomic_write_json(out / records.CODE_SAMPLES_NAME, metrics.pop("code_samples", []))
        scaled = _complete_record({**base_record, "run_id": scaled_id, "scale": alpha, "train_run_id": run_id},
                                  metrics, result, summary, stored_bytes, time.perf_counter() - t_eval, method, device,
                                  started)
        records.atomic_write_json(out / records.RECORD_NAME, scaled)
        logger.summary({f"scale/{records.scale_label(alpha)}": {"metrics": scaled["metrics"]}})
    if scales:
        method.scale(model, 1.0)

    t_eval = time.perf_counter()
    metrics = evaluate_run(model, base, tokenizer, benchmark, eval_cfg, key, bb.chat_template, progress=tr.progress)
    records.atomic_write_json(run_dir / records.CODE_SAMPLES_NAME, metrics.pop("code_samples", []))
    record = _complete_record({**base_record, "scale": 1.0} if scales else base_record, metrics, result, summary,
                              stored_bytes, time.perf_counter() - t_eval, method, device, started)
    records.atomic_write_json(run_dir / records.RECORD_NAME, record)
    logger.summary({"metrics": record["metrics"], "cost": record["cost"]})
    print(f"[run] {run_id}: complete; record {run_dir / records.RECORD_NAME}", flush=True)
    return record


def _complete_record(base_record, metrics, result, summary, stored_bytes, eval_seconds, method, device, started) -> dict:
    """A complete result record from the evaluation metrics and the run's training outcome and costs."""
    return {
        **base_record,
        "status": records.STATUS_COMPLETE,
        "metrics": {k: v for k, v in metrics.items() if k != "timing"},
        "train": None if result is None else {
            "steps": result.steps,
            "final_loss": result.final_loss,
            "losses": result.losses,
            "resumed_from": result.resumed_from,
        },
        "cost": {
            "train_seconds": 0.0 if result is None else result.train_seconds,
            "tokens_seen": 0 if result is None else result.tokens_seen,
            "peak_memory_bytes": peak_memory_bytes(device),
            "trainable_params": summary["params_trainable"],
            "total_params": summary["params_total"],
            "stored_bytes": stored_bytes,
            "decode_tokens_per_s": metrics.get("timing", {}).get("decode_tokens_per_s"),
            "eval_seconds": eval_seconds,
            **method.costs(),
        },
        "timing": metrics.get("timing", {}),
        "provenance": records.provenance(started),
    }
