"""A small table model rendered to Markdown and to LaTeX (booktabs), with the best value in bold.

Cells carry their display text (Markdown flavour, with a few Unicode symbols that the LaTeX
renderer translates) and optionally the number that competes for "best" in its column. Rows may
belong to groups (e.g. one per backbone): the best value is found within each group, and LaTeX
separates groups with a rule. A table without inputs renders its `absent` sentence instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

DASH = "—"


@dataclass(frozen=True)
class Cell:
    text: str
    value: Optional[float] = None     # competes for the column's best when not None

    @staticmethod
    def of(text: str) -> "Cell":
        return Cell(text, None)


@dataclass
class Table:
    name: str                               # file stem
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)   # group label per row ("" = no groups)
    group_header: str = ""                  # header of the group column, when groups are used
    best: dict[int, str] = field(default_factory=dict)  # column index -> "min" | "max"
    align: list[str] = field(default_factory=list)      # "l" | "r" per column (default: first l, rest r)
    notes: list[str] = field(default_factory=list)
    absent: Optional[str] = None            # why there is nothing to show

    def bold_mask(self) -> list[list[bool]]:
        """Per cell, whether it is bold: in each `best` column and row group, the best of at least two differing
        values (cells without a value do not compete)."""
        mask = [[False] * len(r) for r in self.rows]
        groups = self.groups or [""] * len(self.rows)
        for col, direction in self.best.items():
            by_group: dict[str, list[int]] = {}
            for i, g in enumerate(groups):
                by_group.setdefault(g, []).append(i)
            for idx in by_group.values():
                vals = [(i, self.rows[i][col].value) for i in idx if self.rows[i][col].value is not None
                        and not math.isnan(self.rows[i][col].value)]
                # Nothing to single out: fewer than two rows with a value (a lone value beats nobody, e.g. the one
                # method reaching a level), or every competitor tied.
                if len(vals) < 2 or len({v for _, v in vals}) == 1:
                    continue
                target = min(v for _, v in vals) if direction == "min" else max(v for _, v in vals)
                for i, v in vals:
                    if v == target:
                        mask[i][col] = True
        return mask


# ---- number formatting ---------------------------------------------------------------------

def _decimals(x: float, sig: int) -> Optional[int]:
    """Decimals giving `sig` significant digits in fixed notation, or None for scientific notation."""
    a = abs(x)
    if a == 0:
        return sig - 1
    if a < 1e-3 or a >= 1e6:
        return None
    return max(0, sig - 1 - math.floor(math.log10(a)))


def fmt_num(x: Optional[float], sig: int = 3, decimals: Optional[int] = None) -> str:
    """`x` with `sig` significant digits (fixed notation from 1e-3 to 1e6, else scientific); — for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0" if decimals is None else f"{0.0:.{decimals}f}"
    d = _decimals(x, sig) if decimals is None else decimals
    if d is None:
        return f"{x:.{sig - 1}e}"
    return f"{x:.{d}f}"


