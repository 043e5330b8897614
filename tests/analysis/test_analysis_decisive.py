"""The report's decisive statistics (issue 59, item 5) on hand-built records: Holm-corrected p-values over the paired
table's comparisons, interpolation-free dominance counts between measured points, and the token-pooled retained KL."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from analysis_synth import record, scenario, sweep

from analysis import schema
from analysis.analyze import analyze
from analysis.collect import make_table
from analysis.matched import dominance, dominates, holm_by_family
from analysis.pareto import POOLED_KL_COL, pooled_kl
from analysis.render import to_markdown
from analysis.stats import holm
from analysis.tables import all_tables


def table_of(records):
    return make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(records))


# ---- Holm ---------------------------------------------------------------------------------------------------------

def test_holm_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept at 0.06: monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    # capped at 1; no test (None, NaN) is outside the family and stays None; ties share their value
    assert holm([0.5, None, 0.2, float("nan")]) == pytest.approx([0.5, None, 0.4, None])
    assert holm([0.02, 0.02, 0.02]) == pytest.approx([0.06, 0.06, 0.06])
    assert holm([0.6, 0.3]) == [0.6, 0.6] and holm([0.7, 0.6]) == [1.0, 1.0]
    assert holm([0.037]) == [0.037] and holm([]) == [] and holm([None]) == [None]


def _step_down_rejections(ps, alpha):
    """Holm's procedure as he stated it: walk the sorted p-values, reject while p_(i) <= alpha / (m - i + 1)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    rejected = set()
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        rejected.add(i)
    return rejected


@pytest.mark.parametrize("seed", range(20))
def test_holm_is_the_step_down_rule_between_bonferroni_and_benjamini_hochberg(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 25))
    ps = list(rng.uniform(0, 0.2, m) ** 2)
    adj = holm(ps)
    # Rejections at any alpha are exactly the step-down procedure's.
    for alpha in (0.001, 0.01, 0.05, 0.1):
        assert {i for i, q in enumerate(adj) if q <= alpha} == _step_down_rejections(ps, alpha)
    # The closed form min(1, max_{j <= i} (m - j + 1) p_(j)), computed another way.
    srt = np.sort(ps)
    closed = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * srt))
    assert np.sort(adj) == pytest.approx(closed, rel=1e-15)
    # Never below Benjamini-Hochberg's adjusted values (SciPy), never above Bonferroni's.
    bh = scipy.stats.false_discovery_control(ps, method="bh")
    assert all(b <= q + 1e-15 for b, q in zip(bh, adj))
    assert all(q <= min(1.0, m * p) + 1e-15 for p, q in zip(ps, adj))
    assert all(q >= p for p, q in zip(ps, adj))


def test_paired_table_holm_columns_correct_each_backbone_s_family():
    a = analyze(table_of(scenario()), ["0.25", "0.3"])
    p = a.paired
    for bb in ("micro", "qwen3-8b"):
        g = p[(p["backbone"] == bb) & (p["method"] != "atlas_nogate")]  # the baselines' family: no ablation in it
        # The raw p-values are the paired t-test's (SciPy) and the sign test's; Holm over this backbone's baseline rows only.
        for _, r in g.iterrows():
            if r["n_pairs"] >= 2:
                ps = a.matched_seed
                kl = {m: ps[(ps["backbone"] == bb) & (ps["method"] == m) & (ps["level_spec"] == r["level_spec"])]
                      .set_index("seed")["kl"] for m in ("atlas", r["method"])}
                both = kl["atlas"].dropna().index.intersection(kl[r["method"]].dropna().index)
                assert len(both) == r["n_pairs"]
                assert r["p_t"] == pytest.approx(
                    scipy.stats.ttest_rel(kl["atlas"][both], kl[r["method"]][both]).pvalue, rel=1e-9)
        family = [v for v in g["p_t"] if not math.isnan(v)]
        assert len(family) >= 3
        m = len(family)
        srt = sorted(family)
        by_hand = {v: min(1.0, max((m - j) * srt[j] for j in range(srt.index(v) + 1))) for v in family}
        for raw, adj in zip(g["p_t"], g["p_t_holm"]):
            assert (math.isnan(adj) if math.isnan(raw) else adj == pytest.approx(by_hand[raw], rel=1e-12))
        signs = list(g["p_sign"])
        assert list(g["p_sign_holm"]) == pytest.approx([math.nan if v is None else v for v in holm(signs)], nan_ok=True)
        variant = p[(p["backbone"] == bb) & (p["method"] == "atlas_nogate")]  # a family of its own
        own = [math.nan if v is None else v for v in holm(list(variant["p_t"]))]
        assert list(variant["p_t_holm"]) == pytest.approx(own, nan_ok=True)
    md = to_markdown({t.name: t for t in all_tables(a)}["paired"])
    assert "p (paired t, Holm)" in md and "p (sign test, Holm)" in md and "Holm-corrected" in md


