"""Figures at paper column width (3.3 in, fonts 7 pt and up), PNG and PDF, byte-identical on a re-run.

- pareto_<backbone>_<domain>: pass@1 against retained KL (nats/token, log scale; symlog, linear near 0, where the
  base model's KL of 0 is drawn: `analysis.figure_axes`) of ATLAS and the baselines (and
  pareto_ablation_<backbone>_mean: of ATLAS and its variants), one colour, marker and line style per method
  (`analysis.methods.style`); sweep-point means with 95% t-intervals over seeds (both axes, cut at the possible
  values), each method's frontier as a line (`analysis.pareto`: the lower envelope of its training runs' scale curves,
  so no line joins two runs; frontier points filled, the others hollow), post-hoc scales of one training run joined by
  a dotted line, the base model as a star on top, the requirement levels as dotted horizontal lines; a key under the
  method legend says so. pareto_<backbone>_near / _far: the same with the near or the far items' KL (mean over
  domains), for records with far items.
- answers_<backbone>: bars of the answer-level rates at the primary level (one panel per rate).
- ablation_<backbone>: bars of the ATLAS variants' KL at every requirement level.

No pyplot: figures are `matplotlib.figure.Figure` objects, so nothing global is touched.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.textpath import TextToPath
from matplotlib.transforms import blended_transform_factory

from analysis import methods as M
from analysis import pareto
from analysis.analyze import Analysis, summary_of
from analysis.figure_axes import KL_LABEL, LEVEL_DASHES, PASS_LABEL, key_handles, kl_scale, pass_limits
from analysis.pareto import domain_label, envelope_line, run_fronts
from analysis.tables import group_label

WIDTH_IN = 3.3
FONT_PT = 7
DPI = 300
RC = {
    "font.family": "DejaVu Sans",
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT + 1,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 4,
    "errorbar.capsize": 0,
    "savefig.dpi": DPI,
    "pdf.fonttype": 42,
    "svg.hashsalt": "analysis",
    "path.simplify": False,
}
LEVEL_HATCHES = ("", "////", "....", "xxxx", "\\\\\\\\", "oo")


@dataclass
class FigureSpec:
    stem: str            # file name without extension
    title: str           # what it shows (for the index)
    figure: Figure


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "x"


def _group_slug(bb: str, bench: str) -> str:
    return slug(bb) if bb == bench else f"{slug(bb)}_{slug(bench)}"


def _level_short(lv) -> str:
    """A level's short label next to its line: "75%" for gain levels, the value for absolute ones."""
    return f"{100 * lv.value:g}%" if lv.kind == "gain" else f"{lv.value:g}"


PARTIAL_ALPHA = 0.4


def _status_handles() -> list:
    return [Patch(facecolor="0.45", alpha=PARTIAL_ALPHA, edgecolor="none", label="lighter: some seeds reach"),
            Line2D([], [], linestyle="none", marker="$n.r.$", markersize=9, color="0.3", label="not reached")]


def _text_width_in(text: str) -> float:
    """Width in inches of `text` at the figures' font and size."""
    w, _, _ = TextToPath().get_text_width_height_descent(text, FontProperties(family=RC["font.family"], size=FONT_PT),
                                                         ismath=False)
    return w / 72.0


def _legend_ncol(labels: list[str], most: int = 3, handlelength: float = 1.6, columnspacing: float = 1.0) -> int:
    """Legend columns that fit the figure width: entries fill the columns top to bottom, each column as wide as its
    widest label plus the handle, the gap to the label (0.4) and the space between columns (in font sizes)."""
    extra = (handlelength + 0.4 + columnspacing) * FONT_PT / 72.0
    for ncol in range(min(most, max(1, len(labels))), 1, -1):
        rows = _legend_rows(len(labels), ncol)
        cols = [labels[i:i + rows] for i in range(0, len(labels), rows)]
        if sum(extra + max(_text_width_in(x) for x in col) for col in cols) <= WIDTH_IN - 0.15:
            return ncol
    return 1


def _legend_rows(n: int, ncol: int) -> int:
    return max(1, math.ceil(n / ncol))


def _method_handle(method: str, line: bool = True) -> Line2D:
    st = M.style(method)
    return Line2D([], [], color=st.color, marker=st.marker, linestyle=st.dashes if line else "none",
                  markersize=7 if method == M.BASE else 4, label=M.label(method))


