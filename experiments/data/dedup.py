"""Exact and near-duplicate detection between dataset splits (questions, docstrings, code bodies).

Three notions, from strict to loose:

- **exact**: the same text, byte for byte.
- **normalised**: the same text after `normalise_text` (case, punctuation and spacing ignored).
- **near**: for prose, a similarity of at least `NEAR_DUPLICATE_THRESHOLD` between two token
  sequences (`similarity`, difflib's ratio: 2 x matched tokens / total tokens) after the caller has
  masked what varies by design (names, numbers); for code, the same *skeleton*
  (`code_skeleton`): identical token structure once identifiers are renamed in order of
  appearance and number and string literals are masked — a "type-2 clone" in clone-detection
  terms, i.e. the same program up to renaming and constants.

Written here because the deduplication tools of the field (MinHash/LSH in `datasketch`,
text-dedup pipelines) are built for millions of web documents and approximate Jaccard over
shingles; the splits compared here are a few thousand short, templated items, where exact
pairwise comparison is cheap and a masked, order-aware ratio is the measure that matters.
"""

from __future__ import annotations

import builtins
import difflib
import io
import keyword
import re
import textwrap
import tokenize
from typing import Iterable, Sequence

#: Two prose items are near-duplicates when the difflib ratio of their masked token sequences is
#: at least this (1.0 = identical sequences).
NEAR_DUPLICATE_THRESHOLD = 0.8

_WORD = re.compile(r"[A-Za-z_]+|\d+|[^\sA-Za-z_\d]")
_KEEP_NAMES = set(keyword.kwlist) | set(dir(builtins))


def normalise_text(text: str) -> str:
    """Lower-case words and numbers of `text`, single-spaced (punctuation and spacing dropped)."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def words(text: str) -> list[str]:
    """`text` as word, number and punctuation tokens."""
    return _WORD.findall(text)


def code_skeleton(body: str) -> str:
    """A function body's structure: identifiers renamed `v0, v1, ...` in order of appearance
    (keywords and builtins kept), numbers -> `N`, strings -> `S`, layout as INDENT/DEDENT/`;`.

    Bodies that do not tokenise fall back to their whitespace-collapsed text.
    """
    source = textwrap.dedent(body)
    names: dict[str, str] = {}
    out: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and tok.string not in _KEEP_NAMES:
                out.append(names.setdefault(tok.string, f"v{len(names)}"))
            elif tok.type == tokenize.NUMBER:
                out.append("N")
            elif tok.type == tokenize.STRING:
                out.append("S")
            elif tok.type == tokenize.NEWLINE:
                out.append(";")
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
                out.append(tokenize.tok_name[tok.type])
            elif tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                continue
            else:
                out.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return " ".join(source.split())
    return " ".join(out)


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """difflib's ratio of two token sequences: 2 x matched tokens / (len(a) + len(b)), in [0, 1]."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def shared(a: Iterable[str], b: Iterable[str]) -> int:
    """How many distinct keys occur in both collections."""
    return len(set(a) & set(b))


def near_pairs(a: Iterable[tuple[str, ...]], b: Iterable[tuple[str, ...]],
               threshold: float = NEAR_DUPLICATE_THRESHOLD) -> tuple[int, float]:
    """(pairs at or above `threshold`, highest similarity) between two sets of token sequences.

    Both sides are deduplicated first, so templated data with a few hundred distinct masked
    forms compares in milliseconds.
    """
    ua, ub = sorted(set(a)), sorted(set(b))
    count, best = 0, 0.0
    for x in ua:
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(x)
        for y in ub:
            matcher.set_seq1(y)
            # real_quick_ratio >= quick_ratio >= ratio: skip pairs that can neither reach the
            # threshold nor raise the maximum
            bound = min(best, threshold - 1e-12)
            if matcher.real_quick_ratio() <= bound or matcher.quick_ratio() <= bound:
                continue
            r = matcher.ratio()
            best = max(best, r)
            count += r >= threshold
    return count, best
