"""What a run's model answered on the retained items, next to its record: `<run_dir>/retained_samples.json`
(`layout.RETAINED_SAMPLES_NAME`; a post-hoc scale's in `<run_dir>/scales/<alpha>/`).

The file is a JSON list with one entry per retained item the run evaluated, near items first (domain by domain,
items in benchmark order), then far items. Every entry has `set` ("near" or "far"), `domain`, `kind` ("math" or
"choice"), `index` (the item's position in that domain's split), `id` (the item's id, null where it has none),
`prompt` (the item's question text, not the templated prompt), `gold` and `changed`; then

- math: `gold` the gold final number (normalised text), `base_answer` / `adapted_answer` the final numbers the
  base's and the adapted model's greedy responses end in (null where none), `base_text` / `adapted_text` those
  greedy responses; `changed`: the answers differ (what `answer_change_rate` counts);
- choice: `gold` the gold choice's index, `choices` the choice texts, `base_choice` / `adapted_choice` the raw
  log-likelihood argmax indices, `base_choice_norm` / `adapted_choice_norm` the character-normalised ones;
  `changed`: the raw choice flipped (what `choice_flip_rate` counts).

The runtime writes it (`experiments.evaluation.evaluate` builds the entries with `math_samples` / `choice_samples`,
`experiments.job` writes the file); readers take it with `read_retained_samples` and `changed_samples`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from suite_schema.layout import RETAINED_SAMPLES_NAME

SETS = ("near", "far")
KINDS = ("math", "choice")
COMMON_KEYS = ("set", "domain", "kind", "index", "id", "prompt", "gold", "changed")
KIND_KEYS = {
    "math": ("base_answer", "adapted_answer", "base_text", "adapted_text"),
    "choice": ("choices", "base_choice", "adapted_choice", "base_choice_norm", "adapted_choice_norm"),
}


def _common(set_name: str, domain: str, kind: str, index: int, item: dict, gold: Any) -> dict:
    if set_name not in SETS:
        raise ValueError(f"set={set_name!r} is not allowed: one of {', '.join(SETS)}")
    return {"set": set_name, "domain": domain, "kind": kind, "index": index, "id": item.get("id") or None,
            "prompt": item["question"], "gold": gold}


def _same_length(what: str, n: int, **columns: Optional[Sequence]) -> None:
    for name, column in columns.items():
        if column is not None and len(column) != n:
            raise ValueError(f"{what}: {name} has {len(column)} entries for {n} items")


def math_samples(set_name: str, domain: str, items: Sequence[dict], gold: Sequence[Optional[str]],
                 base_answers: Sequence[Optional[str]], adapted_answers: Sequence[Optional[str]],
                 adapted_texts: Sequence[str], base_texts: Optional[Sequence[str]] = None) -> list[dict]:
    """The entries of one math domain's split, in item order (all lists in item order; `base_texts` None stores
    null texts for the base)."""
    _same_length(f"math samples of {domain} ({set_name})", len(items), gold=gold, base_answers=base_answers,
                 adapted_answers=adapted_answers, adapted_texts=adapted_texts, base_texts=base_texts)
    return [
        {**_common(set_name, domain, "math", i, item, gold[i]),
         "base_answer": base_answers[i], "adapted_answer": adapted_answers[i],
         "base_text": None if base_texts is None else base_texts[i], "adapted_text": adapted_texts[i],
         "changed": base_answers[i] != adapted_answers[i]}
        for i, item in enumerate(items)
    ]


def choice_samples(set_name: str, domain: str, items: Sequence[dict], base_choice: Sequence[int],
                   adapted_choice: Sequence[int], base_choice_norm: Sequence[int],
                   adapted_choice_norm: Sequence[int]) -> list[dict]:
    """The entries of one multiple-choice domain's split, in item order (choice indices in item order)."""
    _same_length(f"choice samples of {domain} ({set_name})", len(items), base_choice=base_choice,
                 adapted_choice=adapted_choice, base_choice_norm=base_choice_norm,
                 adapted_choice_norm=adapted_choice_norm)
    return [
        {**_common(set_name, domain, "choice", i, item, int(item["answer_index"])),
         "choices": list(item["choices"]),
         "base_choice": int(base_choice[i]), "adapted_choice": int(adapted_choice[i]),
         "base_choice_norm": int(base_choice_norm[i]), "adapted_choice_norm": int(adapted_choice_norm[i]),
         "changed": int(base_choice[i]) != int(adapted_choice[i])}
        for i, item in enumerate(items)
    ]


def entry_problem(entry: Any) -> Optional[str]:
    """Why `entry` is not a retained-sample entry (see the module docstring), or None when it is one."""
    if not isinstance(entry, dict):
        return f"an entry is a {type(entry).__name__}, not an object"
    missing = [k for k in COMMON_KEYS if k not in entry]
    if missing:
        return f"an entry lacks {', '.join(missing)}"
    if entry["set"] not in SETS:
        return f"set {entry['set']!r} is not one of {', '.join(SETS)}"
    if entry["kind"] not in KINDS:
        return f"kind {entry['kind']!r} is not one of {', '.join(KINDS)}"
    missing = [k for k in KIND_KEYS[entry["kind"]] if k not in entry]
    if missing:
        return f"a {entry['kind']} entry lacks {', '.join(missing)}"
    if not isinstance(entry["changed"], bool):
        return f"changed is {entry['changed']!r}, not true or false"
    return None


def read_retained_samples(run_dir: str | Path) -> Optional[list[dict]]:
    """The entries of `<run_dir>/retained_samples.json` in file order; None when the run has no such file (runs
    evaluated before it was written). A file that is not a list of entries raises ValueError naming it."""
    path = Path(run_dir) / RETAINED_SAMPLES_NAME
    if not path.is_file():
        return None
    try:
        samples = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(samples, list):
        raise ValueError(f"{path}: holds a {type(samples).__name__}, not a list of retained samples")
    for number, entry in enumerate(samples):
        problem = entry_problem(entry)
        if problem:
            raise ValueError(f"{path}: entry {number}: {problem}")
    return samples


def changed_samples(samples: Sequence[dict], domain: Optional[str] = None, set: Optional[str] = None,
                    limit: Optional[int] = None) -> list[dict]:
    """The entries of `samples` whose answer changed (math) or whose raw choice flipped (choice), in their order,
    kept to `domain` and `set` ("near" or "far") where given, at most `limit` of them (all when None)."""
    if set is not None and set not in SETS:
        raise ValueError(f"set={set!r} is not allowed: one of {', '.join(SETS)}, or None for both")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit={limit!r} is not allowed: a whole number >= 0, or None for all")
    chosen = [s for s in samples if s["changed"] and (domain is None or s["domain"] == domain)
              and (set is None or s["set"] == set)]
    return chosen if limit is None else chosen[:limit]
