"""Everything the tables and figures show, computed once from the table of complete runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import pandas as pd

from analysis import bootstrap as BT
from analysis import matched as MT
from analysis import methods as M
from analysis import pareto, schema
from analysis.stats import summarize


@dataclass
class Analysis:
    runs: pd.DataFrame
    levels: list[MT.Level]
    primary: int                     # index into levels used by single-level tables and figures
    interpolate: bool
    confidence: float
    reference: MT.Reference          # the sweep point `gain:` levels are shares of
    domains: list[str]
    groups: list[tuple[str, str]]    # (backbone, benchmark), sorted
    # backbone, benchmark, level, level_spec, threshold, gain_lo, gain_hi (the reference's pass@1 raised to gain_lo when
    # lower), reference, reference_pass1 (the reference's pass@1 as measured)
    thresholds: pd.DataFrame
    points: pd.DataFrame             # sweep points of every domain ("mean" and each retained domain)
    matched_seed: pd.DataFrame       # per seed, KL averaged over domains, every level, trained methods
    matched: pd.DataFrame            # its summary over seeds
    paired: pd.DataFrame             # ATLAS against every other trained method
    domain_seed: pd.DataFrame        # per seed, each domain's KL, primary level (column `domain`)
    domain_matched: pd.DataFrame     # its summary over seeds (column `domain`)
    answers: pd.DataFrame            # answer-level metrics of the primary-level choice, per seed
    answer_cols: list[tuple[str, str, str, str]] = field(default_factory=list)  # (column, label, better, unit)
    pooled_seed: pd.DataFrame = field(default_factory=pd.DataFrame)  # as matched_seed, token-pooled KL
    pooled: pd.DataFrame = field(default_factory=pd.DataFrame)       # its summary over seeds
    dominance: pd.DataFrame = field(default_factory=pd.DataFrame)    # ATLAS against each method, mean and pooled KL
    # Records with far items: KL column (`pareto.NEAR_KL_COL`, ...) -> (per seed, summary) as matched_seed / matched
    variants: dict = field(default_factory=dict)
    items: Optional[BT.ItemBootstrap] = None  # ATLAS against each method, resampling problems and retained items
    domain_levels: pd.DataFrame = field(default_factory=pd.DataFrame)  # as domain_matched, every level
    # Records with far items: near and far KL column -> ATLAS against every other trained method, as `paired`
    paired_variants: dict = field(default_factory=dict)

    @property
    def primary_level(self) -> MT.Level:
        return self.levels[self.primary]

    def threshold(self, backbone: str, benchmark: str, level: MT.Level) -> float:
        t = self.thresholds
        row = t[(t["backbone"] == backbone) & (t["benchmark"] == benchmark) & (t["level_spec"] == level.spec)]
        return float(row["threshold"].iloc[0])


def answer_columns(runs: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """(column, label, better, unit) of the answer-level metrics present: per math domain the share of
    rewritten answers, per choice domain the share of flipped choices, and per domain the accuracy
    change adapted - base (shown in percent and percentage points)."""
    out = []
    for dom in pareto.domains(runs):
        pre = f"retained/{dom}/"
        if pre + "answer_change_rate" in runs.columns:
            out.append((pre + "answer_change_rate", f"{dom}: answers changed (%)", "min", "%"))
        if pre + "choice_flip_rate" in runs.columns:
            out.append((pre + "choice_flip_rate", f"{dom}: choices flipped (%)", "min", "%"))
        if pre + "adapted_accuracy" in runs.columns and pre + "base_accuracy" in runs.columns:
            out.append((pre + "accuracy_delta", f"{dom}: Δ accuracy (pp)", "max", "pp"))
    return out


def analyze(
    runs: pd.DataFrame,
    levels: Sequence[str | MT.Level] = MT.DEFAULT_LEVELS,
    primary: Optional[int] = None,
    interpolate: bool = True,
    confidence: float = 0.95,
    reference: str | MT.Reference = MT.DEFAULT_REFERENCE,
    resamples: int = BT.DEFAULT_RESAMPLES,
) -> Analysis:
    """Sweep points and frontiers of every domain, the matched-requirement values at every level (`gain:` levels
    as shares of `reference`'s gain, `analysis.matched`), the paired comparisons, the per-domain and answer-level
    values at the primary level (default: the middle level) and the per-domain values at every level; the matched
    values again with the token-pooled KL
    (`pareto.pooled_kl`, runs without it left out), and the dominance counts of ATLAS and each method with either KL
    (`analysis.matched.dominance`); and the paired bootstrap over code problems and retained items with `resamples`
    resamples (`analysis.bootstrap`), for the backbones whose records carry per-problem and per-item results."""
    BT.check_resamples(resamples)
    lv = [x if isinstance(x, MT.Level) else MT.parse_level(x) for x in levels]
    ref = MT.parse_reference(reference)
    if not lv:
        raise ValueError("no requirement levels given")
    primary = len(lv) // 2 if primary is None else primary
    if not 0 <= primary < len(lv):
        raise ValueError(f"primary level index {primary} is outside 0..{len(lv) - 1}")
    runs = runs.copy()
    doms = pareto.domains(runs)
    for dom in doms:
        pre = f"retained/{dom}/"
        if pre + "adapted_accuracy" in runs.columns and pre + "base_accuracy" in runs.columns:
            runs[pre + "accuracy_delta"] = runs[pre + "adapted_accuracy"] - runs[pre + "base_accuracy"]
    runs[pareto.POOLED_KL_COL] = pareto.pooled_kl(runs) if len(runs) else pd.Series(dtype=float)
    far = bool(len(runs)) and bool(pareto.domains(runs, "retained_far"))
    if far:
        runs[pareto.NEAR_KL_COL] = pareto.domain_mean_kl(runs, "retained")
        runs[pareto.FAR_KL_COL] = pareto.domain_mean_kl(runs, "retained_far")
        runs[pareto.FAR_POOLED_KL_COL] = pareto.pooled_kl(runs, ("retained_far",))
        runs[pareto.ALL_POOLED_KL_COL] = pareto.pooled_kl(runs, ("retained", "retained_far"))
    groups = sorted({(b, c) for b, c in zip(runs["backbone"], runs["benchmark"])}) if len(runs) else []

    trows = []
    gains = any(level.kind == "gain" for level in lv)
    for bb, bench in groups:
        lo, hi = MT.gain_range(runs, bb, bench, ref) if gains else (float("nan"), float("nan"))
        measured = MT.reference_pass1(runs, bb, bench, ref) if gains else float("nan")
        for level in lv:
            trows.append({"backbone": bb, "benchmark": bench, "level": level.label, "level_spec": level.spec,
                          "threshold": MT.threshold(level, runs, bb, bench, ref), "gain_lo": lo, "gain_hi": hi,
                          "reference": ref.spec if gains else "", "reference_pass1": measured})
    thresholds = pd.DataFrame(trows, columns=["backbone", "benchmark", "level", "level_spec", "threshold",
                                              "gain_lo", "gain_hi", "reference", "reference_pass1"])

    frames = []
    for dom in ["mean", *doms]:
        pts = pareto.sweep_points(runs, pareto.kl_column(dom), confidence=confidence)
        pts.insert(0, "domain", dom)
        frames.append(pts)
    points = pd.concat(frames, ignore_index=True)

    trained = [m for m in M.ordered(runs["method"]) if m != M.BASE] if len(runs) else []
    mseed = MT.per_seed_matched(runs, lv, schema.KL_MEAN_COL, interpolate, trained, ref)
    msum = MT.summarize_matched(mseed, confidence)
    paired = MT.compare(mseed, M.REFERENCE, None, confidence)
    pseed = MT.per_seed_matched(runs, lv, pareto.POOLED_KL_COL, interpolate, trained, ref)
    psum = MT.summarize_matched(pseed, confidence)
    dominance = pd.concat([MT.dominance(runs, M.REFERENCE, y, name) for y, name in
                     ((schema.KL_MEAN_COL, "mean"), (pareto.POOLED_KL_COL, "pooled"))], ignore_index=True)

    dseeds, dsums, dlevels = [], [], []
    for dom in doms:
        # Every level read once; the primary level's rows are the per-domain table's (domain_seed, domain_matched).
        ds_all = MT.per_seed_matched(runs, lv, pareto.kl_column(dom), interpolate, trained, ref)
        dsum_all = MT.summarize_matched(ds_all, confidence)
        ds = ds_all[ds_all["level_spec"] == lv[primary].spec].reset_index(drop=True)
        dsum = dsum_all[dsum_all["level_spec"] == lv[primary].spec].reset_index(drop=True)
        for frame in (ds, dsum, dsum_all):
            frame.insert(0, "domain", dom)
        dseeds.append(ds)
        dsums.append(dsum)
        dlevels.append(dsum_all)
    domain_seed = pd.concat(dseeds, ignore_index=True) if dseeds else pd.DataFrame(columns=["domain"])
    domain_matched = (pd.concat(dsums, ignore_index=True) if dsums
                      else pd.DataFrame(columns=["domain", *MT.SUMMARY_COLS]))
    domain_levels = (pd.concat(dlevels, ignore_index=True) if dlevels
                     else pd.DataFrame(columns=["domain", *MT.SUMMARY_COLS]))

    acols = answer_columns(runs)
    answers = _answers(runs, lv[primary], trained, [c for c, *_ in acols], ref)
    variants, paired_variants = {}, {}
    for col in (pareto.NEAR_KL_COL, pareto.FAR_KL_COL, pareto.FAR_POOLED_KL_COL, pareto.ALL_POOLED_KL_COL) if far else ():
        vseed = MT.per_seed_matched(runs, lv, col, interpolate, trained, ref)
        variants[col] = (vseed, MT.summarize_matched(vseed, confidence))
        if col in (pareto.NEAR_KL_COL, pareto.FAR_KL_COL):
            paired_variants[col] = MT.compare(vseed, M.REFERENCE, None, confidence)
    items = BT.item_bootstrap(runs, lv, interpolate, ref, confidence, resamples)
    return Analysis(runs, lv, primary, interpolate, confidence, ref, doms, groups, thresholds, points, mseed, msum,
                    paired, domain_seed, domain_matched, answers, acols, pseed, psum, dominance, variants, items,
                    domain_levels, paired_variants)


def _answers(runs: pd.DataFrame, level: MT.Level, trained: list[str], cols: list[str],
             reference: MT.Reference) -> pd.DataFrame:
    """Per seed: the answer-level metrics of the sweep point the matched requirement picks at `level`
    (least mean KL among points meeting it, without interpolation: the values come from real runs)."""
    chosen = MT.per_seed_matched(runs, [level], schema.KL_MEAN_COL, False, trained, reference).drop(
        columns=["bracket_gap"])  # measured points only: nothing is read between two
    if not cols:
        return chosen
    vals = runs.groupby(["sweep_key", "seed"], sort=True)[cols].mean().reset_index()
    return chosen.merge(vals, on=["sweep_key", "seed"], how="left")


def summary_of(values: pd.Series, confidence: float) -> Optional[tuple[float, Optional[float], int]]:
    """(mean, half-width or None, n) of the non-missing values, or None when there are none."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None
    s = summarize(v, confidence)
    return s.mean, s.half_width, s.n
