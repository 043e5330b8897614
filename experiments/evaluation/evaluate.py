"""Evaluate one run: target pass@k in the sandbox, retained KL and answer-level stability, optional lm-eval.

Retained metrics are computed on each retained domain's *evaluation* split (`retained_near`: held-out items of
the calibration templates) and, where the benchmark has them, its *far* items (`retained_far`: templates,
phrasings, facts and relations calibration never uses), against the reference cache of the separately loaded
frozen base (`reference_cache.get_reference`):

- `kl_token_mean`, `kl_seq_mean`, `n_tokens`, `n`: KL(base || adapted) teacher-forced on the base's
  cached reference responses (`retained_kl`);
- math: the adapted model's greedy answers vs the base's cached greedy answers
  (`answer_change_rate`), and both models' accuracy against the gold final number;
- choice: the adapted model's raw and character-normalised choices vs the base's
  (`choice_flip_rate`, `choice_flip_rate_norm`), and both models' accuracy (raw and normalised);
- `per_item`: each item's summed KL and token count (for statistics over items).

`retained_samples` (not a metric) holds, per near and far item, what the base and the adapted model answered
(`suite_schema.retained_samples`), which `experiments.job` stores next to the record.

Every rate is a dict carrying its `n`. `retained_kl_mean` is the headline (`headline_kl`). Code: pass@1 from one
greedy completion per problem (`per_problem`: each problem's pass); pass@k (k > 1) from `n_samples`
sampled completions with the unbiased estimator; every completion is checked in the sandbox, its
test and the solution in separate processes (`sandbox`), and `target.sandbox` records which
isolation was in force.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from experiments import prompts as P
from experiments.disk_cache import sha256_of
from experiments.evaluation.answers import accuracy, answer_change_rate, choice_flip_rate, extract_math_answer
from experiments.evaluation.code_completion import build_check
from experiments.evaluation.config import EvalConfig, require_eval_config
from experiments.evaluation.generation import generate, pad_token_id
from experiments.evaluation.lm_eval_runner import LOCAL_PREFIX, run_lm_eval, write_jsonl, write_local_tasks
from experiments.evaluation.pass_at_k import summarize_pass_at_k
from experiments.evaluation.reference_cache import ModelOrFactory, ReferenceCache, _resolve, get_reference
from experiments.evaluation.retained_kl import retained_kl
from experiments.evaluation.scoring import score_choices
from experiments.progress import progress_bar
from sandbox import check_solutions, isolation_report
from suite_schema import retained_samples as RS


def evaluate_run(
    model: Any,
    base_model: ModelOrFactory,
    tokenizer: Any,
    benchmark: Any,
    cfg: EvalConfig,
    backbone_key: str,
    chat_template: bool,
    progress: bool = True,
) -> dict:
    """All metrics of one run (see the module docstring and docs/evaluation.md).

    `model` is the adapted model; `base_model` the separately loaded frozen base, or a
    zero-argument callable returning it. Besides the metrics, `timing` holds where the time went
    and `code_samples` every code completion with its sandbox verdict (task id, greedy or sample,
    completion, status, reason), which `experiments.job` stores next to the record, and `retained_samples` what the
    base and the adapted model answered on every near and far retained item (`suite_schema.retained_samples`).
    """
    require_eval_config(cfg)
    t_start = time.perf_counter()
    timing: dict[str, Any] = {"generation_s": 0.0, "generated_tokens": 0}

    t = time.perf_counter()
    ref = get_reference(base_model, tokenizer, benchmark, cfg, backbone_key, chat_template, progress=progress)
    timing["reference_s"] = time.perf_counter() - t
    timing["reference_hit"] = bool(ref.stats["hit"])
    timing["reference_build_s"] = 0.0 if ref.stats["hit"] else float(ref.stats["build_s"])
    timing["reference_cold_build_s"] = float(ref.stats["build_s"])

    retained_samples: list[dict] = []
    near, timing["kl_s"] = _retained(model, tokenizer, ref, cfg, chat_template, progress, timing, "evaluation",
                                     retained_samples)
    far, far_s = _retained(model, tokenizer, ref, cfg, chat_template, progress, timing, "far", retained_samples)
    timing["kl_s"] += far_s
    samples: list[dict] = []
    target = _target(model, tokenizer, benchmark, cfg, chat_template, progress, timing, samples)

    out: dict[str, Any] = {"target": target, "retained_near": near}
    if far:
        out["retained_far"] = far
    out["retained_kl_mean"] = headline_kl(near, far)
    if cfg.lm_eval_tasks:
        t = time.perf_counter()
        out["lm_eval"] = _lm_eval(model, base_model, tokenizer, benchmark, cfg, chat_template, ref)
        timing["lm_eval_s"] = time.perf_counter() - t
    timing["decode_tokens_per_s"] = (
        timing["generated_tokens"] / timing["generation_s"] if timing["generation_s"] > 0 else None
    )
    timing["total_s"] = time.perf_counter() - t_start
    out["timing"] = timing
    out["code_samples"] = samples
    out["retained_samples"] = retained_samples
    return out


def _timed_generate(timing: dict, *args, **kwargs):
    t = time.perf_counter()
    res = generate(*args, **kwargs)
    timing["generation_s"] += time.perf_counter() - t
    timing["generated_tokens"] += sum(len(ids) for ids in res.token_ids)
    return res


#: KL below minus this (nats per token) cannot come from rounding the base's stored log-probs: something is broken.
KL_NEGATIVE_TOLERANCE = 1e-3


class ImpossibleMetricError(RuntimeError):
    """A measured value that cannot be right (NaN or infinite KL, KL below zero beyond rounding): the run fails
    instead of recording it as complete."""


def check_kl(domain: str, kl: dict, source: Any) -> None:
    """Raise `ImpossibleMetricError` when a domain's retained KL over its response tokens is NaN, infinite or
    negative beyond `KL_NEGATIVE_TOLERANCE` (a domain without response tokens has no KL: NaN is its value)."""
    if not kl.get("n_tokens"):
        return
    for key in ("kl_token_mean", "kl_seq_mean"):
        value = kl[key]
        if not math.isfinite(value) or value < -KL_NEGATIVE_TOLERANCE:
            raise ImpossibleMetricError(
                f"retained KL of {domain}: {key} = {value} cannot be right (KL is finite and >= 0); the base's "
                f"cached log-probs ({source}) or the model's outputs are broken")


def domain_mean_kl(entries: dict) -> float:
    """Mean over retained domains of each domain's `kl_token_mean` (nats per response token); NaN without domains."""
    return sum(d["kl_token_mean"] for d in entries.values()) / len(entries) if entries else float("nan")


