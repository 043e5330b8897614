"""The paper's tables, built from an `Analysis`: each a `render.Table`, written as Markdown and LaTeX.

- main:      KL at the matched coding requirement, ATLAS and the baselines, every level
- verdict:   per method and level, whether ATLAS keeps less headline, near and far KL (Holm-corrected paired tests;
             records with far items only)
- main_pooled: the same with the token-pooled KL (every scored token of every domain weighs the same)
- main_near, main_far, main_far_pooled, main_all_pooled: the same with the near or far items' KL (records with far
  items only; their main table's KL is the pre-registered headline)
- main_<domain>: the same with one retained domain's KL alone, every level (one table per domain)
- paired:    ATLAS against each other method at every level (paired over seeds), raw and Holm-corrected p
- paired_near, paired_far: the same for the near and for the far items' KL (records with far items only)
- paired_items: the same difference's interval and p from resampling code problems and retained items (only for
             records carrying per-problem and per-item results)
- dominance: the share of ATLAS's measured points a same-seed point of each method dominates, and the reverse
- ablations: the ATLAS variants at every level, and their paired difference to ATLAS
- backbones: KL at the primary level, one column per backbone
- domains:   each retained domain's KL at the primary level (each domain matched on its own KL)
- answers:   answer-level stability of the primary-level choice (rewritten answers, flipped choices)
- costs:     trainable parameters, stored bytes, train seconds, decode tokens/s
- dev_candidates: every dev candidate per method and whether the test records hold it (only with dev records)
"""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from analysis import methods as M
from analysis import pareto, schema
from analysis.analyze import Analysis, summary_of
from analysis.matched import Level, widest_gaps
from analysis.render import DASH, Cell, Table, fmt_bytes, fmt_ci, fmt_count, fmt_interval, fmt_num, fmt_p

NOT_REACHED = "not reached"


def group_label(backbone: str, benchmark: str) -> str:
    return backbone if backbone == benchmark else f"{backbone} ({benchmark})"


def _f(x) -> Optional[float]:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def matched_cell(row: Optional[pd.Series]) -> Cell:
    """`mean ± half-width` over the seeds reaching the level; `(k/n seeds)` when only some do (not bold);
    `not reached (0/n seeds)` when none does."""
    if row is None:
        return Cell(DASH)
    n, k = int(row["n_seeds"]), int(row["n_reached"])
    if k == 0:
        return Cell(f"{NOT_REACHED} (0/{n} seeds)" if n > 1 else NOT_REACHED)
    lo, hi = _f(row["lo"]), _f(row["hi"])
    half = None if lo is None else 0.5 * (hi - lo)
    text = fmt_ci(_f(row["mean"]), half)
    if k < n:
        return Cell(f"{text} ({k}/{n} seeds)")
    return Cell(text if n > 1 else f"{text} (1 seed)", _f(row["mean"]))


def _level_notes(a: Analysis, levels: list[Level]) -> list[str]:
    notes = []
    for bb, bench in a.groups:
        parts = []
        for lv in levels:
            c = a.threshold(bb, bench, lv)
            parts.append(f"{lv.label}: pass@1 ≥ {fmt_num(c)}" if lv.kind == "gain" else lv.label.replace(">=", "≥"))
        t = a.thresholds[(a.thresholds["backbone"] == bb) & (a.thresholds["benchmark"] == bench)]
        gain = ""
        if any(lv.kind == "gain" for lv in levels) and len(t):
            lo, ref = float(t["gain_lo"].iloc[0]), float(t["reference_pass1"].iloc[0])
            gain = (f" (gain of {a.reference.label} over the base model: pass@1 from {fmt_num(lo)} to {fmt_num(ref)}"
                    + ("; none: every gain level is the base's pass@1" if ref <= lo else "") + ")")
        notes.append(f"Levels on {group_label(bb, bench)}{gain}: " + "; ".join(parts) + ".")
    return notes


def _kl_note(a: Analysis, what: str = "retained KL (token mean, averaged over retained domains)") -> str:
    how = ("linearly interpolated to the level along each training run's post-hoc scale curve, the least over "
           "the method's runs"
           if a.interpolate else "least value among the method's sweep points meeting the level")
    return (f"Cells: {what} at the matched coding requirement, {how}, per seed; mean ± half-width of the "
            f"{int(a.confidence * 100)}% t-interval over seeds. (k/n seeds): only k of n seeds reach the level; "
            "mean over those, not bold. Bold: lowest among methods reaching the level on every seed, where at least "
            "two do (a lone value is not bold).")


def gap_notes(a: Analysis, seeds: pd.DataFrame, methods: list[str], data_file: str) -> list[str]:
    """Per backbone and benchmark, how many of the methods' per-seed values were read between two measured points and
    the widest pass@1 gap they bridge (`analysis.matched.widest_gaps`); nothing without interpolation."""
    if not a.interpolate or seeds.empty:
        return []
    notes = []
    for _, r in widest_gaps(seeds, methods).iterrows():
        where = group_label(r["backbone"], r["benchmark"])
        if not r["n_bracketed"]:
            notes.append(f"Interpolation on {where}: no per-seed value lies between two measured points.")
            continue
        notes.append(f"Interpolation on {where}: {int(r['n_bracketed'])} per-seed values lie between two measured "
                     f"points of a run's scale curve, at most {fmt_num(float(r['widest_gap']))} pass@1 apart "
                     f"({M.label(r['method'])}, {r['level']}, seed {int(r['seed'])}); each value's gap: "
                     f"`bracket_gap` in {data_file}.")
    return notes


