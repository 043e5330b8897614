"""Synthetic result records in the runtime's record layout, with values chosen by the test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from suite_schema import registry, run_identity

KNOBS = {
    "atlas": {"rank": 8, "alpha": 16, "gate_temperature": 1.0, "gate_quantile": 0.9, "target_modules": None},
    "lora": {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": None},
}


def today(method: str) -> dict:
    """The definition keys of a registered method at today's values (`run_identity.DEFINITION_KEYS`), so a synthetic
    record of, say, `ewc` is read as today's EWC and not one made under its earlier definition."""
    values = registry.methods()[method].values if method in registry.methods() else {}
    return {k: values[k] for k in run_identity.DEFINITION_KEYS if k in values}


def record(
    method: str,
    seed: int,
    pass1: float,
    kl: Optional[dict[str, float]] = None,
    *,
    backbone: str = "micro",
    benchmark: str = "micro",
    steps: int = 300,
    lr: float = 1e-3,
    knobs: Optional[dict] = None,
    scale: Optional[float] = None,
    status: str = "complete",
    rates: Optional[dict[str, float]] = None,
    cost: Optional[dict[str, float]] = None,
    run_id: Optional[str] = None,
    end_time: str = "2026-01-01T00:00:00+00:00",
    split: Optional[str] = None,
    earlier: bool = False,
) -> dict:
    """A record; `kl` maps domain -> kl_token_mean (default math 0.1, commonsense 0.2), `rates` maps
    "math" -> answer_change_rate and "commonsense" -> choice_flip_rate. The method's definition keys are today's
    unless `knobs` sets them; `earlier`: left out, as in a record made before they existed."""
    kl = {"math": 0.1, "commonsense": 0.2} if kl is None else kl
    knobs = dict(KNOBS.get(method, {"rank": 8}) if knobs is None else knobs)
    if not earlier:
        knobs = {**today(method), **knobs}
    config = {"method": {"_target_": f"pkg.{method}", "name": method, **knobs}, "backbone": {"name": backbone},
              "benchmark": {"name": benchmark, **({"split": split} if split else {})}, "train": {"steps": steps, "lr": lr, "warmup_steps": 10},
              "eval": {"max_new_tokens_code": 64}, "seed": seed}
    if run_id is None:
        blob = json.dumps({"c": config, "scale": scale}, sort_keys=True)
        run_id = hashlib.sha256(blob.encode()).hexdigest()[:16]
    rec: dict[str, Any] = {
        "schema_version": 1, "run_id": run_id, "status": status, "method": method, "backbone": backbone,
        "benchmark": benchmark, "seed": seed, "knobs": {"name": method, **knobs}, "config": config,
        "started": "2026-01-01T00:00:00+00:00",
    }
    if status != "complete":
        return rec
    rates = rates or {}
    retained = {}
    for dom, value in kl.items():
        entry: dict[str, Any] = {"kl_token_mean": value, "kl_seq_mean": 10 * value, "n_tokens": 4000, "n": 40,
                                 "kl_storage": "full"}
        if dom == "math":
            entry["answer_change_rate"] = {"rate": rates.get("math", 0.1), "n": 40}
            entry["base_accuracy"] = {"accuracy": 0.5, "n": 40}
            entry["adapted_accuracy"] = {"accuracy": 0.5 - rates.get("math", 0.1) / 2, "n": 40}
        else:
            entry["choice_flip_rate"] = {"rate": rates.get(dom, 0.05), "n": 40}
            entry["choice_flip_rate_norm"] = {"rate": rates.get(dom, 0.05), "n": 40}
            entry["base_accuracy"] = {"accuracy": 0.6, "n": 40}
            entry["adapted_accuracy"] = {"accuracy": 0.6, "n": 40}
            entry["base_accuracy_norm"] = {"accuracy": 0.6, "n": 40}
            entry["adapted_accuracy_norm"] = {"accuracy": 0.6, "n": 40}
        retained[dom] = entry
    rec["metrics"] = {
        "target": {"pass@1": pass1, "pass@5": min(1.0, pass1 + 0.1), "n_samples": 5, "n_problems": 100,
                   "failures": {"failed": 10}},
        "retained": retained,
        "retained_kl_mean": sum(kl.values()) / len(kl) if kl else float("nan"),
    }
    rec["train"] = {"steps": steps, "final_loss": 0.5, "losses": [1.0, 0.5], "resumed_from": None}
    rec["cost"] = {"train_seconds": 10.0, "tokens_seen": 1e5, "peak_memory_bytes": 1e9, "trainable_params": 1000,
                   "total_params": 10 ** 6, "stored_bytes": 4000, "decode_tokens_per_s": 50.0, "eval_seconds": 5.0,
                   **(cost or {})}
    rec["timing"] = {}
    rec["provenance"] = {"git_sha": "abc", "git_dirty": False, "packages": {}, "host": "h",
                         "start_time": "2026-01-01T00:00:00+00:00", "end_time": end_time}
    if scale is not None:
        rec["scale"] = scale
    return rec


