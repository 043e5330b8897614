"""Equal tuning budget (analysis/tune.py): every method's points chosen by one rule from dev-split records, worked
out by hand; dev records never mix with test records; the written point files."""

from __future__ import annotations

import pytest
import yaml
from analysis_synth import record, write

from analysis import schema
from analysis.cli import main
from analysis.collect import make_table
from analysis.tune import choose_points, pass1_se, stability, tune

# dev pass@1, KL per grid point (seed 0); the reference is LoRA at 600 steps: base 0, hi 0.6 -> low 0.3, high 0.54
LORA = {150: (0.20, 0.01), 300: (0.40, 0.05), 450: (0.55, 0.10), 600: (0.60, 0.20)}
EWC = {10.0: (0.50, 0.03), 100.0: (0.45, 0.02), 1000.0: (0.30, 0.01), 10000.0: (0.10, 0.005)}
ATLAS = {0.25: (0.60, 0.15), 0.5: (0.58, 0.10), 0.75: (0.57, 0.08), 1.0: (0.56, 0.06)}


def dev_records(split="dev"):
    recs = [record("base", 0, 0.0, {"math": 0.0, "commonsense": 0.0}, split=split)]
    recs += [record("lora", 0, p, {"math": kl, "commonsense": kl}, steps=s, split=split) for s, (p, kl) in LORA.items()]
    recs += [record("ewc", 0, p, {"math": kl, "commonsense": kl}, knobs={"ewc_lambda": lam}, split=split)
             for lam, (p, kl) in EWC.items()]
    recs += [record("atlas", 0, p, {"math": kl, "commonsense": kl}, knobs={"rank": 8, "conditioning": c}, split=split)
             for c, (p, kl) in ATLAS.items()]
    return recs


def table(records):
    return make_table(schema.to_row(r, f"src/{i}") for i, r in enumerate(records))


def test_each_method_gets_the_same_number_of_points_by_one_rule():
    chosen = choose_points(table(dev_records()), "lora:train.steps=600", n_points=2)
    assert list(chosen) == [("micro", "micro@dev")]
    got = {(c.method, c.knobs, c.role) for c in chosen[("micro", "micro@dev")]}
    assert got == {
        # the reference's own method: the reference point first (it defines the levels, so it is run anyway and
        # counts against LoRA's budget), although 450 would be the least KL reaching 0.54; then the least KL
        # reaching 0.3
        ("lora", (("train.steps", 600),), "reference"), ("lora", (("train.steps", 300),), "low"),
        # never reaches 0.54: its highest pass@1 (lambda 10); then the least KL reaching 0.3 (lambda 1000)
        ("ewc", (("ewc_lambda", 10.0),), "high: not reached"), ("ewc", (("ewc_lambda", 1000.0),), "low"),
        # every point reaches 0.54: the least KL (c = 1); then the least KL among the rest (c = 0.75)
        ("atlas", (("conditioning", 1.0),), "high"), ("atlas", (("conditioning", 0.75),), "low"),
    }
    three = choose_points(table(dev_records()), "lora:train.steps=600", n_points=3)[("micro", "micro@dev")]
    ewc = [c for c in three if c.method == "ewc"]
    assert [c.knobs[0][1] for c in ewc] == [10.0, 1000.0, 100.0]   # the third: least KL of the rest reaching 0.3
    five = choose_points(table(dev_records()), "lora:train.steps=600", n_points=5)[("micro", "micro@dev")]
    assert sum(c.method == "lora" for c in five) == 4                # never more than the grid
    # another reference: LoRA is chosen by the rule (450: least KL reaching the high level), EWC starts from it
    by_ewc = choose_points(table(dev_records()), "ewc:ewc_lambda=10", n_points=2)[("micro", "micro@dev")]
    assert [(c.knobs, c.role) for c in by_ewc if c.method == "lora"][0] == ((("train.steps", 450),), "high")
    assert [(c.knobs, c.role) for c in by_ewc if c.method == "ewc"][0] == ((("ewc_lambda", 10.0),), "reference")


def test_dev_and_test_records_never_mix():
    both = table(dev_records() + dev_records(split="test"))
    assert sorted(set(both["benchmark"])) == ["micro", "micro@dev"]
    assert both.groupby("sweep_key")["benchmark"].nunique().max() == 1  # the same knobs: two sweep points
    # tuning reads the dev group only: the test records change nothing
    assert choose_points(both, "lora:train.steps=600", 2) == choose_points(table(dev_records()), "lora:train.steps=600", 2)
    with pytest.raises(ValueError, match=r"dev-split records only, and there are none among \['micro/micro'\]"):
        choose_points(table(dev_records(split="test")), "lora:train.steps=600", 2)