def headline_kl(near: dict, far: dict) -> float:
    """`retained_kl_mean`, the headline retained KL (nats per token; docs/evaluation.md, "Near and far retained items"):
    without far items, the mean over domains of the near token-mean KL (every earlier record); with them, the mean of
    the near and the far domain means, so near and far weigh equally and each domain weighs equally within each."""
    if not far:
        return domain_mean_kl(near)
    return (domain_mean_kl(near) + domain_mean_kl(far)) / 2


def _retained(model, tokenizer, ref: ReferenceCache, cfg: EvalConfig, chat_template, progress, timing, split: str,
              samples: list):
    """Retained metrics per domain on `split` (`evaluation`: near items, `far`: far items; domains without that
    split are left out) and the seconds spent in KL; appends each item's answers to `samples`."""
    set_name = "near" if split == "evaluation" else "far"
    pad_id = pad_token_id(tokenizer)
    kl_s = 0.0
    retained: dict[str, dict] = {}
    for name, dom in ref.domains.items():
        ev = dom.split(split)
        if ev is None:
            continue
        label = name if split == "evaluation" else f"{name} (far)"
        t = time.perf_counter()
        kl = retained_kl(model, ev.prompt_ids, ev.response_ids, ev.logprobs, pad_id=pad_id,
                         batch_size=cfg.scoring_batch_size, progress=progress, desc=f"retained KL {label}")
        kl_s += time.perf_counter() - t
        check_kl(label, kl, ref.path)
        entry: dict[str, Any] = {k: kl[k] for k in ("kl_token_mean", "kl_seq_mean", "n_tokens", "n")}
        entry["kl_storage"] = kl["mode"]
        if dom.kind == "math":
            adapted = _timed_generate(
                timing, model, tokenizer, ev.prompts, max_new_tokens=cfg.max_new_tokens_math,
                batch_size=cfg.generation_batch_size, progress=progress, desc=f"greedy {label}",
            )
            adapted_answers = [extract_math_answer(text) for text in adapted.texts]
            gold = [extract_math_answer(item["answer"]) for item in ev.items]
            entry["answer_change_rate"] = answer_change_rate(ev.greedy_answers, adapted_answers)
            entry["base_accuracy"] = accuracy(ev.greedy_answers, gold)
            entry["adapted_accuracy"] = accuracy(adapted_answers, gold)
            samples += RS.math_samples(set_name, name, ev.items, gold, ev.greedy_answers, adapted_answers,
                                       adapted.texts, ev.greedy_texts)
        elif dom.kind == "choice":
            scores = score_choices(model, tokenizer, ev.items, chat_template=chat_template,
                                   batch_size=cfg.scoring_batch_size, progress=progress)
            gold = [item["answer_index"] for item in ev.items]
            entry["choice_flip_rate"] = choice_flip_rate(ev.choice, scores.choice)
            entry["choice_flip_rate_norm"] = choice_flip_rate(ev.choice_norm, scores.choice_norm)
            entry["base_accuracy"] = accuracy(ev.choice, gold)
            entry["adapted_accuracy"] = accuracy(scores.choice, gold)
            entry["base_accuracy_norm"] = accuracy(ev.choice_norm, gold)
            entry["adapted_accuracy_norm"] = accuracy(scores.choice_norm, gold)
            samples += RS.choice_samples(set_name, name, ev.items, ev.choice, scores.choice, ev.choice_norm,
                                         scores.choice_norm)
        else:
            raise ValueError(f"retained domain {name!r}: kind {dom.kind!r}; allowed: math, choice")
        entry["per_item"] = kl["per_item"]
        retained[name] = entry
    return retained, kl_s


