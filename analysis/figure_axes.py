"""The Pareto figures' axes and key: retained KL on a log axis (symlog where a zero is drawn: the base model's KL is 0
by definition), a pass@1 range that never collapses to a point, and the key that says what the markers, lines, bars and
level lines mean."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from matplotlib.lines import Line2D

KL_LABEL = "Retained KL (nats/token, log scale)"
PASS_LABEL = "Coding pass@1 (higher is better)"
LOG_PAD = 0.12         # decades left free beyond the extreme KL values
SYMLOG_LINSCALE = 0.5  # width of the linear piece [0, linthresh] in decades
BASE_ROOM = 0.3        # room left of KL = 0, as a share of linthresh, so the base's marker is not on the spine
MIN_PASS_SPAN = 0.1    # least pass@1 range shown (share of problems)
PASS_PAD = 0.06        # share of the pass@1 range left free above and below
LEVEL_DASHES = (0, (1, 2))
GREY = "0.35"


@dataclass(frozen=True)
class KLScale:
    """How retained KL (nats/token) is put on the x axis: `kind` "log", or "symlog" (linear on [0, linthresh]);
    `lo`, `hi` the axis limits."""

    kind: str
    linthresh: Optional[float]
    lo: float
    hi: float

    def apply(self, ax) -> None:
        """Set the x axis of `ax` to this scale and these limits."""
        if self.kind == "symlog":
            ax.set_xscale("symlog", linthresh=self.linthresh, linscale=SYMLOG_LINSCALE)
        else:
            ax.set_xscale("log")
        ax.set_xlim(self.lo, self.hi)

    @property
    def note(self) -> str:
        """The axis-label line that says where the axis is linear ("" on a plain log axis)."""
        if self.kind != "symlog":
            return "lower is better"
        return f"lower is better; linear below $10^{{{round(math.log10(self.linthresh))}}}$"


def kl_scale(means: Sequence[float], ends: Sequence[float]) -> KLScale:
    """The x scale for KL point means `means` and interval ends `ends` (nats/token, both already cut at 0): log when
    every value is positive; else symlog, linear below `linthresh`, the power of ten at or below the least positive mean
    (so every positive point lies on the log part and zeros, like the base model's, sit left of it)."""
    m = _finite(means)
    v = np.concatenate([m, _finite(ends)])
    if len(v) and (v > 0).all():
        return KLScale("log", None, float(v.min()) / 10 ** LOG_PAD, float(v.max()) * 10 ** LOG_PAD)
    pos = m[m > 0] if (m > 0).any() else v[v > 0]
    linthresh = 10.0 ** math.floor(math.log10(float(pos.min()))) if len(pos) else 1e-2
    hi = max(float(v.max()) if len(v) else 0.0, 10 * linthresh) * 10 ** LOG_PAD
    return KLScale("symlog", linthresh, -BASE_ROOM * linthresh, hi)


def pass_limits(values: Sequence[float]) -> tuple[float, float]:
    """pass@1 axis limits covering `values` with a margin, at least `MIN_PASS_SPAN` wide (so equal values, all 0 after
    a short run for instance, get a readable range), shifted to stay within [-0.02, 1.02]."""
    v = _finite(values)
    if not len(v):
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    pad = PASS_PAD * (hi - lo)
    lo, hi = lo - pad, hi + pad
    if hi - lo < MIN_PASS_SPAN:
        mid = (lo + hi) / 2
        lo, hi = mid - MIN_PASS_SPAN / 2, mid + MIN_PASS_SPAN / 2
    if lo < -0.02:
        lo, hi = -0.02, hi + (-0.02 - lo)
    if hi > 1.02:
        lo, hi = lo - (hi - 1.02), 1.02
    return lo, hi


def key_handles(*, hollow: bool, front_line: bool, scales: bool, seeds: Optional[tuple[int, int]],
                confidence: float, levels: str) -> list[Line2D]:
    """Legend entries that explain the drawing: filled markers (points on their method's frontier), hollow ones (off
    it), the frontier line, the dotted line through one training run's post-hoc scales, the error bars (t-interval
    over `seeds` = (fewest, most) seeds of a point with two or more; None: no point has two) and the level lines;
    only what the figure draws, but the filled marker and the bars always."""
    def marker(label, face):
        return Line2D([], [], linestyle="none", marker="o", markersize=4, color=GREY, markerfacecolor=face,
                      markeredgewidth=0.7, label=label)

    points = [marker("filled: on frontier", GREY)] + ([marker("hollow: off frontier", "white")] if hollow else [])
    if seeds is None:
        bars = "no bars: one seed"
    else:
        n = f"{seeds[0]}" if seeds[0] == seeds[1] else f"{seeds[0]}–{seeds[1]}"
        bars = f"bars: {100 * confidence:g}% t-interval, {n} seeds"
    points.append(Line2D([], [], linestyle="none", marker="+", markersize=8, markeredgewidth=0.5, color=GREY,
                         label=bars))
    lines = []
    if front_line:
        lines.append(Line2D([], [], color=GREY, linewidth=1.0, label="line: frontier"))
    if scales:
        lines.append(Line2D([], [], color=GREY, linewidth=0.6, linestyle=":", label="dotted: a run's scales"))
    if levels:
        lines.append(Line2D([], [], color="0.55", linestyle=LEVEL_DASHES, linewidth=0.6, label=levels))
    return points + lines


def _finite(values: Sequence[float]) -> np.ndarray:
    a = np.asarray(list(values), dtype=float)
    return a[np.isfinite(a)]