def test_tune_writes_point_files_and_removes_stale_ones(tmp_path, capsys):
    for rec in dev_records():
        write(tmp_path / "runs", rec)
    out = tmp_path / "point"
    out.mkdir()
    (out / "micro_main_olora_1.yaml").write_text("stale\n")
    (out / "micro_lora_s300.yaml").write_text("kept: other prefix\n")
    frame, written, _, threads = tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, out=out,
                                      prefix="micro_main")
    assert threads == {}  # these records carry no `cost.threads`: the files say nothing about it
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"micro_main_{m}_{i}.yaml" for m in ("atlas", "lora", "ewc") for i in (1, 2)] + ["micro_lora_s300.yaml"])
    lora_high = yaml.safe_load((out / "micro_main_lora_1.yaml").read_text())
    assert lora_high == {"defaults": [{"override /method": "lora"}], "train": {"steps": 600}}
    assert yaml.safe_load((out / "micro_main_ewc_1.yaml").read_text())["method"] == {"ewc_lambda": 10}
    # written in the type of the configured default (the run id hashes `1.0` and `1` differently): ATLAS's
    # conditioning 1 is its default run, a float; LoRA's steps stay an integer
    assert "method: {conditioning: 1.0}" in (out / "micro_main_atlas_1.yaml").read_text()
    assert "train: {steps: 600}" in (out / "micro_main_lora_1.yaml").read_text()
    assert "(reference: levels" in (out / "micro_main_lora_1.yaml").read_text()
    assert "dev pass@1 0.6000, retained KL 0.2000" in (out / "micro_main_lora_1.yaml").read_text()
    assert list(frame["role"]).count("high") == 1 and list(frame["role"]).count("reference") == 1
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--points", "0"]) == 2
    assert "points 0: at least 1" in capsys.readouterr().err


def test_point_files_say_which_thread_count_made_the_dev_records_and_a_mix_is_warned_about(tmp_path, capsys):
    def with_threads(counts):
        recs = dev_records()
        for i, rec in enumerate(recs):
            rec["cost"] = {**(rec.get("cost") or {}), "threads": counts[i % len(counts)]}
        return recs

    for rec in with_threads([2]):
        write(tmp_path / "two" / "runs", rec)
    out = tmp_path / "two" / "point"
    assert main(["tune", str(tmp_path / "two" / "runs"), "--reference", "lora:train.steps=600", "--points", "2",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Dev records trained with 2 intra-op thread(s): re-make them that way" in printed
    assert "warning" not in printed
    text = (out / "micro_main_atlas_1.yaml").read_text()
    assert "# Dev records trained with 2 intra-op thread(s) (`cost.threads`)" in text
    assert yaml.safe_load(text)["method"] == {"conditioning": 1.0}  # a comment: the point itself is unchanged

    recs = with_threads([1, 2])
    for rec in recs:
        write(tmp_path / "mixed", rec)
    ones = sum(r["cost"]["threads"] == 1 for r in recs)
    assert main(["tune", str(tmp_path / "mixed"), "--reference", "lora:train.steps=600", "--points", "2"]) == 0
    assert (f"warning: the dev records were trained with different intra-op thread counts (1 thread(s): {ones} "
            f"records, 2 thread(s): {len(recs) - ones} records; `cost.threads`)") in capsys.readouterr().out


def test_stability_names_the_methods_whose_choice_hangs_on_points_within_their_error_of_a_level(tmp_path, capsys):
    # 100 problems, one seed: the reference (0.6) has SE 0.049, so the levels 0.3 and 0.54 have SEs 0.0245 and 0.0441
    # (the base, at 0, has none). Every ATLAS point lies within 1 combined SE of the high level (0.56 is +0.3 SE,
    # 0.60 is +0.9 SE): read as missing it, no point reaches it, the highest pass@1 (c = 0.25) is the high point
    # and the least-KL point reaching the low level (c = 1) the other: the pair {0.25, 1} instead of {1, 0.75}.
    # EWC's lambda 1000 sits on the low level (0.30, +0.0 SE): read as missing it, the low point is lambda 100.
    # LoRA's close points (450 and 600 near the high level) do not change its choice: the reference comes first.
    assert pass1_se(0.6, 100) == pytest.approx(0.04899, abs=1e-5) and pass1_se(0.0, 100) == 0.0
    found = {st.method: st for st in stability(table(dev_records()), "lora:train.steps=600", 2)[("micro", "micro@dev")]}
    assert found["atlas"].close and found["atlas"].alternative == ((("conditioning", 0.25),), (("conditioning", 1.0),))
    assert "conditioning=1.0 (high level, +0.3 SE)" in found["atlas"].close_points
    assert found["ewc"].close and found["ewc"].alternative == ((("ewc_lambda", 10.0),), (("ewc_lambda", 100.0),))
    assert "ewc_lambda=1000.0 (low level, +0.0 SE)" in found["ewc"].close_points
    assert not found["lora"].close and found["lora"].alternative == ()
    assert {c.split(" (")[0] for c in found["lora"].close_points} == {"train.steps=450", "train.steps=600"}
    # a tighter band: ATLAS's points (0.3-0.9 SE above) are no longer close calls; EWC's point on the level still is
    tight = {st.method: st for st in stability(table(dev_records()), "lora:train.steps=600", 2, z=0.1)[("micro", "micro@dev")]}
    assert not tight["atlas"].close and tight["atlas"].close_points == () and tight["ewc"].close
    # the same with 3 seeds per point: each mean has a smaller error, and ATLAS's 0.56 (+0.5 SE) stays a close call
    # only at the default band
    three = [dict(r, seed=s, run_id=f"{r['run_id']}-{s}") for r in dev_records() for s in (0, 1, 2)]
    seeded = {st.method: st for st in stability(table(three), "lora:train.steps=600", 2)[("micro", "micro@dev")]}
    assert "conditioning=1.0 (high level, +0.5 SE)" in seeded["atlas"].close_points

    for rec in dev_records():
        write(tmp_path / "runs", rec)
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600"]) == 0
    out = capsys.readouterr().out
    assert "  atlas: close: the other reading chooses conditioning=0.25 | conditioning=1.0; close points:" in out
    assert "  lora: firm (close points that do not change it:" in out
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--close-se", "0"]) == 2
    assert "--close-se 0.0: a number of standard errors > 0" in capsys.readouterr().err
