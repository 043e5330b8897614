"""Frontiers, sweep-point intervals, KL at a matched coding requirement, and the paired comparison, on
synthetic records with answers worked out by hand."""

import math

import pandas as pd
import pytest
from analysis_synth import record, sweep

from analysis import schema
from analysis.collect import make_table
from analysis.matched import (
    compare,
    gain_range,
    parse_level,
    parse_levels,
    parse_reference,
    per_seed_matched,
    summarize_matched,
    threshold,
)
from analysis.pareto import domains, envelope_line, envelope_value, frontier, frontier_mask, run_fronts, sweep_points

T975 = {1: 12.706204736, 2: 4.302652730}


def table(records):
    return make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(records))


def test_frontier_mask_known_points():
    x = [0.1, 0.2, 0.3, 0.25, 0.3, 0.15, 0.2]
    y = [0.01, 0.02, 0.05, 0.04, 0.06, 0.03, 0.02]
    # (0.3, 0.06): same x, higher y; (0.15, 0.03): beaten by (0.2, 0.02); last: duplicate of index 1.
    assert frontier_mask(x, y) == [True, True, True, True, False, False, False]
    assert frontier_mask([], []) == []


def test_sweep_points_means_intervals_and_frontier():
    recs = sweep("lora", [(100, [(0.2, 0.01), (0.4, 0.03)]),            # 2 seeds
                          (300, [(0.1, 0.05), (0.2, 0.06), (0.3, 0.07)]),  # dominated by steps=100
                          (900, [(0.5, 0.10)])])                           # 1 seed
    recs += sweep("atlas", [(300, [(0.1, 0.2), (0.1, 0.2)])])
    pts = sweep_points(table(recs), schema.KL_MEAN_COL)
    lora = pts[pts["method"] == "lora"].set_index("knob/train.steps")
    p100, p300, p900 = lora.loc[100], lora.loc[300], lora.loc[900]
    assert (p100["n_seeds"], p100["seeds"]) == (2, "0,1")
    assert p100["x_mean"] == pytest.approx(0.3) and p100["y_mean"] == pytest.approx(0.02)
    # t(0.975, 1) * sd / sqrt(2), sd of (0.2, 0.4) = 0.1414
    assert p100["x_hi"] - p100["x_lo"] == pytest.approx(2 * T975[1] * 0.1, abs=1e-9)
    assert p300["x_hi"] - p300["x_mean"] == pytest.approx(T975[2] * 0.1 / math.sqrt(3), abs=1e-9)
    assert p300["y_std"] == pytest.approx(0.01)
    assert math.isnan(p900["x_lo"]) and math.isnan(p900["y_std"]) and p900["n_seeds"] == 1
    assert (p100["on_frontier"], p300["on_frontier"], p900["on_frontier"]) == (True, False, True)
    # Each method has its own frontier: the ATLAS point is dominated by LoRA's points but on its own frontier.
    atlas = pts[pts["method"] == "atlas"].iloc[0]
    assert atlas["on_frontier"] and atlas["x_lo"] == atlas["x_hi"] == pytest.approx(0.1)
    front = frontier(pts)
    assert list(front[front["method"] == "lora"]["knob/train.steps"]) == [100, 900]


def test_domain_frontiers_use_each_domains_kl():
    recs = [record("lora", 0, 0.3, {"math": 0.01, "commonsense": 0.5}, steps=100),
            record("lora", 0, 0.3, {"math": 0.05, "commonsense": 0.1}, steps=200)]
    df = table(recs)
    assert domains(df) == ["math", "commonsense"]
    math_pts = sweep_points(df, "retained/math/kl_token_mean").set_index("knob/train.steps")
    cs_pts = sweep_points(df, "retained/commonsense/kl_token_mean").set_index("knob/train.steps")
    assert list(math_pts["on_frontier"]) == [True, False]
    assert list(cs_pts["on_frontier"]) == [False, True]


def test_parse_levels():
    assert parse_level("0.3").kind == "abs" and parse_level("0.3").value == 0.3
    lv = parse_level("gain:0.75")
    assert (lv.kind, lv.value, lv.label) == ("gain", 0.75, "75% of gain")
    assert [x.spec for x in parse_levels(["0.3,0.4", "gain:0.5", "0.3"])] == ["0.3", "0.4", "gain:0.5"]
    assert parse_level("gain:1.25").value == 1.25  # beyond the reference point's own gain
    for bad in ("foo:0.3", "1.5", "x", "gain:-0.1"):
        with pytest.raises(ValueError):
            parse_level(bad)
    with pytest.raises(ValueError):
        parse_levels([])