def write(root: Path, rec: Any, subdir: Optional[str] = None, text: Optional[str] = None) -> Path:
    """Write `rec` (or raw `text`) as `<root>/<subdir or run_id>/record.json`."""
    name = subdir or (rec["run_id"] if isinstance(rec, dict) else "x")
    path = Path(root) / name / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else json.dumps(rec, indent=1))
    return path


def sweep(method: str, points: list[tuple[int, list[tuple[float, float]]]], **kw) -> list[dict]:
    """Records of one method: `points` = [(steps, [(pass@1, kl_mean) per seed 0, 1, ...]), ...]; the KL
    is split evenly (math = commonsense = kl_mean)."""
    out = []
    for steps, per_seed in points:
        for seed, (p1, kl) in enumerate(per_seed):
            out.append(record(method, seed, p1, {"math": kl, "commonsense": kl}, steps=steps, **kw))
    return out


def scenario() -> list[dict]:
    """A small sweep on two backbones with base runs, two baselines, ATLAS and one ablation."""
    recs = []
    for bb in ("micro", "qwen3-8b"):
        bench = "micro" if bb == "micro" else "paper"
        kw = dict(backbone=bb, benchmark=bench)
        recs += [record("base", s, 0.10, {"math": 0.0, "commonsense": 0.0}, **kw) for s in range(3)]
        recs += sweep("atlas", [(100, [(0.20, 0.010), (0.22, 0.012), (0.21, 0.011)]),
                                (300, [(0.30, 0.020), (0.31, 0.022), (0.29, 0.021)]),
                                (900, [(0.35, 0.050), (0.36, 0.052), (0.34, 0.055)])], **kw)
        recs += sweep("lora", [(100, [(0.22, 0.030), (0.23, 0.032), (0.21, 0.031)]),
                               (300, [(0.32, 0.060), (0.33, 0.066), (0.31, 0.062)]),
                               (900, [(0.38, 0.120), (0.37, 0.125), (0.39, 0.130)])], **kw)
        recs += sweep("ewc", [(300, [(0.25, 0.040), (0.24, 0.041), (0.26, 0.043)])], **kw)
        recs += sweep("atlas_nogate", [(300, [(0.31, 0.040), (0.30, 0.045), (0.32, 0.042)])], **kw)
    return recs


def retained_item(index: int, kind: str, changed: bool, *, domain: Optional[str] = None, set_: str = "near",
                  prompt: Optional[str] = None, **fields) -> dict:
    """One entry of a run's `retained_samples.json`: a math item (answers "1" vs "2" when changed) or a choice item
    (choice 0 vs 1 when changed)."""
    item: dict[str, Any] = {"set": set_, "domain": domain or ("math" if kind == "math" else "commonsense"),
                            "kind": kind, "index": index, "id": None, "prompt": prompt or f"{kind} question {index}"}
    if kind == "math":
        item.update(gold="1", base_answer="1", adapted_answer="2" if changed else "1", base_text="so the answer is 1",
                    adapted_text=f"so the answer is {'2' if changed else '1'}")
    else:
        item.update(gold=0, choices=["the first", "the second"], base_choice=0, adapted_choice=1 if changed else 0,
                    base_choice_norm=0, adapted_choice_norm=1 if changed else 0)
    item["changed"] = changed
    return {**item, **fields}


def code_item(task_id: str, index: int, passed: bool, completion: str = "    return x", kind: str = "greedy") -> dict:
    """One entry of a run's `code_samples.json`, as `experiments.evaluation.evaluate` stores it."""
    return {"task_id": task_id, "kind": kind, "index": index, "completion": completion,
            "status": "passed" if passed else "failed", "reason": "" if passed else "AssertionError: wrong answer"}


def write_samples(record_path: Path, retained: Optional[list] = None, code: Optional[list] = None) -> None:
    """Write `retained_samples.json` and/or `code_samples.json` next to a record (None: not written)."""
    for name, data in (("retained_samples.json", retained), ("code_samples.json", code)):
        if data is not None:
            (Path(record_path).parent / name).write_text(json.dumps(data, indent=1))
