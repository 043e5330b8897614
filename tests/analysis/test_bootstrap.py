"""The paired bootstrap over code problems and retained items (analysis.bootstrap) on hand-built records carrying
per-problem passes and per-item KL; records carrying `retained_near`; and the report without and with those fields."""

import json

import numpy as np
import pytest
import scipy.stats
from analysis_synth import record, write

from analysis import bootstrap as BT
from analysis import schema
from analysis.analyze import analyze
from analysis.cli import main
from analysis.collect import collect, make_table
from analysis.matched import parse_levels
from analysis.render import to_markdown
from analysis.report import write_report
from analysis.tables import all_tables
from suite_schema.layout import validate

DOMAINS = ("math", "commonsense")


def with_items(rec: dict, passed, items: dict) -> dict:
    """`rec` with per-problem passes `passed` and per-domain (kl_sum, n_tokens), its pass@1, domain KLs and
    retained_kl_mean set to what they give."""
    m = rec["metrics"]
    m["target"]["per_problem"] = {"task_ids": [f"task/{i}" for i in range(len(passed))],
                                  "passed": [int(v) for v in passed]}
    m["target"]["pass@1"] = float(np.mean(passed))
    for dom, (k, n) in items.items():
        entry = m["retained"][dom]
        entry["per_item"] = {"kl_sum": [float(v) for v in k], "n_tokens": [int(v) for v in n]}
        entry.update(kl_token_mean=float(np.sum(k) / np.sum(n)), n_tokens=int(np.sum(n)), n=len(k))
    m["retained_kl_mean"] = float(np.mean([m["retained"][d]["kl_token_mean"] for d in items]))
    return rec


def sweep(methods: dict, n_problems: int = 60, n_items: int = 40, seeds=(0, 1, 2), data_seed: int = 0) -> list[dict]:
    """Base runs and, per method, two training runs (150 and 600 steps) per seed, each at scale 1 and 0.5.

    `methods`: name -> (KL factor, pass@1 gain at 600 steps). A problem's difficulty and an item's KL profile are
    shared by every run (the same evaluation sets); a run passes a problem when its pass rate beats the difficulty,
    and its per-item KL is the profile times its factor times scale^2, with a little seed noise."""
    rng = np.random.default_rng(data_seed)
    difficulty = rng.uniform(size=n_problems)
    profile = {d: rng.gamma(2.0, 0.5, n_items) for d in DOMAINS}
    tokens = {d: rng.integers(5, 40, n_items) for d in DOMAINS}
    recs = [with_items(record("base", s, 0.0, run_id=f"base-{s}"), difficulty < 0.1,
                       {d: (np.zeros(n_items), tokens[d]) for d in DOMAINS}) for s in seeds]
    for method, (factor, gain) in methods.items():
        for s in seeds:
            jitter = np.random.default_rng([data_seed, s, len(method)])
            for steps, share in ((150, 0.6), (600, 1.0)):
                for scale in (None, 0.5):
                    a = 1.0 if scale is None else scale
                    rate = 0.1 + gain * share * a + 0.02 * s
                    run = f"{method}-{s}-{steps}" + ("" if scale is None else "@0.5")
                    rec = record(method, s, 0.0, steps=steps, scale=scale, run_id=run)
                    items = {d: (profile[d] * factor * (share * a) ** 2 * tokens[d]
                                 * (1 + 0.05 * jitter.standard_normal(n_items)) ** 2, tokens[d]) for d in DOMAINS}
                    recs.append(with_items(rec, difficulty < rate, items))
    return recs


def table_of(records):
    return make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(records))


LEVELS = parse_levels(["gain:0.5", "gain:0.9", "0.35"])


def _analysis(recs, interpolate=True, resamples=200):
    return analyze(table_of(recs), LEVELS, interpolate=interpolate, reference="lora:train.steps=600",
                   resamples=resamples)


# ---- (a) the original sets give the matched table's value -----------------------------------------------------------

