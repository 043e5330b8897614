"""Answer-level stability on the retained domains: extracted math answers and multiple-choice
choices of the base and the adapted model (EVALUATION.md, "Answer-level stability").

The extraction follows GSM8K's convention (the reference solution ends in ``#### N``) with the
usual fallback for free-form model output (the last number in the text), as lm-eval's
``gsm8k`` task does with its strict and flexible filters; it is a few lines of regular
expressions, so it is written here rather than pulled from lm-eval's filter registry.
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = ["accuracy", "answer_change_rate", "choice_flip_rate", "extract_math_answer", "normalize_number"]

# An optional sign, an optional currency sign, then digits with optional thousands commas and
# decimals (or a bare decimal such as ".5").
_NUMBER = re.compile(r"[-+\u2212]?\s?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")


def normalize_number(token: str) -> str | None:
    """Canonical text of one number: no commas, '$' or spaces, no trailing '.', sign kept
    ('+' dropped, '-0' -> '0'), integers without leading zeros, decimals without trailing
    zeros ('18.00' -> '18', '0.50' -> '0.5'). None if ``token`` holds no digit."""
    text = token.strip().replace(",", "").replace("$", "").replace(" ", "").replace("\u2212", "-")
    text = text.rstrip(".")
    if not any(ch.isdigit() for ch in text):
        return None
    sign = ""
    if text[0] in "+-":
        sign, text = ("-" if text[0] == "-" else ""), text[1:]
    if not re.fullmatch(r"\d*\.?\d*", text):
        return None
    if "." in text:
        whole, frac = text.split(".", 1)
        frac = frac.rstrip("0")
        whole = whole.lstrip("0") or "0"
        text = f"{whole}.{frac}" if frac else whole
    else:
        text = text.lstrip("0") or "0"
    if text == "0":
        sign = ""
    return sign + text


def extract_math_answer(text: str | None) -> str | None:
    """The final numeric answer of a math solution, normalised (see :func:`normalize_number`).

    If ``text`` contains ``####``, the first number after the last ``####`` (None if there is
    none there); otherwise the last number anywhere in the text. None when no number is found.
    """
    if not text:
        return None
    if "####" in text:
        match = _NUMBER.search(text.rsplit("####", 1)[1])
        return normalize_number(match.group(0)) if match else None
    matches = _NUMBER.findall(text)
    for token in reversed(matches):
        value = normalize_number(token)
        if value is not None:
            return value
    return None


def _paired(a: Sequence, b: Sequence, what: str) -> int:
    if len(a) != len(b):
        raise ValueError(f"{what}: sequences differ in length ({len(a)} vs {len(b)})")
    return len(a)


def answer_change_rate(base: Sequence[str | None], adapted: Sequence[str | None]) -> dict:
    """Share of prompts whose adapted answer differs from the base's (None vs None is the same).

    Returns ``{'rate': float, 'n': int}``; rate is NaN when n is 0.
    """
    n = _paired(base, adapted, "answer_change_rate")
    changed = sum(1 for x, y in zip(base, adapted) if x != y)
    return {"rate": changed / n if n else float("nan"), "n": n}


def accuracy(pred: Sequence[str | None], gold: Sequence[str | None]) -> dict:
    """Share of predictions equal to the gold answer; a None prediction is wrong.

    Returns ``{'accuracy': float, 'n': int}``; accuracy is NaN when n is 0.
    """
    n = _paired(pred, gold, "accuracy")
    correct = sum(1 for p, g in zip(pred, gold) if p is not None and p == g)
    return {"accuracy": correct / n if n else float("nan"), "n": n}


def choice_flip_rate(base_idx: Sequence[int], adapted_idx: Sequence[int]) -> dict:
    """Share of multiple-choice items whose chosen option index differs from the base's.

    Returns ``{'rate': float, 'n': int}``; rate is NaN when n is 0.
    """
    n = _paired(base_idx, adapted_idx, "choice_flip_rate")
    flipped = sum(1 for x, y in zip(base_idx, adapted_idx) if int(x) != int(y))
    return {"rate": flipped / n if n else float("nan"), "n": n}