#: Sets of retained items with a figure of their own where records have far items: KL column and title.
ITEM_SETS = {"near": (pareto.NEAR_KL_COL, "near items, mean of domains"),
             "far": (pareto.FAR_KL_COL, "far items, mean of domains")}


def has_far(a: Analysis, backbone: str, benchmark: str) -> bool:
    """Whether any record of the group carries far retained items (a far KL)."""
    if pareto.FAR_KL_COL not in a.runs.columns:
        return False
    g = a.runs[(a.runs["backbone"] == backbone) & (a.runs["benchmark"] == benchmark)]
    return bool(g[pareto.FAR_KL_COL].notna().any())


def _points(a: Analysis, backbone: str, benchmark: str, domain: str, items: Optional[str]) -> pd.DataFrame:
    if items is None:
        pts = a.points[a.points["domain"] == domain]
    else:
        pts = pareto.sweep_points(a.runs, ITEM_SETS[items][0], confidence=a.confidence)
    return pts[(pts["backbone"] == backbone) & (pts["benchmark"] == benchmark)]


def _where(a: Analysis, backbone: str, benchmark: str, domain: str, items: Optional[str]) -> str:
    far = has_far(a, backbone, benchmark)
    if items is not None:
        return ITEM_SETS[items][1]
    if domain == "mean":
        return "mean of near and far" if far else "mean of domains"
    return domain + (", near items" if far else "")


def _fit(parts: list[str], width: float = WIDTH_IN - 0.5) -> str:
    """`parts` joined by " · " on one line, or on as many lines as needed to stay within `width` inches."""
    lines = [parts[0]]
    for part in parts[1:]:
        if _text_width_in(f"{lines[-1]} · {part}") <= width:
            lines[-1] = f"{lines[-1]} · {part}"
        else:
            lines.append(part)
    return "\n".join(lines)


def _levels_text(a: Analysis) -> str:
    kinds = {lv.kind for lv in a.levels}
    if kinds == {"gain"}:
        return f"levels: % of {M.label(a.reference.method)} gain"
    return "levels: pass@1" if kinds == {"abs"} else "levels (gain %, pass@1)"


