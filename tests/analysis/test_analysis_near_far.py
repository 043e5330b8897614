"""Records with far retained items: the main table reads the registered headline, the near/far tables read the
other KLs, each worked out by hand; records of the earlier world get none of those tables."""

from __future__ import annotations

import copy

import pytest
from analysis_synth import record

from analysis import pareto, schema
from analysis.analyze import analyze
from analysis.collect import make_table
from analysis.tables import all_tables, verdict_table
from suite_schema.layout import validate

REF = "lora:train.steps=600"


def v3(rec: dict, far: dict[str, float], far_tokens: dict[str, int]) -> dict:
    """A record of the v3 world: `retained` renamed `retained_near`, far items added, the headline recomputed."""
    rec = copy.deepcopy(rec)
    m = rec["metrics"]
    m["retained_near"] = m.pop("retained")
    m["retained_far"] = {d: {"kl_token_mean": v, "kl_seq_mean": 5 * v, "n_tokens": far_tokens[d], "n": 30}
                         for d, v in far.items()}
    near = sum(e["kl_token_mean"] for e in m["retained_near"].values()) / len(m["retained_near"])
    m["retained_kl_mean"] = (near + sum(far.values()) / len(far)) / 2
    rec["benchmark"] = rec["config"]["benchmark"]["name"] = "micro_v3"
    return rec


def runs():
    out = []
    for seed in (0, 1):
        out.append(v3(record("base", seed, 0.1, {"math": 0.0, "commonsense": 0.0}), {"math": 0.0, "commonsense": 0.0},
                      {"math": 3000, "commonsense": 500}))
        out.append(v3(record("lora", seed, 0.6, {"math": 0.4, "commonsense": 0.2}, steps=600),
                      {"math": 0.8, "commonsense": 0.6}, {"math": 3000, "commonsense": 500}))
        out.append(v3(record("atlas", seed, 0.6, {"math": 0.1, "commonsense": 0.3}, knobs={"rank": 8}),
                      {"math": 0.2, "commonsense": 0.2}, {"math": 3000, "commonsense": 500}))
    return out


def test_v3_records_validate_and_carry_far_columns():
    recs = runs()
    assert all(validate(r) is None for r in recs)
    row = schema.to_row(recs[1], "src")  # LoRA, seed 0
    assert row["retained/math/kl_token_mean"] == 0.4 and row["retained_far/commonsense/kl_token_mean"] == 0.6
    broken = copy.deepcopy(recs[2])
    broken["metrics"]["retained_far"]["math"]["kl_token_mean"] = "x"
    assert "'metrics.retained_far.math.kl_token_mean'" in validate(broken)


def test_headline_near_far_and_pooled_readings_worked_out_by_hand():
    a = analyze(make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(runs())), reference=REF,
                levels=["gain:1.0"], interpolate=False)
    atlas = a.runs[a.runs["method"] == "atlas"].iloc[0]
    assert atlas[schema.KL_MEAN_COL] == pytest.approx((0.2 + 0.2) / 2)              # headline: (near + far) / 2
    assert atlas[pareto.NEAR_KL_COL] == pytest.approx(0.2)
    assert atlas[pareto.FAR_KL_COL] == pytest.approx(0.2)
    assert atlas[pareto.FAR_POOLED_KL_COL] == pytest.approx((0.2 * 3000 + 0.2 * 500) / 3500)
    assert atlas[pareto.ALL_POOLED_KL_COL] == pytest.approx((0.1 * 4000 + 0.3 * 4000 + 0.2 * 3500) / 11500)
    lora = a.runs[a.runs["method"] == "lora"].iloc[0]
    assert lora[pareto.FAR_POOLED_KL_COL] == pytest.approx((0.8 * 3000 + 0.6 * 500) / 3500)
    names = [t.name for t in all_tables(a)]
    assert names[:7] == ["main", "verdict", "main_pooled", "main_near", "main_far", "main_far_pooled",
                         "main_all_pooled"]
    assert {"paired_near", "paired_far"} <= set(names)
    far = a.variants[pareto.FAR_KL_COL][1]
    assert far[far["method"] == "lora"]["mean"].iloc[0] == pytest.approx(0.7)  # LoRA's far KL at its own level


