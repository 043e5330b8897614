"""Which post-hoc scales to evaluate after the fixed ones so that a run's pass@1-vs-KL curve has no wide pass@1 gap.

A trained run's records at its scales alpha (W0 + alpha * Delta) are the points of its curve; analysis reads the
matched KL linearly between two adjacent points (`analysis.pareto.front_value`), so the wider their pass@1 gap the
coarser that reading. The levels are not known when a run is evaluated (shares of a reference point's gain), so the
refinement looks at gaps only: while some pair of adjacent measured scales differs in pass@1 by more than `max_gap`,
evaluate the midpoint of the pair whose gap is widest (the lower pair on a tie), rounded to `DECIMALS` decimals so its
record folder is the same every time; stop when no gap exceeds `max_gap`, when `max_evals` scales were added, or when
every interval still too wide in pass@1 is too narrow in alpha to halve (halves under `MIN_WIDTH`). The same measured
points give the same refined scales. The base's pass@1 is known only when scale 0 is among the fixed scales; else the
interval below the lowest scale is not refined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

#: Refined scales are rounded to this many decimals (their record folder is `scales/<alpha>`).
DECIMALS = 4
#: An interval is halved only while each half is at least this wide in alpha (to the rounding above).
MIN_WIDTH = 1 / 64
#: pass@1 gaps within this of `max_gap` count as meeting it, and gaps within it of each other as equal.
GAP_TOL = 1e-9

STOP_GAP = "max_gap"  # every gap between adjacent measured scales is at most max_gap
STOP_EVALS = "max_evals"  # the budget is spent while a gap above max_gap could still be halved
STOP_WIDTH = "min_width"  # gaps above max_gap remain, each between scales too close to halve


def gaps(measured: Mapping[float, float]) -> list[tuple[float, float, float]]:
    """(lower scale, upper scale, |pass@1 difference|) of each pair of adjacent measured scales, scales ascending;
    a pair where either pass@1 is unknown (None or NaN) is left out."""
    points = sorted((float(a), None if p is None or math.isnan(p) else float(p)) for a, p in measured.items())
    return [(a, b, abs(pb - pa)) for (a, pa), (b, pb) in zip(points, points[1:]) if pa is not None and pb is not None]


def widest_gap(measured: Mapping[float, float]) -> Optional[float]:
    """The widest pass@1 gap between adjacent measured scales (share of problems), None with fewer than two."""
    found = [g for _, _, g in gaps(measured)]
    return max(found) if found else None


def halvable(lo: float, hi: float, min_width: float = MIN_WIDTH) -> bool:
    """Whether the interval [lo, hi] of scales may be halved: each half at least `min_width` wide, up to the
    rounding of scales to `DECIMALS` decimals."""
    return hi - lo >= 2 * min_width - 10 ** -DECIMALS


def next_scale(measured: Mapping[float, float], max_gap: float, min_width: float = MIN_WIDTH) -> Optional[float]:
    """The next scale to evaluate: the midpoint, rounded to `DECIMALS` decimals, of the adjacent pair of measured
    scales with the widest pass@1 gap above `max_gap` among the pairs that may still be halved (`halvable`), the
    lowest such pair on a tie; None when there is none."""
    best = None
    for lo, hi, gap in gaps(measured):
        if gap <= max_gap + GAP_TOL or not halvable(lo, hi, min_width):
            continue
        if best is None or gap > best[2] + GAP_TOL:
            best = (lo, hi, gap)
    return None if best is None else round((best[0] + best[1]) / 2, DECIMALS)


@dataclass(frozen=True)
class Refinement:
    """What one refinement did: the scales it added in the order it evaluated them, why it stopped (`STOP_GAP`,
    `STOP_EVALS` or `STOP_WIDTH`) and the widest pass@1 gap left between adjacent measured scales."""

    added: list[float]
    stopped: str
    widest_gap: Optional[float]


def refine(measured: Mapping[float, float], measure: Callable[[float], Optional[float]], max_gap: float,
           max_evals: int, min_width: float = MIN_WIDTH) -> Refinement:
    """Evaluate `next_scale` with `measure(alpha)` (its pass@1, share of problems) until it is None or `max_evals`
    scales were added; `measured`: the pass@1 at each scale already evaluated (not changed)."""
    points = {float(a): p for a, p in measured.items()}
    added: list[float] = []
    alpha = next_scale(points, max_gap, min_width)
    while alpha is not None and len(added) < max_evals:
        points[alpha] = measure(alpha)
        added.append(alpha)
        alpha = next_scale(points, max_gap, min_width)
    widest = widest_gap(points)
    if alpha is not None:
        stopped = STOP_EVALS
    elif widest is not None and widest > max_gap + GAP_TOL:
        stopped = STOP_WIDTH
    else:
        stopped = STOP_GAP
    return Refinement(added, stopped, widest)


def covers(done: Mapping, wanted: Mapping) -> bool:
    """Whether a refinement that ran with the settings in `done` and ended as `done` says (`stopped`) evaluated every
    scale a refinement with the settings `wanted` would (`settings`). Which interval is halved next does not depend on
    the stopping rule, so `wanted`'s scales are the first of `done`'s when it has the same minimum width, a `max_gap`
    not smaller, and a budget not larger or `done` stopped before spending its own."""
    if done.get("stopped") not in (STOP_GAP, STOP_EVALS, STOP_WIDTH):
        return False
    try:
        rule = done["min_width"] == wanted["min_width"] and wanted["max_gap"] >= done["max_gap"]
        budget = wanted["max_evals"] <= done["max_evals"] or done["stopped"] != STOP_EVALS
    except (KeyError, TypeError):  # a record written by other code may hold anything
        return False
    return bool(rule and budget)


def settings(max_gap: float, max_evals: int) -> dict:
    """The settings a run's record names its refinement by (and completeness compares): max_gap, max_evals and the
    minimum width in alpha."""
    return {"max_gap": float(max_gap), "max_evals": int(max_evals), "min_width": MIN_WIDTH}