def pareto_figure(a: Analysis, backbone: str, benchmark: str, domain: str, family: str = "main",
                  items: Optional[str] = None) -> Optional[Figure]:
    """pass@1 (y, higher better) against retained KL (x, nats/token, log scale, lower better) on one backbone: ATLAS,
    the baselines and other methods (`family="main"`), or ATLAS and its variants (`family="ablation"`); the base model
    in both. KL of `domain` ("mean": the headline), or with `items` ("near" / "far") the mean over domains of that set
    of retained items. Intervals are cut to the values possible (KL >= 0, pass@1 in [0, 1])."""
    pts = _points(a, backbone, benchmark, domain, items)
    present = pts["method"].unique()
    chosen = M.main_methods(present) if family == "main" else M.ablation_methods(present)
    if family == "ablation" and not any(m != M.REFERENCE for m in chosen):
        return None
    if not chosen:
        return None
    methods = chosen + ([M.BASE] if M.BASE in present else [])
    pts = pts[pts["method"].isin(methods)].copy()
    pts["y_lo"] = pts["y_lo"].clip(lower=0.0)
    pts["x_lo"], pts["x_hi"] = pts["x_lo"].clip(lower=0.0), pts["x_hi"].clip(upper=1.0)
    spread = pts[pts["n_seeds"] >= 2]
    scale = kl_scale(pts["y_mean"], pd.concat([spread["y_lo"], spread["y_hi"]]))
    levels = [(a.threshold(backbone, benchmark, lv), lv) for lv in a.levels]
    trained = pts[pts["method"] != M.BASE]
    lines = {m: envelope_line(run_fronts(list(g["x_mean"]), list(g["y_mean"]), list(g["train_key"])))
             for m, g in trained.groupby("method", sort=True)}
    scaled = [g for _, g in trained.groupby(["method", "train_key"], sort=True) if g["scale"].nunique() > 1]
    key = key_handles(hollow=not trained["on_frontier"].astype(bool).all(),
                      front_line=any(len(line) > 1 for line in lines.values()), scales=bool(scaled),
                      seeds=(int(spread["n_seeds"].min()), int(spread["n_seeds"].max())) if len(spread) else None,
                      confidence=a.confidence, levels=_levels_text(a) if levels else "")

    labels = [M.label(m) for m in methods]
    ncol = _legend_ncol(labels, handlelength=3.0)
    kcol = _legend_ncol([h.get_label() for h in key], most=2, handlelength=1.6, columnspacing=0.8)
    plot_h = 2.35 + 0.17 * _legend_rows(len(methods), ncol)
    key_h = 0.1 + 0.15 * _legend_rows(len(key), kcol)
    fig = Figure(figsize=(WIDTH_IN, plot_h + key_h), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[plot_h, key_h], hspace=0.0)
    ax = top.add_subplot()
    for method in methods:
        st = M.style(method)
        g = pts[pts["method"] == method].sort_values(["x_mean", "y_mean", "sweep_key"], kind="mergesort")
        z = 4 if method == M.REFERENCE else 3
        sp = g[g["n_seeds"] >= 2]
        if len(sp):
            ax.errorbar(sp["y_mean"], sp["x_mean"],
                        xerr=[sp["y_mean"] - sp["y_lo"], sp["y_hi"] - sp["y_mean"]],
                        yerr=[sp["x_mean"] - sp["x_lo"], sp["x_hi"] - sp["x_mean"]],
                        fmt="none", ecolor=st.color, elinewidth=0.5, alpha=0.5, zorder=z - 1)
        if method == M.BASE:
            # On top of everything and never clipped: the base sits at KL 0, left of the log part of the axis.
            ax.plot(g["y_mean"], g["x_mean"], linestyle="none", marker=st.marker, color=st.color, markersize=8,
                    markeredgecolor="white", markeredgewidth=0.4, zorder=10, clip_on=False, gid="base")
            continue
        for tg in (t for t in scaled if t["method"].iloc[0] == method):
            tg = tg.sort_values("scale", kind="mergesort")
            ax.plot(tg["y_mean"], tg["x_mean"], linestyle=":", linewidth=0.6, color=st.color, zorder=z - 1)
        line = lines[method]
        if len(line) > 1:
            ax.plot([kl for _, kl in line], [p for p, _ in line], linestyle=st.dashes, color=st.color,
                    linewidth=1.0, zorder=z)
        front = g[g["on_frontier"].astype(bool)].sort_values(["y_mean", "x_mean"], kind="mergesort")
        ax.plot(front["y_mean"], front["x_mean"], linestyle="none", marker=st.marker, color=st.color,
                markersize=4, zorder=z + 1)
        dom = g[~g["on_frontier"].astype(bool)]
        if len(dom):
            ax.plot(dom["y_mean"], dom["x_mean"], linestyle="none", marker=st.marker, color=st.color,
                    markerfacecolor="white", markeredgecolor=st.color, markeredgewidth=0.7, markersize=4, zorder=z)
    for c, _ in levels:
        ax.axhline(c, color="0.55", linestyle=LEVEL_DASHES, linewidth=0.6, zorder=1)
    scale.apply(ax)
    ax.set_ylim(*pass_limits(pd.concat([pts["x_mean"], spread["x_lo"], spread["x_hi"],
                                        pd.Series([c for c, _ in levels], dtype=float)])))
    _label_levels(ax, levels)
    ax.set_xlabel(f"{KL_LABEL}\n{scale.note}")
    ax.set_ylabel(PASS_LABEL)
    ax.set_title(_fit([group_label(backbone, benchmark), _where(a, backbone, benchmark, domain, items)]
                      + (["ATLAS variants"] if family == "ablation" else [])), loc="left", fontsize=FONT_PT)
    ax.grid(True, linewidth=0.3, color="0.88")
    ax.grid(True, which="minor", axis="x", linewidth=0.2, color="0.94")
    ax.set_axisbelow(True)
    handles = [_method_handle(m, line=m != M.BASE) for m in methods]
    top.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False, handlelength=3.0,
               columnspacing=1.0, handletextpad=0.4)
    bottom.legend(handles=key, loc="upper center", ncol=kcol, frameon=False, handlelength=1.6, columnspacing=0.8,
                  handletextpad=0.4, borderaxespad=0.0)
    return fig


def _kl_unit(values: pd.Series) -> tuple[float, str]:
    """A power of ten that brings tiny KL values to readable tick labels, and its axis-label suffix
    (so no offset text sits on the axis label)."""
    v = pd.to_numeric(values, errors="coerce").abs().dropna()
    top = float(v.max()) if len(v) else 0.0
    if top == 0.0 or 1e-2 <= top < 1e4:
        return 1.0, ""
    e = math.floor(math.log10(top))
    return 10.0 ** -e, f" (×10$^{{{e}}}$)"