def test_ablation_runs_leave_the_baselines_holm_p_values_and_verdict_as_they_are():
    """ATLAS's variants are a Holm family of their own: adding their runs to a folder changes no baseline's row of the
    paired table (raw and Holm-corrected p; the verdict reads these rows)."""
    with_variant = scenario()
    without = [r for r in with_variant if r["method"] != "atlas_nogate"]
    extra = [dict(r, method="atlas_global") for r in with_variant if r["method"] == "atlas_nogate"]
    frames = []
    for recs in (without, with_variant, with_variant + extra):
        a = analyze(table_of(recs), ["0.25", "0.3"])
        frames.append(a.paired[~a.paired["method"].str.startswith("atlas_")].reset_index(drop=True))
        assert (a.paired["method"] == "atlas_nogate").any() == (recs is not without)
    assert frames[0]["p_t"].notna().sum() >= 3
    for f in frames[1:]:
        pd.testing.assert_frame_equal(f, frames[0])
    # Over one pooled family instead, the variant's rows would raise some baseline's p: the fix is not vacuous.
    a = analyze(table_of(with_variant), ["0.25", "0.3"])
    g = a.paired[a.paired["backbone"] == "micro"]
    pooled = holm(list(g["p_t"]))
    base_rows = [i for i, m in enumerate(g["method"]) if not m.startswith("atlas_")]
    assert any(pooled[i] is not None and pooled[i] > g["p_t_holm"].iloc[i] for i in base_rows)


def test_holm_by_family_corrects_baselines_and_atlas_variants_apart_per_backbone():
    rows = [("micro", "lora", 0.01), ("micro", "ewc", 0.04), ("micro", "atlas_nogate", 0.02),
            ("micro", "atlas[filter_basis=8]", float("nan")), ("micro", "atlas_global", 0.03),
            ("qwen3-8b", "lora", 0.02), ("qwen3-8b", "atlas_nogate", 0.5)]
    df = pd.DataFrame([{"backbone": b, "benchmark": "x", "method": m, "p": p} for b, m, p in rows])
    got = holm_by_family(df, "p")
    # micro baselines: {.01, .04} -> .02, .04; micro variants: {.02, .03} (NaN is no test) -> .04, .04; one each else.
    assert list(got) == pytest.approx([0.02, 0.04, 0.04, math.nan, 0.04, 0.02, 0.5], nan_ok=True)
    assert holm_by_family(df.iloc[:0], "p").empty


# ---- dominance ----------------------------------------------------------------------------------------------------

def test_dominates_needs_one_strict_improvement():
    assert dominates((0.4, 0.01), (0.3, 0.02)) and dominates((0.3, 0.01), (0.3, 0.02))
    assert dominates((0.4, 0.02), (0.3, 0.02))
    assert not dominates((0.3, 0.02), (0.3, 0.02)) and not dominates((0.4, 0.03), (0.3, 0.02))


def _points(method, seed, pts, **kw):
    """One training run of `method` on `seed` drawn at post-hoc scales: pts = [(scale, pass@1, kl_mean)]."""
    return [record(method, seed, p1, {"math": kl, "commonsense": kl}, scale=sc, **kw) for sc, p1, kl in pts]