# Per seed (pass@1, KL) of each sweep point:
#            steps=100        steps=300       steps=900
# seed 0:  (0.20, 0.010)   (0.30, 0.020)   (0.40, 0.050)
# seed 1:  (0.22, 0.012)   (0.28, 0.018)   (0.35, 0.040)
# seed 2:  (0.18, 0.011)   (0.33, 0.030)   (0.38, 0.070)
ATLAS = [(100, [(0.20, 0.010), (0.22, 0.012), (0.18, 0.011)]),
         (300, [(0.30, 0.020), (0.28, 0.018), (0.33, 0.030)]),
         (900, [(0.40, 0.050), (0.35, 0.040), (0.38, 0.070)])]
LORA = [(100, [(0.25, 0.030), (0.24, 0.035), (0.26, 0.040)]),
        (900, [(0.45, 0.100), (0.41, 0.080), (0.43, 0.120)])]


@pytest.fixture(scope="module")
def sweep_table():
    recs = sweep("atlas", ATLAS) + sweep("lora", LORA)
    recs += [record("base", s, 0.05, {"math": 0.0, "commonsense": 0.0}) for s in range(3)]
    return table(recs)


def test_matched_least_kl_per_seed_and_not_reached(sweep_table):
    levels = parse_levels(["0.3", "0.39", "0.5"])
    ps = per_seed_matched(sweep_table, levels, methods=["atlas", "lora"])
    a = ps[ps["method"] == "atlas"].set_index(["level_spec", "seed"])
    # pass@1 >= 0.3: seed 0 -> steps 300 (0.020), seed 1 -> steps 900 (0.040), seed 2 -> steps 300 (0.030)
    assert [a.loc[("0.3", s), "kl"] for s in range(3)] == pytest.approx([0.020, 0.040, 0.030])
    assert [a.loc[("0.3", s), "pass@1"] for s in range(3)] == pytest.approx([0.30, 0.35, 0.33])
    # pass@1 >= 0.39: only seed 0 reaches (0.40); seeds 1 and 2 top out at 0.35 and 0.38.
    assert list(a.xs("0.39")["reached"]) == [True, False, False]
    assert math.isnan(a.loc[("0.39", 1), "kl"])
    assert not a.xs("0.5")["reached"].any()
    summ = summarize_matched(ps).set_index(["method", "level_spec"])
    s = summ.loc[("atlas", "0.3")]
    assert (s["status"], s["n_seeds"], s["n_reached"]) == ("reached", 3, 3)
    assert s["mean"] == pytest.approx(0.03) and s["std"] == pytest.approx(0.01)
    assert s["hi"] - s["mean"] == pytest.approx(T975[2] * 0.01 / math.sqrt(3), abs=1e-9)
    part = summ.loc[("atlas", "0.39")]
    assert (part["status"], part["n_reached"], part["mean"]) == ("partial", 1, pytest.approx(0.05))
    assert math.isnan(part["lo"]) and math.isnan(part["std"])
    none = summ.loc[("atlas", "0.5")]
    assert none["status"] == "not reached" and none["n_reached"] == 0 and math.isnan(none["mean"])
    assert summ.loc[("lora", "0.39"), "mean"] == pytest.approx(0.1)


def test_interpolation_never_joins_two_training_runs(sweep_table):
    """Without post-hoc scales every training run is a single point: no model lies between two runs (steps 100 and
    300 are different trainings), so the interpolated reading is the least KL among the points meeting the level."""
    levels = parse_levels(["0.25", "0.3", "0.15", "0.39"])
    ps = per_seed_matched(sweep_table, levels, interpolate=True, methods=["atlas"]).set_index(["level_spec", "seed"])
    plain = per_seed_matched(sweep_table, levels, methods=["atlas"]).set_index(["level_spec", "seed"])
    assert ps.loc[("0.25", 0), "kl"] == pytest.approx(0.020)   # steps 300, not halfway to steps 100's 0.010
    assert ps.loc[("0.15", 0), "kl"] == pytest.approx(0.010)
    assert not ps.loc[("0.39", 1), "reached"]                  # above seed 1's best pass@1: no extrapolation
    pd.testing.assert_series_equal(ps["kl"], plain["kl"])
    assert not ps["interpolated"].any()