def _label_levels(ax, levels) -> None:
    """Label the requirement lines right of the axes; levels closer than 4% of the y range share a label."""
    lo, hi = ax.get_ylim()
    gap = 0.04 * (hi - lo)
    right = blended_transform_factory(ax.transAxes, ax.transData)
    groups: list[list] = []
    for c, lv in sorted(levels, key=lambda t: (t[0], t[1].value)):
        if groups and c - groups[-1][-1][0] < gap:
            groups[-1].append((c, lv))
        else:
            groups.append([(c, lv)])
    for group in groups:
        y = sum(c for c, _ in group) / len(group)
        if group[0][1].kind == "gain" and all(lv.kind == "gain" for _, lv in group):
            text = "/".join(f"{100 * lv.value:g}" for _, lv in group) + "%"
        else:
            text = "/".join(_level_short(lv) for _, lv in group)
        ax.text(1.01, y, text, transform=right, fontsize=FONT_PT, color="0.4", va="center", ha="left")


def _bar_label(ax, x: float, text: str) -> None:
    ax.annotate(text, (x, 0), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                rotation=90, fontsize=FONT_PT, color="0.3")


def answers_figure(a: Analysis, backbone: str, benchmark: str) -> Optional[Figure]:
    """Bars of the answer-level rates (percent) of the primary-level choice, one panel per rate."""
    cols = [(c, label) for c, label, better, unit in a.answer_cols if unit == "%"]
    ans = a.answers[(a.answers["backbone"] == backbone) & (a.answers["benchmark"] == benchmark)]
    methods = [m for m in M.ordered(ans["method"]) if m != M.BASE] if len(ans) else []
    if not cols or not methods:
        return None
    fig = Figure(figsize=(WIDTH_IN, 1.15 + 1.1 * len(cols)), layout="constrained")
    axes = fig.subplots(len(cols), 1, sharex=True, squeeze=False)[:, 0]
    xs = list(range(len(methods)))
    for ax, (col, label) in zip(axes, cols):
        for x, method in zip(xs, methods):
            st = M.style(method)
            gm = ans[ans["method"] == method]
            reached = gm[gm["reached"]]
            s = summary_of(reached[col], a.confidence) if len(reached) else None
            if s is None:
                _bar_label(ax, x, "n.r." if reached.empty else "n/a")
                continue
            mean, half, _ = s
            partial = len(reached) < len(gm)
            ax.bar(x, 100 * mean, width=0.7, color=st.color, alpha=PARTIAL_ALPHA if partial else 0.9,
                   edgecolor="none")
            if half is not None:
                ax.errorbar(x, 100 * mean, yerr=100 * half, fmt="none", ecolor="0.15", elinewidth=0.7)
        ax.set_title(label.replace(" (%)", ""), loc="left", fontsize=FONT_PT)
        ax.set_ylabel("% of items")
        ax.set_ylim(bottom=0)
        ax.set_xlim(-0.5, len(methods) - 0.5)
        ax.grid(True, axis="y", linewidth=0.3, color="0.88")
        ax.set_axisbelow(True)
    axes[-1].set_xticks(xs, [M.label(m) for m in methods], rotation=40, ha="right", rotation_mode="anchor")
    fig.suptitle(f"{group_label(backbone, benchmark)}: {a.primary_level.label.replace('>=', '≥')}",
                 x=0.02, ha="left", fontsize=FONT_PT + 1)
    fig.legend(handles=_status_handles(), loc="outside lower center", ncol=2, frameon=False, handlelength=1.6)
    return fig


