"""Standard-benchmark accuracy through lm-evaluation-harness, on the in-memory model.

`run_lm_eval` wraps the model in lm-eval's `HFLM` and calls `simple_evaluate` with a
`TaskManager`. Hub tasks (gsm8k, arc_challenge, ...) come from lm-eval's own task registry
(`include_defaults=True`); local tasks come from `include_path`. The suite's local tasks are
templates in `lm_eval_tasks/` (one per retained kind: `atlas_math.yaml` generate_until with exact
match on the extracted final number, `atlas_choice.yaml` multiple_choice with acc / acc_norm);
`write_local_tasks` renders them over jsonl files into a folder used as `include_path`, so the
same code path runs offline. Prompts and answer extraction are the suite's own
(`experiments.prompts`, `experiments.evaluation.answers`), referenced from the YAML with
`!function`, so lm-eval and the suite's metrics see the same strings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from experiments.evaluation.answers import extract_math_answer

TEMPLATE_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
TEMPLATES = {"math": "atlas_math.yaml", "choice": "atlas_choice.yaml"}
LOCAL_PREFIX = "atlas_"


def math_gold_answer(doc: dict) -> str:
    """The gold final number of a GSM8K-format item (lm-eval `doc_to_target`)."""
    return extract_math_answer(doc["answer"]) or ""


def math_answer_filter(resps: Sequence[Sequence[str]], docs: Sequence[dict]) -> list[list[str]]:
    """lm-eval custom filter: each generated response -> its extracted final number ("" when none)."""
    return [[extract_math_answer(r) or "" for r in rs] for rs in resps]


def write_jsonl(items: Sequence[dict], path: Path) -> Path:
    """Write items one JSON object a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    return path


def write_local_tasks(out_dir: Path, tasks: dict[str, tuple[str, Path]], max_gen_toks: int = 128) -> Path:
    """Render one task YAML per `{task_name: (kind, data_file)}` into `out_dir` (the include path).

    `kind` is `math` or `choice`; `data_file` a jsonl of items in the suite's normalised format.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (kind, data_file) in tasks.items():
        if kind not in TEMPLATES:
            raise ValueError(f"lm-eval local task {name!r}: kind {kind!r}; allowed: {sorted(TEMPLATES)}")
        text = (TEMPLATE_DIR / TEMPLATES[kind]).read_text()
        text = (text.replace("@TASK@", json.dumps(name))
                    .replace("@DATA_FILE@", json.dumps(str(Path(data_file).resolve())))
                    .replace("@MAX_GEN_TOKS@", str(int(max_gen_toks))))
        (out_dir / f"{name}.yaml").write_text(text)
    return out_dir


def _clean_metrics(task_results: dict) -> dict:
    """`{"acc,none": 0.5, "acc_stderr,none": "N/A", "alias": ..}` -> `{"acc": 0.5}` (numbers only).

    A metric computed under several filters keeps the filter name: `metric/filter`.
    """
    keys = [k for k in task_results if "," in k]
    metric_count: dict[str, int] = {}
    for k in keys:
        metric_count[k.split(",", 1)[0]] = metric_count.get(k.split(",", 1)[0], 0) + 1
    out = {}
    for k in keys:
        metric, filt = k.split(",", 1)
        value = task_results[k]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[metric if metric_count[metric] == 1 else f"{metric}/{filt}"] = float(value)
    return out


def run_lm_eval(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str],
    limit: Optional[int] = None,
    include_path: Optional[str | Path | Sequence[str | Path]] = None,
    *,
    include_defaults: Optional[bool] = None,
    batch_size: int = 8,
    chat_template: bool = False,
    seed: int = 0,
) -> dict:
    """Evaluate the in-memory model on lm-eval `tasks`; returns `{task: {metric: value, ..., "n": docs}}`.

    `include_defaults` (lm-eval's built-in task registry) defaults to True exactly when some task
    is not a local `atlas_*` task, so an all-local evaluation never indexes hub tasks.
    """
    # here, not at the top: only eval.lm_eval_tasks needs it, and lm-eval loads its task registry on import
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks = list(tasks)
    if not tasks:
        return {}
    if include_defaults is None:
        include_defaults = any(not t.startswith(LOCAL_PREFIX) for t in tasks)
    if isinstance(include_path, (str, Path)):
        include_path = [include_path]
    paths = [str(p) for p in include_path] if include_path else None
    manager = TaskManager(include_path=paths, include_defaults=include_defaults)
    was_training = model.training
    model.eval()
    try:
        # The same chat-template options as `prompts.apply_template` (e.g. Qwen3's enable_thinking).
        template_kwargs = dict(getattr(tokenizer, "chat_template_kwargs", None) or {})
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
                  chat_template_args=template_kwargs or None)
        results = simple_evaluate(
            model=lm,
            tasks=tasks,
            limit=limit,
            task_manager=manager,
            num_fewshot=None,
            bootstrap_iters=0,
            log_samples=False,
            apply_chat_template=bool(chat_template),
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    finally:
        model.train(was_training)
    out = {}
    n_samples = results.get("n-samples", {})
    for task, task_results in results["results"].items():
        entry = _clean_metrics(task_results)
        if task in n_samples:
            entry["n"] = int(n_samples[task].get("effective", n_samples[task].get("original", 0)))
        out[task] = entry
    return out