@pytest.mark.parametrize("interpolate", [True, False])
def test_without_resampling_noise_the_statistic_is_the_paired_table_s_difference(interpolate):
    # EWC misses the top level on some seeds (its gain is small): fewer pairs there, as in the paired table.
    recs = sweep({"atlas": (0.02, 0.40), "lora": (0.2, 0.40), "ewc": (0.05, 0.30)})
    a = _analysis(recs, interpolate)
    g = a.runs
    sets = BT.eval_sets(g)
    assert isinstance(sets, BT.EvalSets) and sets.passed.shape == (3 + 3 * 12, 60)
    # Five "resamples" that are all the identity: every problem and item once.
    same = BT.Resamples(np.ones((5, 60)), tuple(np.ones((5, 40)) for _ in DOMAINS))
    got = BT.group_statistics(g, sets, same, LEVELS, interpolate, "lora:train.steps=600")
    others, stat, pairs = got.others, got.stat, got.pairs
    assert others == ["lora", "ewc"]
    assert got.requirement == pytest.approx(np.tile(a.thresholds["threshold"].to_numpy(), (5, 1)), rel=1e-12)
    paired = a.paired.set_index(["level_spec", "method"])
    checked = 0
    for j, lv in enumerate(LEVELS):
        for o, method in enumerate(others):
            row = paired.loc[(lv.spec, method)]
            assert (pairs[:, j, o] == int(row["n_pairs"])).all()
            if row["n_pairs"]:
                assert stat[:, j, o] == pytest.approx([row["mean_diff"]] * 5, rel=1e-12, abs=1e-15)
                checked += 1
            else:
                assert np.isnan(stat[:, j, o]).all()
    assert checked >= 5 and (a.paired["n_pairs"] < 3).any()  # a partial level is among them
    # The report's table carries the same values (the identity is its point estimate).
    items = a.items.table.set_index(["level_spec", "method"])
    for key, row in paired.iterrows():
        assert items.loc[key, "n_pairs"] == row["n_pairs"]
        assert items.loc[key, "mean_diff"] == pytest.approx(row["mean_diff"], rel=1e-12, nan_ok=True)
    # No pair on the original sets: no interval and no p, whatever some resamples reach.
    unpaired = items[items["n_pairs"] == 0]
    assert len(unpaired) and unpaired[["boot_lo", "boot_hi", "p_boot", "p_boot_holm"]].isna().all().all()
    assert items[items["n_pairs"] > 0][["boot_lo", "boot_hi", "p_boot"]].notna().all().all()


def test_resampled_points_are_shares_of_drawn_problems_and_token_weighted_item_kl():
    recs = sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}, seeds=(0,))
    g = table_of(recs)
    sets = BT.eval_sets(g)
    # One resample drawing problem 0 sixty times: pass@1 is each run's pass on problem 0; the first two items of each
    # domain drawn 20 times each: KL = (20 k0 + 20 k1) / (20 n0 + 20 n1).
    problems = np.zeros((1, 60))
    problems[0, 0] = 60
    items = np.zeros((1, 40))
    items[0, :2] = 20
    res = BT.Resamples(problems, (items, items))
    assert BT.resampled_pass(sets.passed, res.problems)[0] == pytest.approx(sets.passed[:, 0])
    expect = np.mean([(k[:, 0] + k[:, 1]) / (n[:, 0] + n[:, 1]) for k, n in zip(sets.kl_sum, sets.n_tokens)], axis=0)
    assert BT.resampled_kl(sets, res)[0] == pytest.approx(expect, rel=1e-12)
    # The identity gives the recorded values.
    ident = BT.Resamples.identity(sets)
    assert BT.resampled_pass(sets.passed, ident.problems)[0] == pytest.approx(g[schema.TARGET_COL].to_numpy(), abs=1e-15)
    assert BT.resampled_kl(sets, ident)[0] == pytest.approx(g[schema.KL_MEAN_COL].to_numpy(), rel=1e-12)


def test_gain_levels_follow_the_resampled_base_and_reference_pass_at_1():
    g = table_of(sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}))
    sets = BT.eval_sets(g)
    base = (g["method"] == "base").to_numpy()
    ref = ((g["method"] == "lora") & (g["knob/train.steps"] == 600) & (g["scale"] == 1.0)).to_numpy()
    # Resample 0 draws 60 times a problem the base fails and k of the reference's 3 seeds pass; resample 1 one that
    # every run passes. Each level is lo + share * (hi - lo): lo the base runs' mean pass@1, hi the reference point's
    # mean over seeds (LoRA at 600 steps, scale 1), here lo = 0, hi = k / 3, then lo = hi = 1.
    middle = next(j for j in range(60) if 0 < sets.passed[ref, j].sum() < 3 and not sets.passed[base, j].any())
    easy = next(j for j in range(60) if sets.passed[:, j].all())
    k = sets.passed[ref, middle].sum()
    problems = np.zeros((2, 60))
    problems[0, middle], problems[1, easy] = 60, 60
    res = BT.Resamples(problems, tuple(np.ones((2, 40)) for _ in DOMAINS))
    req = BT.group_statistics(g, sets, res, LEVELS, True, "lora:train.steps=600").requirement
    assert req[0] == pytest.approx([0.5 * k / 3, 0.9 * k / 3, 0.35]) and req[1] == pytest.approx([1.0, 1.0, 0.35])