def ablation_figure(a: Analysis, backbone: str, benchmark: str) -> Optional[Figure]:
    """Bars of the ATLAS variants' KL at matched requirement, one bar per level (hatch = level)."""
    summ = a.matched[(a.matched["backbone"] == backbone) & (a.matched["benchmark"] == benchmark)]
    methods = M.ablation_methods(summ["method"].unique()) if len(summ) else []
    if not any(m != M.REFERENCE for m in methods):
        return None
    nl = len(a.levels)
    width = 0.8 / nl
    fam = summ[summ["method"].isin(methods)]
    factor, unit = _kl_unit(pd.concat([fam["mean"], fam["hi"]]))
    fig = Figure(figsize=(WIDTH_IN, 2.3 + 0.17 * _legend_rows(nl + 2, 2)), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(methods)))
    for x, method in zip(xs, methods):
        st = M.style(method)
        for k, lv in enumerate(a.levels):
            pos = x - 0.4 + width * (k + 0.5)
            r = summ[(summ["method"] == method) & (summ["level_spec"] == lv.spec)]
            if r.empty or int(r.iloc[0]["n_reached"]) == 0:
                _bar_label(ax, pos, "n.r.")
                continue
            r = r.iloc[0]
            partial = int(r["n_reached"]) < int(r["n_seeds"])
            ax.bar(pos, factor * float(r["mean"]), width=width * 0.92, color=st.color, alpha=PARTIAL_ALPHA if partial else 0.9,
                   hatch=LEVEL_HATCHES[k % len(LEVEL_HATCHES)], edgecolor="white", linewidth=0.0)
            if not pd.isna(r["lo"]):
                m, lo_, hi_ = (factor * float(r[k]) for k in ("mean", "lo", "hi"))
                ax.errorbar(pos, m, yerr=[[m - lo_], [hi_ - m]], fmt="none", ecolor="0.15", elinewidth=0.7)
    ax.set_xticks(xs, [M.label(m) for m in methods], rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.5, len(methods) - 0.5)
    ax.set_ylabel(f"Retained KL{unit} at matched\nrequirement (lower is better)")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", linewidth=0.3, color="0.88")
    ax.set_axisbelow(True)
    ax.set_title(group_label(backbone, benchmark), loc="left")
    handles = [Patch(facecolor="0.6", edgecolor="white", hatch=LEVEL_HATCHES[k % len(LEVEL_HATCHES)],
                     label=lv.label.replace(">=", "≥")) for k, lv in enumerate(a.levels)]
    handles += _status_handles()
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False, handlelength=1.6,
               columnspacing=1.0)
    return fig


def all_figures(a: Analysis) -> tuple[list[FigureSpec], list[str]]:
    """Every figure the analysis supports, and a sentence for each figure that cannot be drawn."""
    out: list[FigureSpec] = []
    missing: list[str] = []
    for bb, bench in a.groups:
        gs = _group_slug(bb, bench)
        name = group_label(bb, bench)
        for dom in ["mean", *a.domains]:
            fig = pareto_figure(a, bb, bench, dom)
            if fig is not None:
                out.append(FigureSpec(f"pareto_{gs}_{slug(dom)}", f"Pareto: pass@1 against retained KL "
                                      f"({domain_label(dom)}) on {name}, ATLAS and baselines", fig))
        for items in ITEM_SETS if has_far(a, bb, bench) else ():
            fig = pareto_figure(a, bb, bench, "mean", items=items)
            if fig is not None:
                out.append(FigureSpec(f"pareto_{gs}_{items}", f"Pareto: pass@1 against retained KL "
                                      f"({ITEM_SETS[items][1]}) on {name}, ATLAS and baselines", fig))
        fig = pareto_figure(a, bb, bench, "mean", family="ablation")
        if fig is not None:
            out.append(FigureSpec(f"pareto_ablation_{gs}_mean", f"Pareto of ATLAS and its variants (mean over "
                                  f"retained domains) on {name}", fig))
        fig = answers_figure(a, bb, bench)
        if fig is not None:
            out.append(FigureSpec(f"answers_{gs}", f"Answer-level rates at the primary level on {name}", fig))
        else:
            missing.append(f"answers_{gs}: no answer-level metrics or no trained method on {name}")
        fig = ablation_figure(a, bb, bench)
        if fig is not None:
            out.append(FigureSpec(f"ablation_{gs}", f"ATLAS variants' KL at every level on {name}", fig))
        else:
            missing.append(f"ablation_{gs}: no runs of an ATLAS variant on {name}")
    if not a.groups:
        missing.append("no complete runs: no figure can be drawn")
    return out, missing


def save(fig: Figure, folder: Path, stem: str) -> list[Path]:
    """Write `stem.png` and `stem.pdf` without timestamps or version strings (byte-identical re-runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    png, pdf = folder / f"{stem}.png", folder / f"{stem}.pdf"
    with matplotlib.rc_context(RC):
        fig.savefig(png, format="png", dpi=DPI, metadata={"Software": None})
        fig.savefig(pdf, format="pdf", metadata={"CreationDate": None, "Producer": None, "Creator": None})
    return [png, pdf]


def render_all(a: Analysis, folder: Path) -> tuple[list[tuple[FigureSpec, list[Path]]], list[str]]:
    """Draw and save every figure into `folder`."""
    with matplotlib.rc_context(RC):
        specs, missing = all_figures(a)
    out = []
    for spec in specs:
        out.append((spec, save(spec.figure, folder, spec.stem)))
    return out, missing