def _runs(method, runs, seed=0):
    """Records of one seed: `runs` = {steps: [(scale, pass@1, kl), ...]} (each steps value one training run)."""
    return [record(method, seed, p, {"math": kl, "commonsense": kl}, steps=steps, scale=a)
            for steps, curve in runs.items() for a, p, kl in curve]


# Two training runs of one seed with their scale curves. B's scale-1 point (0.30, 0.09) is on the pooled Pareto set of
# both runs' points (no point has pass@1 >= 0.30 at KL <= 0.09) but lies above A's curve, which reaches 0.30 at 0.06.
RUN_A = {600: [(0.25, 0.10, 0.01), (0.5, 0.20, 0.02), (1.0, 0.40, 0.10)]}
RUN_B = {150: [(0.5, 0.15, 0.02), (1.0, 0.30, 0.09)]}


def test_matched_kl_interpolates_along_each_run_and_takes_the_least():
    a_only = per_seed_matched(table(_runs("lora", RUN_A)), parse_levels(["0.25", "0.3", "0.35", "0.45"]),
                              interpolate=True, methods=["lora"]).set_index("level_spec")["kl"]
    both = per_seed_matched(table(_runs("lora", {**RUN_A, **RUN_B})), parse_levels(["0.25", "0.3", "0.35", "0.45"]),
                            interpolate=True, methods=["lora"]).set_index("level_spec")["kl"]
    assert a_only["0.3"] == pytest.approx(0.02 + 0.5 * 0.08)    # halfway along A between scales 0.5 and 1
    assert a_only["0.25"] == pytest.approx(0.02 + 0.25 * 0.08)
    # B reads 0.09 at 0.30 and 0.02 + (0.10 / 0.15) 0.07 at 0.25: both above A's, so adding B changes nothing. Joining
    # B's (0.30, 0.09) to A's (0.20, 0.02) and (0.40, 0.10) as one front would have read 0.09 at 0.30.
    pd.testing.assert_series_equal(a_only, both)
    assert math.isnan(both["0.45"])                              # above every run's best pass@1
    lower = {150: [(0.5, 0.15, 0.01), (1.0, 0.30, 0.03)]}       # a run below A at 0.30 takes over there
    mixed = per_seed_matched(table(_runs("lora", {**RUN_A, **lower})), parse_levels(["0.3", "0.35"]),
                             interpolate=True, methods=["lora"]).set_index("level_spec")["kl"]
    assert mixed["0.3"] == pytest.approx(0.03) and mixed["0.35"] == pytest.approx(0.02 + 0.75 * 0.08)


def test_a_further_training_run_never_raises_the_matched_kl():
    """Random scale curves: the value with a run added is the least of the values without it and of the run alone."""
    import random
    rng = random.Random(7)
    levels = parse_levels(["0.1", "0.2", "0.3", "0.4", "0.5"])
    for _ in range(30):
        runs = {}
        for steps in (100, 200, 300):
            p = sorted(rng.uniform(0.05, 0.6) for _ in range(4))
            kl = sorted(rng.uniform(0.0, 1.0) for _ in range(4))
            runs[steps] = [(a, pi, ki) for a, pi, ki in zip((0.25, 0.5, 0.75, 1.0), p, kl)]

        def value(keys):
            ps = per_seed_matched(table(_runs("lora", {k: runs[k] for k in keys})), levels, interpolate=True,
                                  methods=["lora"])
            return list(ps["kl"])

        two, third, three = value([100, 200]), value([300]), value([100, 200, 300])
        for t, o, w in zip(two, third, three):
            expect = min((v for v in (t, o) if not math.isnan(v)), default=float("nan"))
            assert (math.isnan(w) and math.isnan(expect)) or w == pytest.approx(expect)


def _flat(line):
    return [v for point in line for v in point]