def _level_header(lv: Level) -> str:
    return lv.label.replace(">=", "≥")


#: The unit of every retained KL the tables show (token means, and token-pooled means).
KL_UNIT = "nats/token"


def _kl_header(lv: Level) -> str:
    """A matched-KL column's header: what, at which level, in which unit."""
    return f"KL at {_level_header(lv)} ({KL_UNIT})"


def _matched_rows(a: Analysis, names_of, title: str, name: str, absent: str, extra_primary_diff: bool,
                  data_column: bool = False, summ: Optional[pd.DataFrame] = None,
                  what: str = "retained KL (token mean, averaged over retained domains)",
                  seeds: Optional[pd.DataFrame] = None, data_file: str = "data/matched_per_seed.csv") -> Table:
    table = Table(name, title, group_header="Backbone")
    levels = a.levels
    first = 3 if data_column else 2  # the first level's column
    table.columns = ["Method", *(["Data"] if data_column else []), "Seeds", *[_kl_header(lv) for lv in levels]]
    if extra_primary_diff:
        table.columns.append(f"Δ KL vs ATLAS at {_level_header(a.primary_level)} ({KL_UNIT})")
    summ = a.matched if summ is None else summ
    shown = []
    for bb, bench in a.groups:
        present = summ[(summ["backbone"] == bb) & (summ["benchmark"] == bench)]
        names = names_of(present["method"].unique())
        shown += names
        for method in names:
            rows_m = present[present["method"] == method]
            n_seeds = int(rows_m["n_seeds"].max()) if len(rows_m) else 0
            cells = [Cell(M.label(method)), *([Cell(M.data_of(method))] if data_column else []), Cell(str(n_seeds))]
            for lv in levels:
                r = rows_m[rows_m["level_spec"] == lv.spec]
                cells.append(matched_cell(r.iloc[0] if len(r) else None))
            if extra_primary_diff:
                cells.append(_diff_cell(a, bb, bench, method, a.primary_level))
            table.rows.append(cells)
            table.groups.append(group_label(bb, bench))
    for j in range(first, first + len(levels)):
        table.best[j] = "min"
    if not table.rows:
        table.absent = absent
        return table
    table.notes = [_kl_note(a, what)] + _level_notes(a, levels)
    table.notes += gap_notes(a, a.matched_seed if seeds is None else seeds, list(dict.fromkeys(shown)), data_file)
    if data_column:
        table.notes.append("Data: what a method reads besides the target data (target only; the base's activations on "
                           "retained calibration prompts; the retained prompts with the base's responses or log-probs; "
                           "their gold answers). Retained-data variants give a baseline the retained prompts ATLAS and "
                           "replay see.")
    return table


def _diff_cell(a: Analysis, bb: str, bench: str, method: str, lv: Level) -> Cell:
    if method == M.REFERENCE:
        return Cell("")
    p = a.paired
    r = p[(p["backbone"] == bb) & (p["benchmark"] == bench) & (p["method"] == method) & (p["level_spec"] == lv.spec)]
    if r.empty:
        return Cell("n/a (no ATLAS runs)")
    r = r.iloc[0]
    if int(r["n_pairs"]) == 0:
        return Cell("n/a (no seed where both reach)")
    return Cell(f"{fmt_num(_f(r['mean_diff']))} {fmt_interval(_f(r['lo']), _f(r['hi']))}")


def main_table(a: Analysis) -> Table:
    return _matched_rows(
        a, M.main_methods, "Retained KL at matched coding requirement: ATLAS and baselines", "main",
        "No complete runs of ATLAS or of a baseline among the collected records.", False, data_column=True)


POOLED_WHAT = ("retained KL pooled over tokens (the sum over retained domains of the token-mean KL times the domain's "
               "scored tokens, over all scored tokens; nats per token)")


def main_pooled_table(a: Analysis) -> Table:
    """The main table read with the token-pooled KL (`analysis.pareto.pooled_kl`) instead of the mean over domains:
    each domain weighs by its scored tokens."""
    t = _matched_rows(
        a, M.main_methods, "Retained KL pooled over tokens at matched coding requirement: ATLAS and baselines",
        "main_pooled", "No complete runs of ATLAS or of a baseline whose records carry every retained domain's "
        "n_tokens.", False, data_column=True, summ=a.pooled, what=POOLED_WHAT, seeds=a.pooled_seed,
        data_file="data/matched_pooled_per_seed.csv")
    if t.absent is None:
        t.notes.insert(1, "The main table weighs each retained domain equally (the mean of the domains' token means); "
                          "here a domain weighs by its scored tokens. Runs whose records lack a domain's n_tokens are "
                          "left out.")
    return t