def test_earlier_world_records_get_no_near_far_tables():
    recs = [record("base", 0, 0.1), record("lora", 0, 0.6, steps=600), record("atlas", 0, 0.6)]
    a = analyze(make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(recs)), reference=REF)
    assert a.variants == {}
    assert not any(t.name.startswith(("main_near", "main_far", "main_all")) for t in all_tables(a))


def test_verdict_reads_the_holm_corrected_paired_tests_of_the_headline_near_and_far_kl():
    """Three seeds, one level (LoRA's own pass@1): ATLAS's near KL is below replay's on every seed by about 0.2 and
    its far KL above by about 0.3 (paired t, 2 degrees of freedom: p < 0.01, Holm over the 2 compared methods still
    < 0.05); against LoRA the near differences change sign (no difference shown); lwf_retained never reaches the
    level (no pair, ATLAS alone reaches). Sections: published baselines, then retained-data variants."""
    near = {"atlas": [0.10, 0.12, 0.11], "lora": [0.11, 0.10, 0.13], "replay": [0.30, 0.33, 0.29],
            "lwf_retained": [0.01, 0.01, 0.01]}
    far = {"atlas": [0.50, 0.52, 0.49], "lora": [0.40, 0.70, 0.45], "replay": [0.20, 0.21, 0.22],
           "lwf_retained": [0.01, 0.01, 0.01]}
    recs = []
    for seed in (0, 1, 2):
        tokens = {"math": 3000, "commonsense": 500}
        recs.append(v3(record("base", seed, 0.1, {"math": 0.0, "commonsense": 0.0}), {"math": 0.0, "commonsense": 0.0},
                       tokens))
        for method, pass1 in (("lora", 0.6), ("atlas", 0.6), ("replay", 0.6), ("lwf_retained", 0.3)):
            n, f = near[method][seed], far[method][seed]
            recs.append(v3(record(method, seed, pass1, {"math": n, "commonsense": n},
                                  **({"steps": 600} if method == "lora" else {})), {"math": f, "commonsense": f}, tokens))
    a = analyze(make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(recs)), reference=REF,
                levels=["gain:1.0"], interpolate=False)
    near_pairs = a.paired_variants[pareto.NEAR_KL_COL].set_index("method")
    assert near_pairs.at["replay", "mean_diff"] == pytest.approx(sum(x - y for x, y in zip(near["atlas"], near["replay"])) / 3)
    assert near_pairs.at["replay", "p_t_holm"] == pytest.approx(2 * near_pairs.at["replay", "p_t"])  # the smaller of 2
    table = verdict_table(a)
    rows = {(r[0].text, r[1].text): [c.text for c in r[3:]] for r in table.rows}
    assert [r[0].text for r in table.rows] == ["LoRA", "Replay", "LwF (retained prompts)"]
    assert [r[1].text for r in table.rows] == ["published baseline", "published baseline", "retained-data variant"]
    headline, near_cell, far_cell = rows[("Replay", "published baseline")]
    assert near_cell.startswith("ATLAS lower: Δ -0.197 ") and near_cell.endswith(", 3 pairs")
    assert far_cell.startswith("ATLAS higher: Δ 0.293 ")
    assert rows[("LoRA", "published baseline")][1].startswith("no difference shown: Δ ")
    assert rows[("LwF (retained prompts)", "retained-data variant")] == ["no seed pair; only ATLAS reaches on 3 seed(s)"] * 3


def test_no_verdict_without_far_items():
    recs = [record("base", 0, 0.1), record("lora", 0, 0.6, steps=600), record("atlas", 0, 0.6)]
    a = analyze(make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(recs)), reference=REF)
    assert verdict_table(a).absent.startswith("No records with far items")
    assert a.paired_variants == {}