def test_frontier_points_and_line_are_the_lower_envelope_of_the_runs():
    pts = sweep_points(table(_runs("lora", {**RUN_A, **RUN_B})), schema.KL_MEAN_COL)
    on = {(round(x, 2), round(y, 2)): f for x, y, f in zip(pts["x_mean"], pts["y_mean"], pts["on_frontier"])}
    # B's scale-1 point is on the pooled Pareto set but above A's curve: not on the frontier; A's points all are.
    assert on == {(0.10, 0.01): True, (0.20, 0.02): True, (0.40, 0.10): True, (0.15, 0.02): False,
                  (0.30, 0.09): False}
    fronts = run_fronts(list(pts["x_mean"]), list(pts["y_mean"]), list(pts["train_key"]))
    assert _flat(envelope_line(fronts)) == pytest.approx(_flat([(0.10, 0.01), (0.15, 0.015), (0.20, 0.02),
                                                                 (0.30, 0.06), (0.40, 0.10)]))
    # A run that ends lower than another continues: the line steps up to the other run's curve at its end.
    assert _flat(envelope_line([[(0.1, 0.01), (0.3, 0.03)], [(0.2, 0.05), (0.4, 0.07)]])) == pytest.approx(
        _flat([(0.1, 0.01), (0.2, 0.02), (0.3, 0.03), (0.3, 0.06), (0.4, 0.07)]))
    # Two curves that cross (the second one point, read flat below its pass@1): the line turns at the crossing.
    assert _flat(envelope_line([[(0.1, 0.01), (0.4, 0.10)], [(0.4, 0.04)]])) == pytest.approx(
        _flat([(0.1, 0.01), (0.2, 0.04), (0.4, 0.04)]))
    assert envelope_value([[(0.1, 0.01), (0.4, 0.10)], [(0.4, 0.04)]], 0.3) == pytest.approx(0.04)
    assert envelope_value([[(0.1, 0.01)]], 0.2) is None


def test_gain_levels(sweep_table):
    ref = "lora:train.steps=900"
    lo, hi = gain_range(sweep_table, "micro", "micro", ref)
    # base mean 0.05; the reference point, LoRA at steps 900: (0.45 + 0.41 + 0.43) / 3 = 0.43
    assert (lo, hi) == (pytest.approx(0.05), pytest.approx(0.43))
    assert threshold(parse_level("gain:0.5"), sweep_table, "micro", "micro", ref) == pytest.approx(0.24)
    assert threshold(parse_level("0.33"), sweep_table, "micro", "micro") == 0.33  # absolute: no reference needed
    assert threshold(parse_level("gain:1.5"), sweep_table, "micro", "micro", ref) == pytest.approx(0.05 + 1.5 * 0.38)
    # another point as the reference: ATLAS at steps 300, (0.30 + 0.28 + 0.33) / 3
    assert gain_range(sweep_table, "micro", "micro", "atlas:train.steps=300")[1] == pytest.approx(0.91 / 3)
    no_base = sweep_table[sweep_table["method"] != "base"]
    # without base runs there is no gain to share (never a made-up base pass@1 of 0)
    with pytest.raises(ValueError, match=r"^no complete base runs on micro/micro: .* add its records \(python run.py "
                                         r"method=base backbone=micro benchmark=micro\) or use absolute levels"):
        gain_range(no_base, "micro", "micro", ref)
    # gain:1 is the reference point's own mean: that point meets it despite float rounding.
    ps = per_seed_matched(sweep_table, [parse_level("gain:1")], methods=["lora"], reference=ref)
    assert ps["reached"].sum() == 2   # seeds 0 (0.45) and 2 (0.43); seed 1 has 0.41


def test_the_reference_point_must_be_exactly_one_point(sweep_table):
    with pytest.raises(ValueError, match=r"2 points of lora at scale 1 on micro/micro match; its points there: "
                                         r"train.steps=100; train.steps=900. Name one, e.g. --reference "
                                         r"lora:train.steps=100"):
        gain_range(sweep_table, "micro", "micro", "lora")
    with pytest.raises(ValueError, match="no point of lora"):
        gain_range(sweep_table, "micro", "micro", "lora:train.steps=300")
    with pytest.raises(ValueError, match="no knob 'nosuch'"):
        gain_range(sweep_table, "micro", "micro", "lora:nosuch=1")
    with pytest.raises(ValueError, match="no complete pissa runs on micro/micro"):
        gain_range(sweep_table, "micro", "micro", "pissa")
    assert parse_reference("lora: train.steps = 600 ,rank=8").knobs == (("train.steps", "600"), ("rank", "8"))
    for bad in ("", ":x=1", "lora:steps", "lora:=1"):
        with pytest.raises(ValueError):
            parse_reference(bad)