def main_domain_tables(a: Analysis) -> list[Table]:
    """The main table once per retained domain, each read with that domain's KL alone, matched on the domain's own
    fronts at every level (`Analysis.domain_levels`); the `domains` table shows them side by side at the primary
    level."""
    out = []
    for dom in a.domains:
        t = _matched_rows(
            a, M.main_methods, f"Retained KL on {dom} at matched coding requirement: ATLAS and baselines",
            f"main_{dom}", "No complete runs of ATLAS or of a baseline among the collected records.", False,
            data_column=True, summ=a.domain_levels[a.domain_levels["domain"] == dom],
            what=f"{dom}'s retained KL (token mean, that domain alone)")
        if t.absent is None:
            t.notes.insert(1, f"Each seed's value is read on the fronts of {dom}'s KL, not of the mean over domains: a "
                              "method's point that is best for the mean need not be best here.")
        out.append(t)
    return out


def ablation_table(a: Analysis) -> Table:
    def names(ms):
        fam = M.ablation_methods(ms)
        return fam if any(m != M.REFERENCE for m in fam) else []

    t = _matched_rows(
        a, names, "Ablations: ATLAS variants at matched coding requirement", "ablations",
        "No complete runs of an ATLAS variant (" + ", ".join(M.ABLATIONS) + ") among the collected records.", True)
    if t.absent is None:
        t.notes.append("Δ vs ATLAS: mean paired difference KL(ATLAS) - KL(variant) over seeds where both reach the "
                       "level, with its 95% t-interval; negative: ATLAS lower.")
    return t


def _level_rows(a: Analysis, frame: pd.DataFrame):
    """(backbone, benchmark, method, level, row) of a per-method, per-level frame, in the report's order of groups,
    methods and levels; combinations without a row are skipped."""
    for bb, bench in a.groups:
        g = frame[(frame["backbone"] == bb) & (frame["benchmark"] == bench)]
        for method in M.ordered(g["method"]):
            for lv in a.levels:
                r = g[(g["method"] == method) & (g["level_spec"] == lv.spec)]
                if not r.empty:
                    yield bb, bench, method, lv, r.iloc[0]