# ---- (b) a clear difference excludes 0; identical methods give 0 ----------------------------------------------------

def test_a_difference_large_against_problem_and_item_noise_has_an_interval_without_zero():
    a = _analysis(sweep({"atlas": (0.02, 0.40), "lora": (0.3, 0.40)}), resamples=400)
    t = a.items.table
    # At the top level a few resamples leave no seed pair reaching it: those have no statistic.
    assert list(t["method"]) == ["lora"] * 3 and (t["n_defined"] >= 390).all() and (t["n_defined"] == 400).any()
    assert (t["boot_hi"] < 0).all() and (t["mean_diff"] < 0).all()
    assert (t["boot_lo"] <= t["mean_diff"]).all() and (t["mean_diff"] <= t["boot_hi"]).all()
    assert (t["p_boot"] == 0.0).all()  # no resample on the other side of 0
    md = to_markdown({x.name: x for x in all_tables(a)}["paired_items"])
    assert "| <0.005 |" in md and "/400" in md and "400 resamples (numpy seed 0) of the 60 code problems" in md


def test_two_methods_with_identical_arrays_give_a_zero_width_interval_and_p_one():
    recs = sweep({"atlas": (0.05, 0.40)})
    twins = [json.loads(json.dumps(r).replace('"atlas"', '"lora"').replace("atlas-", "lora-")) for r in recs
             if r["method"] == "atlas"]
    a = _analysis(recs + twins, resamples=200)
    t = a.items.table
    assert len(t) == 3 and (t["n_pairs"] == 3).all()
    assert (t["mean_diff"] == 0).all() and (t["boot_lo"] == 0).all() and (t["boot_hi"] == 0).all()
    assert (t["p_boot"] == 1.0).all() and (t["p_boot_holm"] == 1.0).all()


def test_the_same_seed_gives_the_same_table_and_another_seed_another():
    recs = sweep({"atlas": (0.02, 0.40), "lora": (0.2, 0.40)})
    g = table_of(recs)
    one = BT.item_bootstrap(g, LEVELS, True, "lora:train.steps=600", n_resamples=150, seed=3).table
    again = BT.item_bootstrap(g, LEVELS, True, "lora:train.steps=600", n_resamples=150, seed=3).table
    other = BT.item_bootstrap(g, LEVELS, True, "lora:train.steps=600", n_resamples=150, seed=4).table
    assert one.equals(again) and not one["boot_lo"].equals(other["boot_lo"])
    assert one["mean_diff"].equals(other["mean_diff"])


# ---- (c) one point's pass@1 against SciPy's percentile bootstrap -----------------------------------------------------

def test_draw_counts_are_draws_with_replacement():
    counts = BT.draw_counts(50, 4000, np.random.default_rng(0))
    assert counts.shape == (4000, 50) and (counts.sum(axis=1) == 50).all()
    # Each unit's count is Binomial(50, 1/50): mean 1, variance 0.98.
    assert counts.mean() == pytest.approx(1.0) and counts.var() == pytest.approx(0.98, rel=0.05)


def test_marginal_interval_of_one_point_s_pass_at_1_agrees_with_scipy_bootstrap():
    passed = (np.random.default_rng(1).uniform(size=132) < 0.4).astype(float)
    n = 20_000
    counts = BT.draw_counts(len(passed), n, np.random.default_rng(2))
    ours = BT.percentile_interval(BT.resampled_pass(passed[None, :], counts)[:, 0], 0.95)
    ref = scipy.stats.bootstrap((passed,), np.mean, n_resamples=n, method="percentile", confidence_level=0.95,
                                rng=np.random.default_rng(3)).confidence_interval
    # Monte Carlo error of a 2.5% quantile over 20,000 resamples is about 0.001 here; one problem is 1/132.
    assert ours[0] == pytest.approx(ref.low, abs=0.004) and ours[1] == pytest.approx(ref.high, abs=0.004)
    assert ours[1] - ours[0] > 0.1  # not a degenerate interval