def test_levels_do_not_move_when_methods_are_added_or_removed(sweep_table):
    """A level is a share of the reference point's gain: a better method joining, or ATLAS leaving, moves nothing."""
    ref = "lora:train.steps=900"
    levels = parse_levels(["gain:0.5", "gain:0.75", "gain:0.9", "0.3"])
    better = table([record("pissa", s, 0.6 + s / 100, {"math": 0.2, "commonsense": 0.2}) for s in range(3)])
    tables = {"as is": sweep_table, "with a better method": pd.concat([sweep_table, better], ignore_index=True),
              "without atlas": sweep_table[sweep_table["method"] != "atlas"]}
    thresholds = {name: [threshold(lv, t, "micro", "micro", ref) for lv in levels] for name, t in tables.items()}
    assert thresholds["with a better method"] == thresholds["as is"] == thresholds["without atlas"]
    lora_kl = {name: list(per_seed_matched(t, levels, methods=["lora"], reference=ref)["kl"].fillna(-1))
               for name, t in tables.items()}
    assert lora_kl["with a better method"] == lora_kl["as is"] == lora_kl["without atlas"]


def test_paired_comparison_over_seeds(sweep_table):
    ps = per_seed_matched(sweep_table, parse_levels(["0.3", "0.39", "0.42"]), methods=["atlas", "lora"])
    cmp = compare(ps, "atlas").set_index(["method", "level_spec"])
    r = cmp.loc[("lora", "0.3")]
    # lora at >= 0.3: steps 900 for every seed, KL 0.100 / 0.080 / 0.120; atlas 0.020 / 0.040 / 0.030
    diffs = [0.020 - 0.100, 0.040 - 0.080, 0.030 - 0.120]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    t = mean / (sd / math.sqrt(3))
    assert r["n_pairs"] == 3 and r["mean_diff"] == pytest.approx(mean)
    assert r["t"] == pytest.approx(t)
    assert r["p_t"] == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), abs=1e-10)   # df = 2 closed form
    assert r["hi"] - r["mean_diff"] == pytest.approx(T975[2] * sd / math.sqrt(3), abs=1e-9)
    assert (r["wins"], r["losses"], r["p_sign"]) == (3, 0, 0.25)
    one = cmp.loc[("lora", "0.39")]   # atlas: seed 0 only; lora: every seed
    assert one["n_pairs"] == 1 and one["mean_diff"] == pytest.approx(0.05 - 0.1)
    assert math.isnan(one["t"]) and math.isnan(one["p_t"]) and math.isnan(one["lo"])
    assert (one["only_reference"], one["only_method"]) == (0, 2)
    none = cmp.loc[("lora", "0.42")]  # atlas never reaches 0.42
    assert none["n_pairs"] == 0 and math.isnan(none["mean_diff"]) and none["only_method"] == 2
    assert compare(ps[ps["method"] == "lora"], "atlas").empty


def test_one_trained_point_with_scales_has_its_scale_curve_as_front():
    """Post-hoc scales of one trained run are points of the seed's front; the matched KL interpolates along them,
    and the reference point is the trained run itself (scale 1), not one of its scales."""
    curve = [(0.25, 0.00, 0.001), (0.5, 0.10, 0.005), (0.75, 0.30, 0.020), (0.9, 0.45, 0.060), (1.0, 0.50, 0.100)]
    recs = [record("lora", 0, p, {"math": kl, "commonsense": kl}, steps=600, scale=a) for a, p, kl in curve]
    recs += [record("base", 0, 0.0, {"math": 0.0, "commonsense": 0.0})]
    t = table(recs)
    pts = sweep_points(t[t["method"] == "lora"], schema.KL_MEAN_COL)
    front = frontier(pts)
    assert list(front["scale"]) == [0.25, 0.5, 0.75, 0.9, 1.0]          # every scale is on the front
    assert list(front["x_mean"]) == pytest.approx([p for _, p, _ in curve])
    ps = per_seed_matched(t, parse_levels(["0.4", "gain:0.5", "0.5", "0.55"]), interpolate=True, methods=["lora"])
    kl = dict(zip(ps["level_spec"], ps["kl"]))
    assert kl["0.4"] == pytest.approx(0.020 + (0.4 - 0.30) / (0.45 - 0.30) * (0.060 - 0.020))
    assert kl["gain:0.5"] == pytest.approx(0.005 + (0.25 - 0.10) / (0.30 - 0.10) * (0.020 - 0.005))  # 50% of 0.5
    assert kl["0.5"] == pytest.approx(0.100)                               # the trained run itself
    assert math.isnan(kl["0.55"])                                          # above the curve: not reached
    # without interpolation the same seed is charged the first point at or above the level
    plain = per_seed_matched(t, parse_levels(["0.4"]), interpolate=False, methods=["lora"])
    assert float(plain["kl"].iloc[0]) == pytest.approx(0.060)
    # a scale that beats the trained run on both axes takes its place on the front
    better = table(recs[:3] + [record("lora", 0, 0.52, {"math": 0.09, "commonsense": 0.09}, steps=600, scale=0.9),
                               recs[4], recs[5]])
    front = frontier(sweep_points(better[better["method"] == "lora"], schema.KL_MEAN_COL))
    assert 1.0 not in list(front["scale"])