def paired_table(a: Analysis, p: Optional[pd.DataFrame] = None, name: str = "paired",
                 title: str = "Paired comparison of ATLAS against each method across seeds",
                 what: Optional[str] = None) -> Table:
    """ATLAS against each method at every level, paired over seeds (`analysis.matched.compare`): of the headline
    KL (`a.paired`), or of the KL `p` was compared on (`what` names it in the notes)."""
    table = Table(name, title, group_header="Backbone")
    table.columns = ["Method", "Level", "Seed pairs", f"Mean Δ KL ({KL_UNIT})", "95% CI (t)", "95% CI (bootstrap)", "t",
                     "p (paired t)", "p (paired t, Holm)", "Seeds ATLAS lower", "p (sign test)", "p (sign test, Holm)",
                     "Unpaired seeds"]
    table.align = ["l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "l"]
    p = a.paired if p is None else p
    if a.matched_seed.empty or not (a.matched_seed["method"] == M.REFERENCE).any():
        table.absent = "No complete ATLAS runs: there is nothing to compare the baselines against."
        return table
    if p.empty:
        table.absent = "Only ATLAS runs were collected: there is no other method to compare against."
        return table
    for bb, bench, method, lv, r in _level_rows(a, p):
        n = int(r["n_pairs"])
        t = _f(r["t"])
        t_text = "n/a" if t is None else ("inf" if math.isinf(t) and t > 0 else
                                          "-inf" if math.isinf(t) else f"{t:.2f}")
        unpaired = []
        if int(r["only_reference"]):
            unpaired.append(f"ATLAS only: {int(r['only_reference'])}")
        if int(r["only_method"]):
            unpaired.append(f"{M.label(method)} only: {int(r['only_method'])}")
        table.rows.append([
            Cell(M.label(method)), Cell(_level_header(lv)), Cell(str(n)),
            Cell(fmt_num(_f(r["mean_diff"])) if n else "n/a"),
            Cell(fmt_interval(_f(r["lo"]), _f(r["hi"])) if n >= 2 else "n/a"),
            Cell(fmt_interval(_f(r["boot_lo"]), _f(r["boot_hi"])) if n >= 2 else "n/a"),
            Cell(t_text if n >= 2 else "n/a"), Cell(fmt_p(_f(r["p_t"])) if n >= 2 else "n/a"),
            Cell(fmt_p(_f(r["p_t_holm"])) if n >= 2 else "n/a"),
            Cell(f"{int(r['wins'])}/{n}" if n else "n/a"),
            Cell(fmt_p(_f(r["p_sign"])) if n else "n/a"),
            Cell(fmt_p(_f(r["p_sign_holm"])) if n else "n/a"),
            Cell("; ".join(unpaired) if unpaired else ""),
        ])
        table.groups.append(group_label(bb, bench))
    table.notes = [
        "Δ = KL(ATLAS) - KL(method) per seed, over the seeds where both reach the level (negative: ATLAS keeps "
        "retained outputs closer to the base). 95% CI (t): t-interval of the mean difference; (bootstrap): percentile "
        "bootstrap over the pairs (every resample enumerated up to 6 pairs; near the range of the differences at 3 "
        "seeds, where it under-covers). p (paired t): two-sided "
        "paired t-test, n - 1 degrees of freedom. Seeds ATLAS lower: seeds where ATLAS has the lower KL. p (sign test): "
        "exact two-sided binomial sign test (ties dropped). n/a: fewer than two pairs. Unpaired: seeds where only "
        "one of the two reaches the level. KL and its differences in nats per token.",
        "Holm: the p-value Holm-corrected (step-down) over its family: every comparison in this table on the backbone "
        "that has one, ATLAS against the methods outside the ATLAS family forming one family (each method at each "
        "level) and ATLAS against its own variants another (so ablation runs leave the baselines' p-values as they "
        "are); the paired t and the sign test are corrected separately. A comparison is significant at a family-wise "
        "level α when its Holm p ≤ α.",
        (_kl_note(a) if what is None else _kl_note(a, what)).split(". (k/n")[0] + ".",
    ] + _level_notes(a, a.levels)
    return table


#: The KLs besides the headline that get their own paired table and a verdict column: (column, table, what).
PAIRED_NEAR_FAR = (
    (pareto.NEAR_KL_COL, "paired_near", "retained KL on near items (token mean, averaged over retained domains)"),
    (pareto.FAR_KL_COL, "paired_far", "retained KL on far items (token mean, averaged over retained domains)"),
)


def paired_near_far_tables(a: Analysis) -> list[Table]:
    """The paired table of the near items' and of the far items' KL where records have far items (each its own Holm
    family); none otherwise."""
    return [paired_table(a, a.paired_variants[col], name,
                         f"Paired comparison of ATLAS against each method across seeds: {what.split(' (')[0]}", what)
            for col, name, what in PAIRED_NEAR_FAR if col in a.paired_variants]


#: The verdict's significance level: family-wise, over each paired table's Holm family.
VERDICT_ALPHA = 0.05
#: The verdict's sections, in order: the registry group of the methods each holds.
VERDICT_SECTIONS = (("baseline", "published baseline"), ("retained", "retained-data variant"),
                    ("extended", "beyond the paper"))


def verdict_cell(r: Optional[pd.Series], method: str) -> Cell:
    """One comparison's verdict from its paired row: `lower` / `higher` when the paired t-test's Holm p is at most
    `VERDICT_ALPHA` (the sign of the mean difference), `no difference shown` otherwise; with Δ, its t-interval and
    the Holm p, and the seeds on which only one of the two reaches the level."""
    if r is None:
        return Cell("n/a")
    n, only_ref, only_oth = int(r["n_pairs"]), int(r["only_reference"]), int(r["only_method"])
    alone = ([f"only ATLAS reaches on {only_ref} seed(s)"] if only_ref else []) + \
        ([f"only {M.label(method)} reaches on {only_oth} seed(s)"] if only_oth else [])
    if n < 2:
        head = "n/a" if not alone else ("fewer than two seed pairs" if n else "no seed pair")
        return Cell("; ".join([head, *alone]))
    mean, holm = _f(r["mean_diff"]), _f(r["p_t_holm"])
    word = ("no difference shown" if holm is None or holm > VERDICT_ALPHA or not mean else
            "ATLAS lower" if mean < 0 else "ATLAS higher")
    text = f"{word}: Δ {fmt_num(mean)} {fmt_interval(_f(r['lo']), _f(r['hi']))}, Holm p {fmt_p(holm)}, {n} pairs"
    return Cell("; ".join([text, *alone]))


def verdict_table(a: Analysis) -> Table:
    """Per method other than ATLAS, sectioned as published baselines, retained-data variants and methods beyond the
    paper, and per level: the verdict (`verdict_cell`) on the headline KL, the near items' and the far items' KL.
    Where records have far items only (absent otherwise)."""
    table = Table("verdict", "Verdict: does ATLAS keep less retained KL than each method at matched coding requirement?",
                  group_header="Backbone")
    table.columns = ["Method", "Kind", "Level", "Headline KL", "Near KL", "Far KL"]
    table.align = ["l", "l", "l", "l", "l", "l"]
    if not all(col in a.paired_variants for col, _, _ in PAIRED_NEAR_FAR):
        table.absent = "No records with far items: the verdict reads the near and the far KL."
        return table
    frames = [a.paired, *(a.paired_variants[col] for col, _, _ in PAIRED_NEAR_FAR)]

    def row_of(frame: pd.DataFrame, bb: str, bench: str, method: str, lv: Level) -> Optional[pd.Series]:
        r = frame[(frame["backbone"] == bb) & (frame["benchmark"] == bench) & (frame["method"] == method)
                  & (frame["level_spec"] == lv.spec)]
        return r.iloc[0] if len(r) else None

    for bb, bench in a.groups:
        present = set(a.paired[(a.paired["backbone"] == bb) & (a.paired["benchmark"] == bench)]["method"])
        methods = [m for m in M.main_methods(present) if m != M.REFERENCE]
        kinds = dict(VERDICT_SECTIONS)
        for group, kind in [*VERDICT_SECTIONS, ("", "other")]:
            for method in methods:
                if (M.group_of(method) if M.group_of(method) in kinds else "") != group:
                    continue
                for lv in a.levels:
                    table.rows.append([Cell(M.label(method)), Cell(kind), Cell(_level_header(lv)),
                                       *(verdict_cell(row_of(f, bb, bench, method, lv), method) for f in frames)])
                    table.groups.append(group_label(bb, bench))
    if not table.rows:
        table.absent = "No method besides ATLAS to compare against."
        return table
    table.notes = [
        f"ATLAS lower / higher: the paired t-test of KL(ATLAS) - KL(method) over the seeds where both reach the level "
        f"has a Holm-corrected p ≤ {VERDICT_ALPHA} (family-wise over its paired table: tables/paired.md for the "
        "headline KL, tables/paired_near.md and tables/paired_far.md for near and far), and the mean difference Δ "
        "says which is lower; no difference shown: Holm p above it. Δ in nats per token with its 95% t-interval. A "
        "method that reaches a level on fewer seeds than ATLAS (or the reverse) is named: reaching a coding "
        "requirement the other misses is itself a result. Kind: the method's registry group (docs/baselines.md).",
    ] + _level_notes(a, a.levels)
    return table


def _p_boot(p: Optional[float], n_defined: int) -> str:
    """A bootstrap p; 0 (no resample across 0) as below its resolution, 2 / resamples."""
    if p == 0.0 and n_defined:
        return f"<{2.0 / n_defined:.2g}"
    return fmt_p(p)


def items_table(a: Analysis) -> Table:
    """ATLAS against each method per level, the matched-KL difference's interval and p from resampling code problems
    and retained items (`analysis.bootstrap`), next to the paired table's t-interval over seeds. Absent, with each
    backbone's reason, when no backbone's records can be resampled."""
    table = Table("paired_items", "ATLAS against each method, resampling code problems and retained items",
                  group_header="Backbone")
    table.columns = ["Method", "Level", "Seed pairs", f"Mean Δ KL ({KL_UNIT})", "95% CI (seeds, t)",
                     "95% CI (problems and items)",
                     "p (problems and items)", "p (Holm)", "Resamples with a pair"]
    table.align = ["l", "l", "r", "r", "r", "r", "r", "r", "r"]
    items = a.items
    if items is None or items.table.empty:
        reasons = [f"{group_label(bb, bench)}: {why}" for bb, bench, why in (items.unavailable if items else [])]
        table.absent = ("Not resampled over code problems and retained items: " + "; ".join(reasons) + "." if reasons
                        else "No backbone with runs of ATLAS and of another trained method: there is nothing to compare.")
        return table
    d, p = items.table, a.paired
    for bb, bench, method, lv, r in _level_rows(a, d):
        seeds = p[(p["backbone"] == bb) & (p["benchmark"] == bench) & (p["method"] == method)
                  & (p["level_spec"] == lv.spec)]
        n, defined = int(r["n_pairs"]), int(r["n_defined"])
        seed_ci = (fmt_interval(_f(seeds["lo"].iloc[0]), _f(seeds["hi"].iloc[0]))
                   if len(seeds) and int(seeds["n_pairs"].iloc[0]) >= 2 else "n/a")
        table.rows.append([
            Cell(M.label(method)), Cell(_level_header(lv)), Cell(str(n)),
            Cell(fmt_num(_f(r["mean_diff"])) if n else "n/a"), Cell(seed_ci),
            Cell(fmt_interval(_f(r["boot_lo"]), _f(r["boot_hi"])) if n else "n/a"),
            Cell(_p_boot(_f(r["p_boot"]), defined)), Cell(_p_boot(_f(r["p_boot_holm"]), defined)),
            Cell(f"{defined}/{int(r['n_resamples'])}"),
        ])
        table.groups.append(group_label(bb, bench))
    first = d.iloc[0]
    table.notes = [
        f"Δ = KL(ATLAS) - KL(method), the mean over the seeds where both reach the level, as in the paired table "
        f"(negative: ATLAS lower). 95% CI (problems and items): percentile interval of Δ over {items.n_resamples} "
        f"resamples (numpy seed {items.seed}) of the {int(first['n_problems'])} code problems and the "
        f"{int(first['n_items'])} retained items (each domain's items drawn with replacement, the problems likewise), one "
        "resample for every run: per resample each run's pass@1 and retained KL are recomputed from its per-problem "
        "passes and per-item KL, the gain levels from the base's and the reference's pass@1, and each seed's matched "
        "KL is read along its runs' fronts as in the main table. The seeds are held fixed: this interval is the "
        "evaluation sets' uncertainty, 95% CI (seeds, t) the paired table's over seeds.",
        "p (problems and items): twice the smaller share of resamples with Δ ≤ 0 or Δ ≥ 0 (two-sided; <x: no resample "
        "across 0, x = 2 / resamples); Holm: corrected over this table's comparisons on the backbone, the baselines' "
        "and ATLAS's variants' apart as in the paired table. Resamples with a pair: those in which some seed pair reaches the level (the interval and p are over these); n/a: no pair on the "
        "original sets.",
    ]
    for bb, bench, why in items.unavailable:
        table.notes.append(f"{group_label(bb, bench)}: not resampled: {why}.")
    table.notes += _level_notes(a, a.levels)
    return table


def _share(k: int, n: int) -> str:
    return "n/a" if n == 0 else f"{k}/{n} ({100 * k / n:.0f}%)"


def dominance_table(a: Analysis) -> Table:
    """Per method: how many of ATLAS's measured points a same-seed measured point of the method dominates, and the
    reverse (`analysis.matched.dominance`), with the mean-over-domains KL and with the token-pooled KL."""
    table = Table("dominance", "Dominance between measured points: ATLAS and each method, same seed",
                  group_header="Backbone")
    d = a.dominance
    if d.empty:
        table.absent = ("No complete runs of ATLAS and of another trained method: there are no points to compare."
                        if a.matched_seed.empty or not (a.matched_seed["method"] == M.REFERENCE).any()
                        else "Only ATLAS runs were collected: there is no other method to compare against.")
        return table
    kls = [k for k in ("mean", "pooled") if (d["kl"] == k).any()]
    table.columns = ["Method", "Seeds"]
    for k in kls:
        what = "mean KL" if k == "mean" else "pooled KL"
        table.columns += [f"ATLAS points dominated ({what})", f"its points dominated by ATLAS ({what})"]
    for bb, bench in a.groups:
        g = d[(d["backbone"] == bb) & (d["benchmark"] == bench)]
        for method in M.ordered(g["method"].unique()):
            gm = g[g["method"] == method]
            cells = [Cell(M.label(method)), Cell(str(int(gm["seeds"].max())))]
            for k in kls:
                r = gm[gm["kl"] == k]
                if r.empty:
                    cells += [Cell(DASH), Cell(DASH)]
                    continue
                r = r.iloc[0]
                cells += [Cell(_share(int(r["reference_dominated"]), int(r["n_reference_points"]))),
                          Cell(_share(int(r["method_dominated"]), int(r["n_method_points"])))]
            table.rows.append(cells)
            table.groups.append(group_label(bb, bench))
    table.notes = [
        "A measured point: one sweep point (a trained run at one post-hoc scale) on one seed, as recorded; nothing is "
        "interpolated and no level enters. Point P dominates Q when P's pass@1 ≥ Q's and P's retained KL ≤ Q's, one of "
        "them strictly. ATLAS points dominated: of ATLAS's points on the seeds both methods ran, those dominated by a "
        "point of the method on the same seed; its points dominated by ATLAS: the reverse. Mean KL: the retained KL "
        "averaged over domains (the main table's); pooled KL: pooled over tokens (main_pooled's).",
    ]
    return table


def backbones_table(a: Analysis) -> Table:
    lv = a.primary_level
    table = Table("backbones", f"Retained KL at matched coding requirement ({_level_header(lv)}) across backbones")
    summ = a.matched[a.matched["level_spec"] == lv.spec]
    names = M.main_methods(summ["method"].unique()) + [m for m in M.ablation_methods(summ["method"].unique())
                                                       if m != M.REFERENCE]
    if not names:
        table.absent = "No complete runs of a trained method among the collected records."
        return table
    table.columns = ["Method", *[f"KL on {group_label(bb, bench)} ({KL_UNIT})" for bb, bench in a.groups]]
    for method in names:
        cells = [Cell(M.label(method))]
        for bb, bench in a.groups:
            r = summ[(summ["backbone"] == bb) & (summ["benchmark"] == bench) & (summ["method"] == method)]
            cells.append(matched_cell(r.iloc[0]) if len(r) else Cell(DASH))
        table.rows.append(cells)
    for j in range(1, 1 + len(a.groups)):
        table.best[j] = "min"
    table.notes = [_kl_note(a), "—: no runs of the method on that backbone."] + _level_notes(a, [lv])
    return table


def domains_table(a: Analysis) -> Table:
    lv = a.primary_level
    table = Table("domains", f"Retained KL per domain at matched coding requirement ({_level_header(lv)})",
                  group_header="Backbone")
    if not a.domains:
        table.absent = "The collected records carry no per-domain retained metrics."
        return table
    table.columns = ["Method", *[f"{dom} KL ({KL_UNIT})" for dom in a.domains], f"Mean over domains KL ({KL_UNIT})"]
    dm = a.domain_matched
    mean = a.matched[a.matched["level_spec"] == lv.spec]
    for bb, bench in a.groups:
        present = mean[(mean["backbone"] == bb) & (mean["benchmark"] == bench)]
        for method in [m for m in M.ordered(present["method"]) if m != M.BASE]:
            cells = [Cell(M.label(method))]
            for dom in a.domains:
                r = dm[(dm["domain"] == dom) & (dm["backbone"] == bb) & (dm["benchmark"] == bench) & (dm["method"] == method)]
                cells.append(matched_cell(r.iloc[0]) if len(r) else Cell(DASH))
            r = present[present["method"] == method]
            cells.append(matched_cell(r.iloc[0]) if len(r) else Cell(DASH))
            table.rows.append(cells)
            table.groups.append(group_label(bb, bench))
    if not table.rows:
        table.absent = "No complete runs of a trained method among the collected records."
        return table
    for j in range(1, 2 + len(a.domains)):
        table.best[j] = "min"
    table.notes = [_kl_note(a, "each domain's retained KL (token mean), matched on that domain's own frontier"),
                   "Mean over domains: the KL averaged over domains, as in the main table."] + _level_notes(a, [lv])
    return table


def answers_table(a: Analysis) -> Table:
    lv = a.primary_level
    table = Table("answers", f"Answer-level stability at matched coding requirement ({_level_header(lv)})",
                  group_header="Backbone")
    if not a.answer_cols:
        table.absent = "The collected records carry no answer-level metrics (answer_change_rate, choice_flip_rate)."
        return table
    table.columns = ["Method", *[label for _, label, _, _ in a.answer_cols]]
    ans = a.answers
    for bb, bench in a.groups:
        g = ans[(ans["backbone"] == bb) & (ans["benchmark"] == bench)]
        for method in [m for m in M.ordered(g["method"]) if m != M.BASE]:
            gm = g[g["method"] == method]
            reached = gm[gm["reached"]]
            cells = [Cell(M.label(method))]
            for col, _, _, _ in a.answer_cols:
                if reached.empty:
                    cells.append(Cell(NOT_REACHED))
                    continue
                s = summary_of(reached[col], a.confidence)
                if s is None:
                    cells.append(Cell(DASH))
                    continue
                mean, half, n = s
                text = fmt_ci(100 * mean, None if half is None else 100 * half)
                if len(reached) < len(gm):
                    cells.append(Cell(f"{text} ({len(reached)}/{len(gm)} seeds)"))
                else:
                    cells.append(Cell(text, 100 * mean))
            table.rows.append(cells)
            table.groups.append(group_label(bb, bench))
    if not table.rows:
        table.absent = "No complete runs of a trained method among the collected records."
        return table
    for j, (_, _, better, _) in enumerate(a.answer_cols, start=1):
        table.best[j] = better
    table.notes = [
        "Per seed, the sweep point the matched requirement picks (least mean retained KL among points meeting the "
        "level, no interpolation); answers changed: share of math prompts whose extracted final answer differs "
        "from the base model's; choices flipped: share of multiple-choice items whose highest-likelihood choice "
        "differs; Δ accuracy: adapted - base accuracy against gold, percentage points. Mean ± half-width of the "
        f"{int(a.confidence * 100)}% t-interval over seeds. Bold: best among methods reaching the level on every seed, "
        "where at least two do.",
    ] + _level_notes(a, [lv])
    return table


COSTS = (
    ("cost/trainable_params", "Trainable params", "min", fmt_count),
    ("cost/stored_bytes", "Stored size", "min", fmt_bytes),
    ("cost/train_seconds", "Train (s)", "min", lambda x: fmt_num(x, 3)),
    ("cost/decode_tokens_per_s", "Decode (tokens/s)", "max", lambda x: fmt_num(x, 3)),
)


def costs_table(a: Analysis) -> Table:
    table = Table("costs", "Costs per method", group_header="Backbone")
    runs = a.runs
    present = [c for c in COSTS if c[0] in runs.columns and runs[c[0]].notna().any()]
    if runs.empty or not present:
        table.absent = ("The collected records carry no cost fields (trainable_params, stored_bytes, "
                        "train_seconds, decode_tokens_per_s).")
        return table
    table.columns = ["Method", "Runs", *[c[1] for c in present]]
    for bb, bench in a.groups:
        g = runs[(runs["backbone"] == bb) & (runs["benchmark"] == bench)]
        for method in [m for m in M.ordered(g["method"]) if m != M.BASE]:
            gm = g[g["method"] == method]
            cells = [Cell(M.label(method)), Cell(str(len(gm)))]
            for col, _, _, fmt in present:
                v = pd.to_numeric(gm[col], errors="coerce").dropna()
                cells.append(Cell(fmt(float(v.mean())), float(v.mean())) if len(v) else Cell(DASH))
            table.rows.append(cells)
            table.groups.append(group_label(bb, bench))
    if not table.rows:
        table.absent = "No complete runs of a trained method among the collected records."
        return table
    for j, (_, _, better, _) in enumerate(present, start=2):
        table.best[j] = better
    table.notes = ["Mean over all complete runs of the method on that backbone (every sweep point and seed). "
                   "Stored size: what the method saves on top of the backbone. Decode: generated tokens per second "
                   "during evaluation. Bold: best per column (fewest params, bytes and seconds; most tokens/s)."]
    return table


def dev_candidates_table(a: Analysis) -> Table:
    """Every dev candidate (scale-1 sweep point of a `@dev` benchmark) per method: its knobs, seeds, dev pass@1 and
    retained KL (mean and standard deviation over seeds; `analysis.tune.candidates_frame`), and whether the report's
    test records hold the same point (the choice made from it). Absent (left out of the report) without dev records."""
    from analysis.tune import candidates_frame  # here: tune reads records and configs the other tables never need

    table = Table("dev_candidates", "Dev candidates per method and the points run on test", group_header="Backbone")
    table.columns = ["Method", "Knobs", "Seeds", "Dev pass@1", f"Dev retained KL ({KL_UNIT})", "On test"]
    table.align = ["l", "l", "l", "r", "r", "l"]
    runs = a.runs
    dev = sorted({(bb, b) for bb, b in zip(runs["backbone"], runs["benchmark"]) if str(b).endswith("@dev")}) \
        if len(runs) else []
    if not dev:
        table.absent = "No dev records among the collected records."
        return table
    frame = candidates_frame(runs, {g: [] for g in dev}, {})
    test = runs[runs[schema.SCALE_COL] == 1.0]
    for _, r in frame.iterrows():
        bench = str(r["benchmark"]).removesuffix("@dev")
        on_test = test[(test["backbone"] == r["backbone"]) & (test["benchmark"] == bench) & (test["method"] == r["method"])]
        used = any(_knob_match(row, r["method"], r["knobs"]) for _, row in on_test.iterrows())

        def mean_sd(col: str) -> str:
            sd = _f(r[f"{col}_sd"])
            return fmt_num(_f(r[col])) + (f" ± {fmt_num(sd)}" if sd is not None else "")

        table.rows.append([Cell(M.label(r["method"])), Cell(r["knobs"] or DASH), Cell(r["seeds"]),
                           Cell(mean_sd("pass@1")), Cell(mean_sd("kl")), Cell("yes" if used else "")])
        table.groups.append(group_label(r["backbone"], r["benchmark"]))
    table.notes = ["Every scale-1 point of the dev records, as `python -m analysis tune` reads them; ± is the standard "
                   "deviation over seeds. On test: the report's test records hold the same method and knob values."]
    return table


def _knob_match(row: pd.Series, method: str, text: str) -> bool:
    """Whether a run row has the knob values of a candidate's knob text (`analysis.tune.knob_text`); the base's empty
    text matches any base run."""
    from analysis.tune import _default, _plain, knob_text  # as in dev_candidates_table

    names = [part.partition("=")[0] for part in str(text).split(", ") if part]
    return knob_text(tuple((n, _plain(row.get(schema.KNOB_PREFIX + n), _default(method, n))) for n in names)) == text


#: The main table read with each other retained KL of records with far items (name, title, what a cell is).
NEAR_FAR_TABLES = (
    (pareto.NEAR_KL_COL, "main_near", "Retained KL on near items at matched coding requirement",
     "retained KL on near items (held-out items of the calibration templates; token mean, averaged over domains)"),
    (pareto.FAR_KL_COL, "main_far", "Retained KL on far items at matched coding requirement",
     "retained KL on far items (templates, phrasings, facts and relations calibration never uses; token mean, "
     "averaged over domains)"),
    (pareto.FAR_POOLED_KL_COL, "main_far_pooled", "Retained KL on far items pooled over tokens at matched coding "
     "requirement", "retained KL on far items pooled over tokens (nats per token)"),
    (pareto.ALL_POOLED_KL_COL, "main_all_pooled", "Retained KL on near and far items pooled over tokens at matched "
     "coding requirement", "retained KL on near and far items pooled over tokens (nats per token)"),
)


def near_far_tables(a: Analysis) -> list[Table]:
    """The main table with each of the other retained KLs (`NEAR_FAR_TABLES`) where records have far items; none
    otherwise. The main table's KL is the headline (`retained_kl_mean`, docs/evaluation.md)."""
    out = []
    for col, name, title, what in NEAR_FAR_TABLES:
        if col not in a.variants:
            continue
        out.append(_matched_rows(a, M.main_methods, f"{title}: ATLAS and baselines", name,
                                 "No complete runs of ATLAS or of a baseline with far items.", False, data_column=True,
                                 summ=a.variants[col][1], what=what))
    return out


BUILDERS = (main_table, verdict_table, main_pooled_table, near_far_tables, main_domain_tables, paired_table,
            paired_near_far_tables, items_table,
            dominance_table, ablation_table, backbones_table, domains_table, answers_table, costs_table,
            dev_candidates_table)
#: Tables the report leaves out, instead of writing their absence, when they have nothing to show (`Report.absent`).
OPTIONAL = ("paired_items", "dev_candidates", "verdict")


def all_tables(a: Analysis) -> list[Table]:
    """Every table, in the report's order (a builder may give several, or none)."""
    out: list[Table] = []
    for build in BUILDERS:
        made = build(a)
        out.extend(made if isinstance(made, list) else [made])
    return out
