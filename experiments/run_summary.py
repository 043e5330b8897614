"""What a finished run found, in a few `[result]` lines at its end (stdout and `run.log`), read from its record:
pass@1, the headline retained KL (nats per token), per retained domain the near and far KL and the share of math
answers changed / commonsense choices flipped, the train and evaluation seconds, and where the record is; and the
same numbers as one row of a sweep's summary table (`summary_row`, `table_lines`)."""

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


def summary_row(record: Optional[dict]) -> dict:
    """The numbers of a complete record as a flat row: `pass@1`, `kl` (headline, nats/token), per retained domain
    `<domain> KL` (near) and `<domain> far KL`, `<domain> changed` (share of answers changed or choices flipped,
    near), `train s`, `eval s`; {} for a record that is not complete or holds no metrics."""
    if not record or record.get("status") != "complete" or not isinstance(record.get("metrics"), dict):
        return {}
    m = record["metrics"]
    row = {"pass@1": (m.get("target") or {}).get("pass@1"), "KL": m.get("retained_kl_mean")}
    near, far = retained_near(m), retained_far(m)
    for dom, entry in near.items():
        row[f"{dom} KL"] = entry.get("kl_token_mean")
        if dom in far:
            row[f"{dom} far KL"] = far[dom].get("kl_token_mean")
        rate = _rate(entry)
        if rate:
            row[f"{dom} changed"] = rate[1]
    cost = record.get("cost") or {}
    row["train s"], row["eval s"] = cost.get("train_seconds"), cost.get("eval_seconds")
    return row


def _cell(column: str, value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if column.endswith("changed"):
        return f"{100 * value:.1f}%"
    if column.endswith(" s"):
        return f"{value:.0f}"
    return f"{value:.4f}"


def table_lines(rows: list[tuple[str, dict]]) -> list[str]:
    """A fixed-width table of (label, `summary_row`) pairs: one header line, one line per row (`-` where a run has
    no value); KL in nats/token, `changed` in percent, times in seconds. [] when no row has a number."""
    columns: list[str] = []
    for _, row in rows:
        columns += [c for c in row if c not in columns]
    if not columns:
        return []
    width = max(len(label) for label, _ in rows)
    widths = [max(len(c), 7) for c in columns]
    head = f"{'':<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(columns, widths))
    lines = [head.rstrip()]
    for label, row in rows:
        lines.append(f"{label:<{width}}  " + "  ".join(f"{_cell(c, row.get(c)):>{w}}" for c, w in zip(columns, widths)))
    return lines