def test_bootstrap_p_and_percentile_interval_by_hand():
    assert BT.bootstrap_p(np.array([-1.0, 1.0, 2.0, 3.0])) == 0.5
    assert BT.bootstrap_p(np.array([-1.0, 0.0, 1.0, 2.0])) == 1.0
    assert BT.bootstrap_p(np.array([1.0, 2.0, np.nan])) == 0.0
    assert np.isnan(BT.bootstrap_p(np.array([np.nan])))
    assert BT.percentile_interval(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0), abs=1e-12)


# ---- records that cannot be resampled -------------------------------------------------------------------------------

def test_groups_that_cannot_be_resampled_say_why():
    recs = sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}, seeds=(0,))

    def reason(edit):
        rs = json.loads(json.dumps(recs))
        edit(rs)
        return BT.eval_sets(table_of(rs))

    def drop(rs):
        del rs[4]["metrics"]["target"]["per_problem"]
        for d in DOMAINS:
            del rs[4]["metrics"]["retained"][d]["per_item"]

    assert reason(drop) == ("1 of 9 runs carry no per-problem or per-item results (records made before "
                            "metrics.target.per_problem and the retained domains' per_item)")

    def other_problems(rs):
        rs[2]["metrics"]["target"]["per_problem"]["task_ids"][0] = "task/other"

    assert "different code problems" in reason(other_problems)

    def fewer_items(rs):
        for key in ("kl_sum", "n_tokens"):
            rs[3]["metrics"]["retained"]["math"]["per_item"][key].pop()

    assert "different math items" in reason(fewer_items)

    def wrong_kl(rs):
        rs[3]["metrics"]["retained"]["commonsense"]["kl_token_mean"] *= 1.01

    assert "commonsense.per_item gives KL" in reason(wrong_kl)

    def wrong_pass(rs):
        rs[3]["metrics"]["target"]["pass@1"] += 1 / 60

    assert "per_problem gives pass@1" in reason(wrong_pass)

    def not_binary(rs):
        rs[3]["metrics"]["target"]["per_problem"]["passed"][0] = 2

    assert "other than 0 and 1" in reason(not_binary)

    def lengths(rs):
        rs[3]["metrics"]["retained"]["math"]["per_item"]["n_tokens"].pop()

    assert "40 kl_sum and 39 n_tokens" in reason(lengths)

    mixed = json.loads(json.dumps(recs))
    for r in mixed:
        r["backbone"] = "other"
    drop(mixed)
    result = BT.item_bootstrap(table_of(recs + mixed), parse_levels(["0.3"]), n_resamples=100)
    assert set(result.table["backbone"]) == {"micro"}
    assert [u[:2] for u in result.unavailable] == [("other", "micro")]


def test_resamples_below_the_minimum_are_refused_before_any_compute():
    for bad in (10, 0, 100.0, True, "1000"):
        with pytest.raises(ValueError, match=rf"^resamples={bad!r} is not allowed: a whole number of bootstrap "
                                             r"resamples >= 100$"):
            analyze(table_of([]), ["0.3"], resamples=bad)


# ---- retained_near ----------------------------------------------------------------------------------------------------

def test_records_with_retained_near_are_read_from_it_and_older_ones_from_retained():
    old = record("lora", 0, 0.3, {"math": 0.1, "commonsense": 0.3})
    new = json.loads(json.dumps(old))
    m = new["metrics"]
    m["retained_near"] = m.pop("retained")
    m["retained_near"]["math"]["kl_token_mean"] = 0.2
    m["retained_far"] = {"code_review": {"kl_token_mean": 9.0, "n_tokens": 10, "n": 1}}
    assert validate(old) is None and validate(new) is None
    assert schema.to_row(old, "a")["retained/math/kl_token_mean"] == 0.1
    row = schema.to_row(new, "b")
    assert row["retained/math/kl_token_mean"] == 0.2 and "retained/code_review/kl_token_mean" not in row
    both = json.loads(json.dumps(new))
    both["metrics"]["retained"] = old["metrics"]["retained"]  # retained_near wins over retained
    assert schema.to_row(both, "c")["retained/math/kl_token_mean"] == 0.2
    m["retained_near"]["math"]["kl_token_mean"] = "x"
    assert validate(new) == "'metrics.retained_near.math.kl_token_mean' is string, expected a finite number"
    del m["retained_near"]
    assert validate(new) == "missing 'metrics.retained'"