def test_dominance_counts_same_seed_points_by_hand():
    recs = [record("base", s, 0.1, {"math": 0.0, "commonsense": 0.0}) for s in range(3)]
    # seed 0: ATLAS (0.3, 0.02) is dominated by LoRA's (0.35, 0.02); ATLAS (0.4, 0.05) by nothing (LoRA's best pass@1
    # is 0.35); LoRA's (0.35, 0.02) by nothing; LoRA's (0.2, 0.03) by ATLAS (0.3, 0.02).
    recs += _points("atlas", 0, [(0.5, 0.3, 0.02), (1.0, 0.4, 0.05)])
    recs += _points("lora", 0, [(0.5, 0.2, 0.03), (1.0, 0.35, 0.02)])
    # seed 1: an exact tie (0.3, 0.02) dominates neither way; ATLAS (0.5, 0.01) dominates LoRA (0.3, 0.02) and
    # (0.45, 0.04).
    recs += _points("atlas", 1, [(0.5, 0.3, 0.02), (1.0, 0.5, 0.01)])
    recs += _points("lora", 1, [(0.5, 0.3, 0.02), (1.0, 0.45, 0.04)])
    # seed 2: only ATLAS ran; LoRA's seed 3 only LoRA: not counted (no same-seed partner).
    recs += _points("atlas", 2, [(1.0, 0.1, 0.0)])
    recs += _points("lora", 3, [(1.0, 0.9, 0.0)])
    a = analyze(table_of(recs), ["0.3"])
    d = a.dominance[a.dominance["kl"] == "mean"].set_index("method")
    r = d.loc["lora"]
    assert (r["seeds"], r["n_reference_points"], r["reference_dominated"]) == (2, 4, 1)
    assert (r["n_method_points"], r["method_dominated"]) == (4, 3)
    assert (r["share_reference_dominated"], r["share_method_dominated"]) == (0.25, 0.75)
    assert "base" not in set(a.dominance["method"])
    md = to_markdown({t.name: t for t in all_tables(a)}["dominance"])
    assert "| micro | LoRA | 2 | 1/4 (25%) | 3/4 (75%) | 1/4 (25%) | 3/4 (75%) |" in md


def test_dominance_reads_the_kl_it_is_given():
    # Math scored on 9000 tokens, commonsense on 1000: ATLAS lower on commonsense, LoRA on math, same pass@1.
    def rec(method, m, c):
        r = record(method, 0, 0.4, {"math": m, "commonsense": c})
        r["metrics"]["retained"]["math"]["n_tokens"] = 9000
        r["metrics"]["retained"]["commonsense"]["n_tokens"] = 1000
        return r

    t = table_of([rec("atlas", 0.02, 0.01), rec("lora", 0.01, 0.04)])  # mean: 0.015 vs 0.025; pooled 0.019 vs 0.013
    t[POOLED_KL_COL] = pooled_kl(t)
    mean, pooled = dominance(t), dominance(t, y_col=POOLED_KL_COL, kl_name="pooled")
    assert (mean.loc[0, "reference_dominated"], mean.loc[0, "method_dominated"]) == (0, 1)
    assert (pooled.loc[0, "reference_dominated"], pooled.loc[0, "method_dominated"]) == (1, 0)
    assert pooled.loc[0, "kl"] == "pooled"


def test_no_dominance_without_atlas_or_other_methods():
    only_lora = all_tables(analyze(table_of(sweep("lora", [(100, [(0.3, 0.02)])])), ["0.3"]))
    assert "No complete" in {t.name: t for t in only_lora}["dominance"].absent
    only_atlas = all_tables(analyze(table_of(sweep("atlas", [(100, [(0.3, 0.02)])])), ["0.3"]))
    assert "Only ATLAS" in {t.name: t for t in only_atlas}["dominance"].absent


# ---- token-pooled KL ----------------------------------------------------------------------------------------------

def _tokens(rec, math_tokens, cs_tokens):
    rec["metrics"]["retained"]["math"]["n_tokens"] = math_tokens
    rec["metrics"]["retained"]["commonsense"]["n_tokens"] = cs_tokens
    return rec


def test_pooled_kl_weighs_domains_by_tokens():
    recs = [_tokens(record("atlas", 0, 0.4, {"math": 0.01, "commonsense": 0.2}), 4000, 500),
            _tokens(record("atlas", 1, 0.4, {"math": 0.03, "commonsense": 0.1}), 6695, 666)]
    broken = record("atlas", 2, 0.4, {"math": 0.01, "commonsense": 0.2})
    del broken["metrics"]["retained"]["commonsense"]["n_tokens"]
    t = table_of(recs + [broken])
    got = pooled_kl(t)
    assert got[0] == pytest.approx((0.01 * 4000 + 0.2 * 500) / 4500, rel=1e-15)  # 0.0311...
    assert got[1] == pytest.approx(np.average([0.03, 0.1], weights=[6695, 666]), rel=1e-15)
    assert math.isnan(got[2])
    assert t[schema.KL_MEAN_COL][0] == pytest.approx(0.105)  # the headline: the domains' plain mean