def test_each_matched_value_names_the_pass_gap_it_was_read_across():
    """`bracket_gap`: the pass@1 gap between the two measured points of the run's curve a per-seed value lies between;
    NaN where the value is a measured point's (at a point, below a curve's least pass@1) or the level is not reached."""
    levels = parse_levels(["0.05", "0.15", "0.25", "0.4", "0.45"])
    gap = per_seed_matched(table(_runs("lora", RUN_A)), levels, interpolate=True,
                           methods=["lora"]).set_index("level_spec")["bracket_gap"]
    # RUN_A's curve: pass@1 0.10, 0.20, 0.40
    assert gap["0.15"] == pytest.approx(0.10) and gap["0.25"] == pytest.approx(0.20)
    assert math.isnan(gap["0.05"]) and math.isnan(gap["0.4"]) and math.isnan(gap["0.45"])
    # where another run gives the least KL, its own points bound the reading: (0.15, 0.01) to (0.30, 0.03) at 0.25
    lower = {150: [(0.5, 0.15, 0.01), (1.0, 0.30, 0.03)]}
    mixed = per_seed_matched(table(_runs("lora", {**RUN_A, **lower})), parse_levels(["0.25", "0.3", "0.35"]),
                             interpolate=True, methods=["lora"]).set_index("level_spec")["bracket_gap"]
    assert mixed["0.25"] == pytest.approx(0.15) and math.isnan(mixed["0.3"]) and mixed["0.35"] == pytest.approx(0.2)
    # without interpolation nothing is read between points
    assert per_seed_matched(table(_runs("lora", RUN_A)), levels, methods=["lora"])["bracket_gap"].isna().all()


def test_envelope_gap_prefers_a_measured_reading_of_the_same_value():
    from analysis.pareto import envelope_gap, front_bracket

    one, point = [(0.1, 0.01), (0.3, 0.03)], [(0.2, 0.02)]
    assert front_bracket(one, 0.2) == (0.1, 0.3) and front_bracket(point, 0.2) is None
    assert envelope_gap([one], 0.2) == pytest.approx(0.2)
    assert envelope_gap([one, point], 0.2) is None        # the same KL, measured by the second run
    assert envelope_gap([one, [(0.05, 0.0), (0.25, 0.02)]], 0.2) == pytest.approx(0.2)  # the lower run's gap
    assert envelope_gap([one, [(0.15, 0.01), (0.25, 0.03)]], 0.2) == pytest.approx(0.1)  # equal values: narrower gap
    assert envelope_gap([one], 0.35) is None and envelope_gap([one], 0.1) is None


def test_widest_gaps_names_the_widest_reading_per_backbone():
    from analysis.matched import widest_gaps

    recs = _runs("lora", RUN_A) + _runs("lora", {600: [(0.25, 0.10, 0.01), (0.5, 0.12, 0.02), (1.0, 0.45, 0.10)]},
                                        seed=1)
    recs += _runs("atlas", {600: [(0.5, 0.05, 0.0), (1.0, 0.42, 0.01)]})
    recs += [record("lora", 0, 0.3, {"math": 0.1, "commonsense": 0.1}, backbone="other", benchmark="other")]
    ps = per_seed_matched(table(recs), parse_levels(["0.15", "0.3"]), interpolate=True)
    wide = widest_gaps(ps).set_index("backbone")
    # lora seed 0: 0.10 and 0.20 (at 0.15, from 0.1 to 0.2), 0.20 (at 0.3); seed 1: 0.33 at both; atlas: 0.37 at both
    assert wide.loc["micro", "n_bracketed"] == 6 and wide.loc["micro", "widest_gap"] == pytest.approx(0.37)
    assert (wide.loc["micro", "method"], wide.loc["micro", "level_spec"], wide.loc["micro", "seed"]) == ("atlas", "0.15",
                                                                                                        0)
    lora = widest_gaps(ps, ["lora"]).set_index("backbone")
    assert lora.loc["micro", "widest_gap"] == pytest.approx(0.33) and lora.loc["micro", "seed"] == 1
    assert lora.loc["other", "n_bracketed"] == 0 and math.isnan(lora.loc["other", "widest_gap"])