def test_per_item_column_only_for_records_that_carry_the_fields():
    plain = record("lora", 0, 0.3)
    assert schema.PER_ITEM_COL not in schema.to_row(plain, "a")
    rich = with_items(record("lora", 0, 0.3), [1, 0, 1], {"math": ([0.5, 1.0], [2, 3])})
    data = json.loads(schema.to_row(rich, "b")[schema.PER_ITEM_COL])
    assert data == {"problems": {"task_ids": ["task/0", "task/1", "task/2"], "passed": [1, 0, 1]},
                    "items": {"math": {"kl_sum": [0.5, 1.0], "n_tokens": [2, 3]}}}


# ---- (d) the report ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_report_without_the_fields_writes_no_table_and_says_why(tmp_path, capsys):
    recs = sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}, seeds=(0, 1))
    for r in recs:
        del r["metrics"]["target"]["per_problem"]
        for d in DOMAINS:
            del r["metrics"]["retained"][d]["per_item"]
        write(tmp_path / "records", r)
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "records"), "--out", str(out), "--levels", "0.3", "--no-progress"]) == 0
    line = ("paired_items: not written: Not resampled over code problems and retained items: micro: 18 of 18 runs "
            "carry no per-problem or per-item results (records made before metrics.target.per_problem and the retained "
            "domains' per_item).")
    assert line in capsys.readouterr().out.splitlines()
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert "tables/paired.md" in files and not any("paired_items" in f for f in files)
    assert "paired_items" not in (out / "index.md").read_text()


@pytest.mark.slow
def test_report_with_the_fields_writes_the_table_next_to_the_paired_one(tmp_path):
    for r in sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}, seeds=(0, 1)):
        write(tmp_path / "records", r)
    out = tmp_path / "report"
    rep = write_report([str(tmp_path / "records")], out, levels=["0.3"], resamples=100)
    # no far items and no dev records here: no verdict, no dev candidates; the items table is written
    assert [a.split(":")[0] for a in rep.absent] == ["verdict", "dev_candidates"]
    index = (out / "index.md").read_text()
    assert index.index("tables/paired.md") < index.index("tables/paired_items.md") < index.index("tables/dominance.md")
    assert "--resamples 100" in index and "(data/paired_items.csv)" in index
    data = (out / "data" / "paired_items.csv").read_text().splitlines()
    assert data[0] == ",".join(BT.BOOT_COLS) and len(data) == 2
    assert schema.PER_ITEM_COL not in (out / "data" / "runs.csv").read_text().splitlines()[0].split(",")
    assert collect([str(tmp_path / "records")]).table[schema.PER_ITEM_COL].notna().all()


def test_far_items_are_item_sets_of_their_own_weighted_as_the_headline():
    recs = sweep({"atlas": (0.02, 0.4), "lora": (0.2, 0.4)}, seeds=(0,))
    rng = np.random.default_rng(7)
    far_tokens = rng.integers(5, 40, 25)
    for i, rec in enumerate(recs):
        m = rec["metrics"]
        m["retained_near"] = m.pop("retained")
        far = {}
        for j, dom in enumerate(DOMAINS):
            k = rng.gamma(2.0, 0.3, 25) * far_tokens * (i % 3)  # base runs: 0
            far[dom] = {"kl_token_mean": float(k.sum() / far_tokens.sum()), "kl_seq_mean": float(k.mean()),
                        "n_tokens": int(far_tokens.sum()), "n": 25,
                        "per_item": {"kl_sum": [float(v) for v in k], "n_tokens": [int(v) for v in far_tokens]}}
        m["retained_far"] = far
        near = np.mean([e["kl_token_mean"] for e in m["retained_near"].values()])
        m["retained_kl_mean"] = float((near + np.mean([e["kl_token_mean"] for e in far.values()])) / 2)
        assert validate(rec) is None
    g = table_of(recs)
    sets = BT.eval_sets(g)
    assert not isinstance(sets, str), sets
    assert sets.domains == ("math", "commonsense", "math (far)", "commonsense (far)")
    assert sets.weights == (0.25, 0.25, 0.25, 0.25) and sets.n_items["math (far)"] == 25
    ident = BT.Resamples.identity(sets)
    assert BT.resampled_kl(sets, ident)[0] == pytest.approx(g[schema.KL_MEAN_COL].to_numpy(), rel=1e-12)
    # a record whose headline is not the near/far mean cannot be resampled, and says so
    recs[1]["metrics"]["retained_kl_mean"] *= 1.5
    assert "retained_kl_mean is" in BT.eval_sets(table_of(recs))
    assert BT.headline_weights(2, 0) == [0.5, 0.5] and BT.headline_weights(2, 1) == [0.25, 0.25, 0.5]