def test_main_pooled_table_reads_the_matched_level_with_the_pooled_kl():
    recs = []
    for s, (m, c) in enumerate([(0.01, 0.2), (0.02, 0.1), (0.01, 0.1)]):
        recs.append(_tokens(record("atlas", s, 0.4, {"math": m, "commonsense": c}), 9000, 1000))
        recs.append(_tokens(record("lora", s, 0.4, {"math": 0.05, "commonsense": 0.02}), 9000, 1000))
    a = analyze(table_of(recs), ["0.3"])
    atlas = [(0.9 * m + 0.1 * c) for m, c in [(0.01, 0.2), (0.02, 0.1), (0.01, 0.1)]]  # 0.029, 0.028, 0.019
    ps = a.pooled_seed[a.pooled_seed["method"] == "atlas"].sort_values("seed")
    assert list(ps["kl"]) == pytest.approx(atlas, rel=1e-14)
    row = a.pooled[a.pooled["method"] == "atlas"].iloc[0]
    ci = scipy.stats.t.interval(0.95, 2, loc=np.mean(atlas), scale=scipy.stats.sem(atlas))
    assert (row["mean"], row["lo"], row["hi"]) == pytest.approx((np.mean(atlas), *ci), rel=1e-9)
    tables = [t for t in all_tables(a) if t.name != "verdict"]  # absent without far items, and then not written
    assert [t.name for t in tables][:2] == ["main", "main_pooled"]  # the headline table stays first
    md = to_markdown(tables[1])
    # LoRA pooled: 0.9 * 0.05 + 0.1 * 0.02 = 0.047, above ATLAS's 0.0253; in the main table LoRA (0.035) is lower than
    # ATLAS (mean over domains 0.0733), so the bold moves.
    assert "| micro | ATLAS | retained activations | 3 | **0.0253 ± 0.0137** |" in md
    assert "|  | LoRA | target only | 3 | 0.0470 ± 0.0000 |" in md
    assert "**0.0350" in to_markdown(tables[0])


def test_each_domain_s_main_table_matches_every_level_on_that_domain_s_own_fronts():
    # ATLAS's two points reach both levels: the first has the lower math KL, the second the lower mean and commonsense.
    recs = []
    for s in range(3):
        recs.append(record("atlas", s, 0.4, {"math": 0.01, "commonsense": 0.3}, steps=100))
        recs.append(record("atlas", s, 0.4, {"math": 0.05, "commonsense": 0.1}, steps=300))
        recs.append(record("lora", s, 0.4, {"math": 0.02, "commonsense": 0.2}))
    a = analyze(table_of(recs), ["0.3", "0.35"])
    tables = {t.name: t for t in all_tables(a)}
    assert [t.name for t in all_tables(a) if t.name != "verdict"][:4] == ["main", "main_pooled", "main_math",
                                                                          "main_commonsense"]
    math_md, cs_md = to_markdown(tables["main_math"]), to_markdown(tables["main_commonsense"])
    assert "| micro | ATLAS | retained activations | 3 | **0.0100 ± 0.0000** | **0.0100 ± 0.0000** |" in math_md
    assert "|  | LoRA | target only | 3 | 0.0200 ± 0.0000 | 0.0200 ± 0.0000 |" in math_md
    assert "| micro | ATLAS | retained activations | 3 | **0.100 ± 0.000** | **0.100 ± 0.000** |" in cs_md
    assert "| micro | ATLAS | retained activations | 3 | **0.0750 ± 0.0000** |" in to_markdown(tables["main"])
    # The primary level's rows are the per-domain table's, and every level is there.
    lv = a.domain_levels
    primary = lv[lv["level_spec"] == a.primary_level.spec].reset_index(drop=True)
    assert primary.equals(a.domain_matched) and sorted(set(lv["level_spec"])) == ["0.3", "0.35"]