def _target(model, tokenizer, benchmark, cfg: EvalConfig, chat_template, progress, timing, samples) -> dict:
    # Before any generation: a machine where no sandbox mode works (or where the interpreter's
    # imports would fail inside) stops here with the reason instead of scoring every solution 0.
    sandbox = isolation_report()
    problems = list(benchmark.target_eval)
    if cfg.max_target_problems is not None:
        problems = problems[: cfg.max_target_problems]
    prompts = [P.apply_template(tokenizer, P.code_problem_prompt(p), chat_template) for p in problems]
    limits = cfg.sandbox_limits()
    failures: Counter = Counter()
    execution_s = 0.0

    def run(problem_list, texts, kind):
        nonlocal execution_s
        # build_check truncates the completion itself (and handles whole-function answers).
        checks = [build_check(p, text) for p, text in zip(problem_list, texts)]
        t = time.perf_counter()
        with progress_bar(total=len(checks), desc="sandbox", unit="check", disable=not progress) as bar:
            results = check_solutions(checks, limits, workers=cfg.sandbox_workers, on_result=lambda _: bar.update(1))
        execution_s += time.perf_counter() - t
        broken = [r for r in results if r.status == "sandbox_error"]
        if broken:
            raise RuntimeError(
                f"{len(broken)} of {len(results)} code checks could not run in the sandbox (first: {broken[0].reason}); "
                "no pass@k is reported from a sandbox that does not work (docs/sandbox.md)"
            )
        failures.update(r.status for r in results if not r.passed)
        for i, (p, text, r) in enumerate(zip(problem_list, texts, results)):
            samples.append({"task_id": p["task_id"], "kind": kind, "index": i, "completion": text,
                            "status": r.status, "reason": r.reason})
        return results

    greedy = _timed_generate(timing, model, tokenizer, prompts, max_new_tokens=cfg.max_new_tokens_code,
                             batch_size=cfg.generation_batch_size, progress=progress, desc="code greedy")
    greedy_results = run(problems, greedy.texts, "greedy")
    target: dict[str, Any] = {"pass@1": summarize_pass_at_k([[r.passed] for r in greedy_results], [1]).get("pass@1")}
    target["per_problem"] = {"task_ids": [p["task_id"] for p in problems],
                             "passed": [int(bool(r.passed)) for r in greedy_results]}

    ks = sorted(k for k in cfg.pass_k if k > 1)
    if ks:
        n = cfg.n_samples
        sampled = _timed_generate(
            timing, model, tokenizer, [p for p in prompts for _ in range(n)],
            max_new_tokens=cfg.max_new_tokens_code, do_sample=True, temperature=cfg.sample_temperature,
            top_p=cfg.sample_top_p, seed=cfg.sample_seed,
            sample_indices=[j for _ in prompts for j in range(n)],
            batch_size=cfg.generation_batch_size, progress=progress, desc="code samples",
        )
        sampled_results = run([p for p in problems for _ in range(n)], sampled.texts, "sample")
        per_problem = [[r.passed for r in sampled_results[i * n:(i + 1) * n]] for i in range(len(problems))]
        sampled_summary = summarize_pass_at_k(per_problem, ks)
        for k in ks:
            target[f"pass@{k}"] = sampled_summary[f"pass@{k}"]
        target["n_samples"] = n
    target["n_problems"] = len(problems)
    target["failures"] = dict(sorted(failures.items()))
    target["sandbox"] = {k: sandbox[k] for k in ("mode", "files_hidden", "network_isolated", "memory_bounded_in_total",
                                                 "cpu_bounded_in_total", "syscall_filter_applied", "processes_limited",
                                                 "separate_test_process")}
    timing["execution_s"] = execution_s
    return target


