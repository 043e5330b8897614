"""What a finished run found, in a few `[result]` lines at its end (stdout and `run.log`), read from its record:
pass@1, the headline retained KL (nats per token), per retained domain the near and far KL and the share of math
answers changed / commonsense choices flipped, the train and evaluation seconds, and where the record is."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from suite_schema.layout import retained_far, retained_near

RATE_KEYS = ("answer_change_rate", "choice_flip_rate")


def _rate(entry: dict) -> Optional[tuple[str, float]]:
    for key in RATE_KEYS:
        value = (entry.get(key) or {}).get("rate")
        if isinstance(value, (int, float)):
            return ("answers changed" if key == "answer_change_rate" else "choices flipped"), float(value)
    return None


def summary_lines(record: dict, path: Path) -> list[str]:
    """The `[result]` lines of a complete record stored at `path` (without the tag)."""
    m = record["metrics"]
    target = m["target"]
    near, far = retained_near(m), retained_far(m)
    kl_what = "mean of near and far" if far else "mean over domains"
    lines = [f"pass@1 {target['pass@1']:.4f} on {target.get('n_problems', '?')} problems; retained KL "
             f"{m['retained_kl_mean']:.4f} nats/token ({kl_what})"]
    width = max((len(d) for d in near), default=0)
    for dom, entry in near.items():
        parts = [f"near KL {entry['kl_token_mean']:.4f}"]
        if dom in far:
            parts.append(f"far KL {far[dom]['kl_token_mean']:.4f}")
        rate = _rate(entry)
        if rate:
            what, value = rate
            far_rate = _rate(far[dom]) if dom in far else None
            parts.append(f"{what} {100 * value:.1f}%" + (f" near, {100 * far_rate[1]:.1f}% far" if far_rate else ""))
        lines.append(f"  {dom:<{width}}  " + ", ".join(parts))
    cost = record.get("cost") or {}
    seconds = [f"{name} {cost[key]:.0f} s" for name, key in (("train", "train_seconds"), ("eval", "eval_seconds"))
               if isinstance(cost.get(key), (int, float))]
    lines.append((", ".join(seconds) + "; " if seconds else "") + f"record {path}")
    return lines