def fmt_ci(mean: Optional[float], half: Optional[float], sig: int = 3) -> str:
    """`mean ± half` with the half-width at the mean's precision; the mean alone when half is None."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return DASH
    d = _decimals(mean, sig) if mean != 0 else (_decimals(half, sig) if half else sig - 1)
    m = fmt_num(mean, sig, d)
    if half is None or (isinstance(half, float) and math.isnan(half)):
        return m
    h = f"{half:.{sig - 1}e}" if d is None else f"{half:.{d}f}"
    return f"{m} ± {h}"


def fmt_interval(lo: Optional[float], hi: Optional[float], sig: int = 2) -> str:
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "n/a"
    return f"[{fmt_num(lo, sig)}, {fmt_num(hi, sig)}]"


def fmt_p(p: Optional[float]) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    if p < 0.001:
        return "<0.001"
    return f"{p:.3f}"


def fmt_count(x: Optional[float]) -> str:
    """Large counts with K/M/G suffixes (params, tokens)."""
    if x is None or math.isnan(x):
        return DASH
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{fmt_num(x / div, 3)}{suffix}"
    return fmt_num(x, 3) if x != int(x) else str(int(x))


def fmt_bytes(x: Optional[float]) -> str:
    if x is None or math.isnan(x):
        return DASH
    for div, suffix in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if abs(x) >= div:
            return f"{fmt_num(x / div, 3)} {suffix}"
    return f"{int(round(x))} B"


# ---- Markdown ------------------------------------------------------------------------------

def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(table: Table) -> str:
    out = [f"# {table.title}", ""]
    if table.absent is not None:
        out += [f"_{_md_escape(table.absent)}_", ""]
        return "\n".join(out)
    grouped = bool(table.groups) and any(table.groups)
    header = ([table.group_header] if grouped else []) + table.columns
    aligns = (["l"] if grouped else []) + [_align(table, j) for j in range(len(table.columns))]
    out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    out.append("|" + "|".join(":---" if a == "l" else "---:" for a in aligns) + "|")
    mask = table.bold_mask()
    prev = None
    for i, row in enumerate(table.rows):
        cells = []
        if grouped:
            g = table.groups[i]
            cells.append(_md_escape(g) if g != prev else "")
            prev = g
        for j, cell in enumerate(row):
            text = _md_escape(cell.text)
            cells.append(f"**{text}**" if mask[i][j] and text else text)
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for note in table.notes:
        out += [_md_escape(note), ""]
    return "\n".join(out)


def _align(table: Table, j: int) -> str:
    if j < len(table.align):
        return table.align[j]
    return "l" if j == 0 else "r"


# ---- LaTeX ---------------------------------------------------------------------------------

_TEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
    "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}
_TEX_SYMBOLS = {"±": r"$\pm$", "≥": r"$\geq$", "≤": r"$\leq$", DASH: "---", "†": r"$^\dagger$", "Δ": r"$\Delta$",
                "−": "-", "×": r"$\times$", "<": r"\textless{}", ">": r"\textgreater{}"}


def tex_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch in _TEX_SPECIAL:
            out.append(_TEX_SPECIAL[ch])
        elif ch in _TEX_SYMBOLS:
            out.append(_TEX_SYMBOLS[ch])
        else:
            out.append(ch)
    s = "".join(out)
    # A minus sign, not a hyphen, before numbers.
    s = re.sub(r"(?<![\w.])-(?=\.?\d)", r"$-$", s)
    # Keep the interval brackets of "[a, b]" from being read as optional arguments after a macro.
    return re.sub(r"^\[", "{[}", s)


def to_latex(table: Table) -> str:
    label = "tab:" + re.sub(r"[^A-Za-z0-9:-]", "-", table.name)
    out = [f"% {table.title}", "% Generated by `python -m analysis report`; requires \\usepackage{booktabs}."]
    if table.absent is not None:
        out += [r"\begin{table}[t]", r"\centering", r"\emph{" + tex_escape(table.absent) + "}",
                r"\caption{" + tex_escape(table.title) + "}", r"\label{" + label + "}", r"\end{table}", ""]
        return "\n".join(out)
    grouped = bool(table.groups) and any(table.groups)
    header = ([table.group_header] if grouped else []) + table.columns
    spec = ("l" if grouped else "") + "".join(_align(table, j) for j in range(len(table.columns)))
    out += [r"\begin{table}[t]", r"\centering", r"\small", r"\begin{tabular}{" + spec + "}", r"\toprule",
            " & ".join(tex_escape(h) for h in header) + r" \\", r"\midrule"]
    mask = table.bold_mask()
    prev = None
    for i, row in enumerate(table.rows):
        cells = []
        if grouped:
            g = table.groups[i]
            if prev is not None and g != prev:
                out.append(r"\midrule")
            cells.append(tex_escape(g) if g != prev else "")
            prev = g
        for j, cell in enumerate(row):
            text = tex_escape(cell.text)
            cells.append(r"\textbf{" + text + "}" if mask[i][j] and text else text)
        out.append(" & ".join(cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    caption = tex_escape(table.title.rstrip(".") + ".")
    if table.notes:
        caption += " " + " ".join(tex_escape(n) for n in table.notes)
    out += [r"\caption{" + caption + "}", r"\label{" + label + "}", r"\end{table}", ""]
    return "\n".join(out)


def column_values(rows: Sequence[Sequence[Cell]], j: int) -> list[Optional[float]]:
    return [r[j].value for r in rows]