def _lm_eval(model, base_model, tokenizer, benchmark, cfg: EvalConfig, chat_template, ref: ReferenceCache) -> dict:
    """lm-eval accuracy of the adapted model and of the base, and their difference (adapted - base).

    Task names `atlas_<domain>` are rendered as local tasks over that retained domain's
    evaluation items (so they run offline); other names resolve through lm-eval's registry and
    `lm_eval_include_path`.
    """
    with tempfile.TemporaryDirectory(prefix="atlas-lm-eval-") as tmp:
        tmp_dir = Path(tmp)
        local = {}
        for task in cfg.lm_eval_tasks:
            if task.startswith(LOCAL_PREFIX):
                domain = task[len(LOCAL_PREFIX):]
                if domain not in ref.domains:
                    raise ValueError(
                        f"eval.lm_eval_tasks: local task {task!r} names no retained domain; "
                        f"allowed: {[LOCAL_PREFIX + d for d in ref.domains]}"
                    )
                dom = ref.domains[domain]
                local[task] = (dom.kind, write_jsonl(dom.evaluation.items, tmp_dir / "data" / f"{domain}.jsonl"))
        include: list[str] = []
        if local:
            include.append(str(write_local_tasks(tmp_dir / "tasks", local, max_gen_toks=cfg.max_new_tokens_math)))
        if cfg.lm_eval_include_path:
            include.append(cfg.lm_eval_include_path)
        kw = dict(tasks=cfg.lm_eval_tasks, limit=cfg.lm_eval_limit,
                  include_path=(include if len(include) > 1 else (include[0] if include else None)),
                  batch_size=cfg.lm_eval_batch_size, chat_template=chat_template)
        adapted = run_lm_eval(model, tokenizer, **kw)
        # The base's numbers are the same for every run of a sweep: kept next to the reference cache.
        base_file = ref.path / f"lm_eval_base-{_lm_eval_key(cfg, chat_template, tmp_dir)}.json"
        base = _read_checked(base_file)
        if base is None:
            base = run_lm_eval(_resolve(base_model), tokenizer, **kw)
            tmp_file = base_file.with_name(f".{base_file.name}.tmp-{os.getpid()}")
            tmp_file.write_text(json.dumps({"results": base, "sha256": sha256_of(base)}))
            os.replace(tmp_file, base_file)
    delta = {
        task: {m: adapted[task][m] - base[task][m] for m in adapted[task] if m != "n" and m in base.get(task, {})}
        for task in adapted
    }
    return {"adapted": adapted, "base": base, "delta": delta}


def _read_checked(path: Path) -> Any:
    """The results stored in `path` with their checksum, or None when there is no file; a file that cannot be
    read or whose checksum does not match is reported in one warning line and treated as absent."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
        if stored["sha256"] == sha256_of(stored["results"]):
            return stored["results"]
        problem = "does not match its checksum"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = f"cannot be read ({type(exc).__name__})"
    logging.getLogger("suite.cache").warning("lm-eval base numbers %s %s; computing them again", path, problem)
    return None


def _lm_eval_key(cfg: EvalConfig, chat_template: bool, local_dir: Path) -> str:
    """Hash of what the base's lm-eval numbers depend on beyond the reference key (the folder's name)."""
    # here, not at the top: only eval.lm_eval_tasks needs it, and lm-eval loads its task registry on import
    import lm_eval

    h = hashlib.sha256(json.dumps({
        "tasks": list(cfg.lm_eval_tasks), "limit": cfg.lm_eval_limit, "chat_template": bool(chat_template),
        "include_path": cfg.lm_eval_include_path, "lm_eval": getattr(lm_eval, "__version__", "?"),
        "max_gen_toks": cfg.max_new_tokens_math,
    }, sort_keys=True).encode())
    for f in sorted(local_dir.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(local_dir).as_posix().encode())
            h.update(f.read_bytes().replace(str(local_dir).encode(), b""))
    return h.hexdigest()[:24]
