"""Equal tuning budget (analysis/tune.py): every method's points chosen by one rule from dev-split records, worked
out by hand; dev records never mix with test records; the written point files; unequal budgets and picks at the
edge of their grid refused (with the candidates beyond the edge), unless let through; the dev candidates table."""

from __future__ import annotations

import pytest
import yaml
from analysis_synth import record, write

from analysis import schema
from analysis.cli import main
from analysis.collect import make_table
from analysis.tune import (Refused, between, choose_points, extension_round, grid_edges, grid_spacing, next_beyond,
                           pass1_se, stability, tune)

# dev pass@1, KL per grid point (seed 0); the reference is LoRA at 600 steps: base 0, hi 0.6 -> low 0.3, high 0.54
LORA = {150: (0.20, 0.01), 300: (0.40, 0.05), 450: (0.55, 0.10), 600: (0.60, 0.20)}
EWC = {10.0: (0.45, 0.04), 100.0: (0.50, 0.03), 1000.0: (0.30, 0.01), 10000.0: (0.10, 0.005)}
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
        # never reaches 0.54: its highest pass@1 (lambda 100); then the least KL reaching 0.3 (lambda 1000)
        ("ewc", (("ewc_lambda", 100.0),), "high: not reached"), ("ewc", (("ewc_lambda", 1000.0),), "low"),
        # every point reaches 0.54: the least KL (c = 1); then the least KL among the rest (c = 0.75)
        ("atlas", (("conditioning", 1.0),), "high"), ("atlas", (("conditioning", 0.75),), "low"),
    }
    three = choose_points(table(dev_records()), "lora:train.steps=600", n_points=3)[("micro", "micro@dev")]
    ewc = [c for c in three if c.method == "ewc"]
    assert [c.knobs[0][1] for c in ewc] == [100.0, 1000.0, 10.0]   # the third: least KL of the rest reaching 0.3
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
    # one dev seed: let through explicitly (min_seeds=1); no pick is at a refused edge of its grid
    frame, written, _, threads, edges, _, candidates = tune([str(tmp_path / "runs")], "lora:train.steps=600", 2,
                                                            out=out, prefix="micro_main", min_seeds=1)
    assert threads == {}  # these records carry no `cost.threads`: the files say nothing about it
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"micro_main_{m}_{i}.yaml" for m in ("atlas", "lora", "ewc") for i in (1, 2)]
        + ["micro_lora_s300.yaml", "micro_main_candidates.csv"])
    assert candidates == out / "micro_main_candidates.csv"
    assert not any(e.refused for e in edges)
    assert not any("At the edge" in p.read_text() for p in written)
    lora_high = yaml.safe_load((out / "micro_main_lora_1.yaml").read_text())
    assert lora_high == {"defaults": [{"override /method": "lora"}], "train": {"steps": 600}}
    assert yaml.safe_load((out / "micro_main_ewc_1.yaml").read_text())["method"] == {"ewc_lambda": 100}
    # written in the type of the configured default (the run id hashes `1.0` and `1` differently): ATLAS's
    # conditioning 1 is its default run, a float; LoRA's steps stay an integer
    assert "method: {conditioning: 1.0}" in (out / "micro_main_atlas_1.yaml").read_text()
    assert "train: {steps: 600}" in (out / "micro_main_lora_1.yaml").read_text()
    assert "(reference: levels" in (out / "micro_main_lora_1.yaml").read_text()
    assert "dev pass@1 0.6000, retained KL 0.2000" in (out / "micro_main_lora_1.yaml").read_text()
    assert list(frame["role"]).count("high") == 1 and list(frame["role"]).count("reference") == 1
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--points", "0",
                 "--min-dev-seeds", "1"]) == 2
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
                 "--out", str(out), "--min-dev-seeds", "1"]) == 0
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
    assert main(["tune", str(tmp_path / "mixed"), "--reference", "lora:train.steps=600", "--points", "2",
                 "--min-dev-seeds", "1"]) == 0
    assert (f"warning: the dev records were trained with different intra-op thread counts (1 thread(s): {ones} "
            f"records, 2 thread(s): {len(recs) - ones} records; `cost.threads`)") in capsys.readouterr().out


def test_stability_names_the_methods_whose_choice_hangs_on_points_within_their_error_of_a_level(tmp_path, capsys):
    # 100 problems, one seed: the reference (0.6) has SE 0.049, so the levels 0.3 and 0.54 have SEs 0.0245 and 0.0441
    # (the base, at 0, has none). Every ATLAS point lies within 1 combined SE of the high level (0.56 is +0.3 SE,
    # 0.60 is +0.9 SE): read as missing it, no point reaches it, the highest pass@1 (c = 0.25) is the high point
    # and the least-KL point reaching the low level (c = 1) the other: the pair {0.25, 1} instead of {1, 0.75}.
    # EWC's lambda 1000 sits on the low level (0.30, +0.0 SE): read as missing it, the low point is lambda 10.
    # LoRA's close points (450 and 600 near the high level) do not change its choice: the reference comes first.
    assert pass1_se(0.6, 100) == pytest.approx(0.04899, abs=1e-5) and pass1_se(0.0, 100) == 0.0
    found = {st.method: st for st in stability(table(dev_records()), "lora:train.steps=600", 2)[("micro", "micro@dev")]}
    assert found["atlas"].close and found["atlas"].alternative == ((("conditioning", 0.25),), (("conditioning", 1.0),))
    assert "conditioning=1.0 (high level, +0.3 SE)" in found["atlas"].close_points
    assert found["ewc"].close and found["ewc"].alternative == ((("ewc_lambda", 100.0),), (("ewc_lambda", 10.0),))
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
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--min-dev-seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "  atlas: close: the other reading chooses conditioning=0.25 | conditioning=1.0; close points:" in out
    assert "  lora: firm (close points that do not change it:" in out
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--close-se", "0"]) == 2
    assert "--close-se 0.0: a number of standard errors > 0" in capsys.readouterr().err


def two_seeds(recs):
    """The records at seeds 0 and 1, pass@1 +-0.01 and KL x1.1 / x0.9 around the one-seed values (the same means);
    the base stays at 0."""
    out = []
    for r in recs:
        for seed, dp, fk in ((0, 0.01, 1.1), (1, -0.01, 0.9)):
            base = r["method"] == "base"
            kl = {d: v["kl_token_mean"] * fk for d, v in r["metrics"]["retained"].items()}
            knobs = {k: v for k, v in r["knobs"].items() if k != "name"}
            out.append(record(r["method"], seed, r["metrics"]["target"]["pass@1"] + (0 if base else dp), kl,
                              knobs=knobs, steps=r["config"]["train"]["steps"], split="dev"))
    return out


# EWC's least KL reaching the low level (0.3) is its largest lambda: the grid may stop short of the choice
EWC_EDGE = {10.0: (0.50, 0.03), 100.0: (0.45, 0.02), 1000.0: (0.40, 0.01), 10000.0: (0.35, 0.005)}
# LwF on an arithmetic grid: lambda 4 reaches the high level (0.54) at the least KL
LWF = {1.0: (0.60, 0.08), 2.0: (0.58, 0.06), 3.0: (0.56, 0.05), 4.0: (0.55, 0.04)}


def edge_records():
    recs = [r for r in dev_records() if r["method"] != "ewc"]
    recs += [record("ewc", 0, p, {"math": kl, "commonsense": kl}, knobs={"ewc_lambda": lam}, split="dev")
             for lam, (p, kl) in EWC_EDGE.items()]
    recs += [record("lwf", 0, p, {"math": kl, "commonsense": kl}, knobs={"lwf_lambda": lam}, split="dev")
             for lam, (p, kl) in LWF.items()]
    return two_seeds(recs)


def test_a_pick_at_the_edge_of_its_grid_is_refused_with_the_candidates_beyond_it(tmp_path, capsys):
    for rec in edge_records():
        write(tmp_path / "runs", rec)
    out = tmp_path / "point"
    with pytest.raises(Refused) as refused:
        tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, out=out)
    lines = str(refused.value).split("\nthe extension round")[0].splitlines()
    # one line per refused method: each edge, its grid, and the next candidates continuing the grid's spacing:
    # EWC's grid is geometric (x10) -> 1e5, 1e6 above its low pick, 1, 0.1 below its best pass@1 (`high: not
    # reached`: a step further may raise it past the level); LwF's grid arithmetic (+1) -> 5, 6
    assert ("  ewc: high: not reached pick ewc_lambda=10.0 is the smallest value of its grid [10, 100, 1000, 10000]; "
            "next candidates beyond it (geometric): 1, 0.1; low pick ewc_lambda=10000.0 is the largest value of its "
            "grid [10, 100, 1000, 10000]; next candidates beyond it (geometric): 100000, 1e+06") in lines
    assert ("  lwf: high pick lwf_lambda=4.0 is the largest value of its grid [1, 2, 3, 4]; next candidates beyond "
            "it (arithmetic): 5, 6") in lines
    # not refused: LoRA's reference (600 steps: the protocol's budget), ATLAS's conditioning 1 (the knob's bound,
    # nothing beyond)
    assert not any(line.startswith(("  lora", "  atlas")) for line in lines)
    assert sum(line.startswith("  ewc") for line in lines) == 1
    assert not out.exists()  # nothing written
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--out", str(out)]) == 2
    assert "error: tune refuses:" in capsys.readouterr().err

    # let through by name: the run passes, and the point files of the allowed picks say so
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--out", str(out),
                 "--allow-edge", "ewc", "lwf"]) == 0
    printed = capsys.readouterr().out
    assert "  ewc: high: not reached pick ewc_lambda=10.0 is the smallest value of its grid [10, 100, 1000, 10000]; " \
           "next candidates beyond it (geometric): 1, 0.1 (let through by --allow-edge)" in printed
    assert "  atlas: high pick conditioning=1.0 is the largest value of its grid [0.25, 0.5, 0.75, 1]," in printed
    assert "the knob's bound (conditioning <= 1): nothing beyond (accepted: the knob's bound)" in printed
    low = (out / "micro_main_ewc_2.yaml").read_text()
    assert ("# At the edge of its grid, let through by `--allow-edge ewc`: low pick ewc_lambda=10000.0 is the largest "
            "value of its grid [10, 100, 1000, 10000]; next candidates beyond it (geometric): 100000, 1e+06.\n"
            "defaults:") in low
    assert yaml.safe_load(low)["method"] == {"ewc_lambda": 10000.0}
    assert "let through by `--allow-edge ewc`: high: not reached pick ewc_lambda=10.0" in \
        (out / "micro_main_ewc_1.yaml").read_text()
    assert "let through by `--allow-edge lwf`" in (out / "micro_main_lwf_1.yaml").read_text()
    assert not any("At the edge" in (out / f"micro_main_{m}_{i}.yaml").read_text()
                   for m in ("lora", "atlas") for i in (1, 2))
    # only ewc: lwf is still refused; a name that is no tuned method is an error, not a silent pass
    with pytest.raises(Refused, match=r"\n  lwf: high pick") as only_ewc:
        tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, allow_edge=["ewc"])
    assert "  ewc:" not in str(only_ewc.value).split("\nthe extension round")[0]
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--allow-edge", "ewc", "lwf",
                 "olora"]) == 2
    assert "--allow-edge olora: no such tuned method (tuned: atlas, ewc, lora, lwf)" in capsys.readouterr().err


def test_a_refusal_names_the_extension_round_equal_for_every_method_beyond_refused_edges_else_beside_the_picks(
        tmp_path):
    for rec in edge_records():
        write(tmp_path / "runs", rec)
    with pytest.raises(Refused) as refused:
        tune([str(tmp_path / "runs")], "lora:train.steps=600", 2)
    text = str(refused.value)
    # EWC is refused with 4 candidates beyond its edges (1, 0.1 below its best pass@1 at lambda 10; 1e5, 1e6 above
    # its low pick), LwF with 2 (5, 6), so every tuned method gets 4 new ones. LwF then beside its picks (high 4:
    # 3.5 below, nothing above; low 3: 2.5 below, 3.5 above is taken). ATLAS beside its high pick (conditioning 1:
    # 0.875 below, nothing above) then its low pick (0.75: 0.625 below; 0.875 above is taken), then halving again
    # with those as grid values (1: 0.9375; 0.75: 0.6875 below). LoRA beside its low pick (300 on the arithmetic
    # grid [150, 300, 450, 600]: 225 below, 375 above, then 262.5 and 337.5, rounded to integers as steps are, half to
    # even; the reference, 600, is fixed)
    assert text.split("the extension round on micro/micro@dev ")[1].splitlines() == [
        "(4 new candidate(s) for every tuned method: beyond the edge where refused, else beside the picks):",
        "  atlas: conditioning=0.875 | conditioning=0.625 | conditioning=0.9375 | conditioning=0.6875",
        "  lora: train.steps=225 | train.steps=375 | train.steps=262 | train.steps=338",
        "  ewc: ewc_lambda=1.0 | ewc_lambda=0.1 | ewc_lambda=100000.0 | ewc_lambda=1000000.0",
        "  lwf: lwf_lambda=5.0 | lwf_lambda=6.0 | lwf_lambda=3.5 | lwf_lambda=2.5"]
    # EWC let through: beside its picks on its geometric grid, halfway between 10 and 100, then 1000 and 10000
    with pytest.raises(Refused) as only_lwf:
        tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, allow_edge=["ewc"])
    assert "  ewc: ewc_lambda=31.62 | ewc_lambda=3162.0" in str(only_lwf.value).splitlines()
    # written as point files with --extension-prefix (the refusal stands: exit 2), each saying why it is there
    out = tmp_path / "point"
    assert main(["tune", str(tmp_path / "runs"), "--reference", "lora:train.steps=600", "--out", str(out),
                 "--extension-prefix", "ext1"]) == 2
    files = sorted(p.name for p in out.glob("*.yaml"))
    assert files == [f"ext1_{m}_{i}.yaml" for m in ("atlas", "ewc", "lora", "lwf") for i in (1, 2, 3, 4)]
    assert yaml.safe_load((out / "ext1_ewc_1.yaml").read_text())["method"] == {"ewc_lambda": 1.0}
    assert "beyond: high: not reached pick ewc_lambda=10.0 is the smallest value" in \
        (out / "ext1_ewc_1.yaml").read_text()
    ewc = (out / "ext1_ewc_3.yaml").read_text()
    assert yaml.safe_load(ewc) == {"defaults": [{"override /method": "ewc"}], "method": {"ewc_lambda": 100000.0}}
    assert "# Extension candidate (dev split), named by `python -m analysis tune` after a refusal: beyond: low pick " \
           "ewc_lambda=10000.0 is the largest value" in ewc
    assert yaml.safe_load((out / "ext1_lora_2.yaml").read_text())["train"] == {"steps": 375}
    assert "beside the low pick train.steps=300 (above, arithmetic)" in (out / "ext1_lora_2.yaml").read_text()
    assert main(["tune", str(tmp_path / "runs"), "--extension-prefix", "micro_main", "--out", str(out)]) == 2
    # nothing refused (both let through): no extension round
    tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, allow_edge=["ewc", "lwf"])
    df = table(edge_records())
    choices = choose_points(df, "lora:train.steps=600", 2)
    edges = grid_edges(df, choices)
    assert extension_round(df, choices, edges, allow_edge=["ewc", "lwf"]) == {("micro", "micro@dev"): []}
    # with ATLAS's high pick alone, the halving goes on from each new value: 0.875, 0.9375, 0.96875, 0.984375
    # (4 significant digits, as the candidates beyond are rounded)
    group = ("micro", "micro@dev")
    only_high = {group: [c for c in choices[group] if c.method != "atlas" or c.role == "high"]}
    atlas = [c for c in extension_round(df, only_high, edges)[group] if c.method == "atlas"]
    assert [c.knobs for c in atlas] == [(("conditioning", v),) for v in (0.875, 0.9375, 0.9688, 0.9844)]
    assert atlas[1].why == "beside the high pick conditioning=1.0 (below, arithmetic)"
    # halfway in the grid's spacing, rounded as the candidates beyond are; nothing where rounding leaves no value
    assert between(300, 450, "arithmetic", integer=True) == 375 and between(10, 100, "geometric") == 31.62
    assert between(1, 2, "arithmetic", integer=True) is None and between(16, 32, "geometric", integer=True) == 23


def test_a_knob_resolved_from_another_at_run_time_is_not_written_to_the_point_file(tmp_path):
    # CorDA's alpha is null in its config and resolves to its rank (records carry the resolved value): the points
    # set the rank only, as the candidates did, so a chosen point is the tuned run (the same run id)
    corda = {4: (0.40, 0.07), 8: (0.55, 0.04), 16: (0.50, 0.05), 32: (0.58, 0.08)}
    recs = [r for r in dev_records() if r["method"] in ("base", "lora")]
    recs += [record("corda", 0, p, {"math": kl, "commonsense": kl}, knobs={"rank": r, "alpha": float(r)}, split="dev")
             for r, (p, kl) in corda.items()]
    for rec in two_seeds(recs):
        write(tmp_path / "runs", rec)
    out = tmp_path / "point"
    tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, out=out)
    # the least KL reaching 0.54 (rank 8), then the least of the rest reaching 0.3 (rank 16)
    assert [yaml.safe_load((out / f"micro_main_corda_{i}.yaml").read_text())["method"] for i in (1, 2)] == [
        {"rank": 8}, {"rank": 16}]
    # a null knob set apart from the others is a knob of the grid
    apart = [r for r in dev_records() if r["method"] in ("base", "lora")]
    apart += [record("corda", 0, p, {"math": kl, "commonsense": kl}, knobs={"rank": 8, "alpha": a}, split="dev")
              for a, (p, kl) in zip((4.0, 8.0, 16.0, 32.0), corda.values())]
    chosen = choose_points(table(two_seeds(apart)), "lora:train.steps=600", 2)[("micro", "micro@dev")]
    assert [c.knobs for c in chosen if c.method == "corda"] == [(("alpha", 8.0),), (("alpha", 16.0),)]


def test_the_candidates_beyond_an_edge_continue_the_grid_inside_the_knob_s_bounds():
    assert grid_spacing([1, 30, 1000, 30000]) == "geometric" and grid_spacing([0.05, 0.1, 0.5, 1]) == "geometric"
    assert grid_spacing([0.25, 0.5, 0.75, 1]) == "arithmetic" and grid_spacing([150, 300, 450, 600]) == "arithmetic"
    assert grid_spacing([-1, 0, 1]) == "arithmetic"
    # two values: geometric from a factor of 2 up
    assert grid_spacing([300, 600]) == "geometric" and grid_spacing([0.75, 1.0]) == "arithmetic"
    assert next_beyond([1e-5, 3e-5, 1e-4, 3e-4], "largest") == ([9e-4, 2.7e-3], "geometric")
    assert next_beyond([1e-5, 3e-5, 1e-4, 3e-4], "smallest") == ([3.333e-6, 1.111e-6], "geometric")
    # an excluded bound is approached by halving the distance: InfLoRA's epsilon < 1, replay's rho < 1
    assert next_beyond([0.95, 0.97, 0.98, 0.99], "largest", (0.0, 1.0, True, True)) == ([0.995, 0.9975], "arithmetic")
    assert next_beyond([0.95, 0.97, 0.98, 0.99], "smallest", (0.0, 1.0, True, True))[0] == [0.93, 0.91]
    assert next_beyond([0.25, 0.5], "largest", (0.0, 1.0, True, True))[0] == [0.75, 0.875]
    # an included bound is the last candidate (conditioning 0 = plain LoRA); at the bound, nothing is beyond
    assert next_beyond([0.25, 0.5, 0.75, 1.0], "smallest", (0.0, 1.0, False, False))[0] == [0.0]
    assert next_beyond([0.25, 0.5, 0.75, 1.0], "largest", (0.0, 1.0, False, False))[0] == []
    # steps > 0 and at most the budget; an integer knob stays integral (CorDA's rank)
    assert next_beyond([150, 300, 450, 600], "smallest", (0.0, 600.0, True, False), integer=True)[0] == [75, 38]
    assert next_beyond([150, 300, 450, 600], "largest", (0.0, 600.0, True, False), integer=True)[0] == []
    assert next_beyond([16, 32, 64, 128], "smallest", (1.0, None, False, False), integer=True)[0] == [8, 4]
    assert next_beyond([16, 32, 64, 128], "largest", (1.0, None, False, False), integer=True)[0] == [256, 512]
    assert next_beyond([1, 2], "smallest", (1.0, None, False, False), integer=True)[0] == []


def test_unequal_candidates_or_dev_seeds_are_refused_naming_the_methods(tmp_path, capsys):
    both = two_seeds(dev_records())
    # two seeds everywhere, the same 4 candidates per method: passes at the default (>= 2 dev seeds)
    for rec in both:
        write(tmp_path / "equal", rec)
    assert main(["tune", str(tmp_path / "equal"), "--reference", "lora:train.steps=600"]) == 0
    capsys.readouterr()
    # one seed: refused by default, let through for a smoke test
    for rec in dev_records():
        write(tmp_path / "one", rec)
    assert main(["tune", str(tmp_path / "one"), "--reference", "lora:train.steps=600"]) == 2
    err = capsys.readouterr().err
    assert "micro/micro@dev: fewer than 2 dev seeds" in err
    assert "\n  ewc: 4 candidate(s), 1 dev seed(s) per candidate\n" in err
    assert main(["tune", str(tmp_path / "one"), "--reference", "lora:train.steps=600", "--min-dev-seeds", "1"]) == 0
    capsys.readouterr()
    # EWC with 3 candidates, one ATLAS candidate with a single seed
    uneven = [r for r in both if not (r["method"] == "ewc" and r["knobs"]["ewc_lambda"] == 100.0)
              and not (r["method"] == "atlas" and r["knobs"]["conditioning"] == 0.5 and r["seed"] == 1)]
    for rec in uneven:
        write(tmp_path / "uneven", rec)
    with pytest.raises(Refused) as refused:
        tune([str(tmp_path / "uneven")], "lora:train.steps=600", 2)
    lines = str(refused.value).splitlines()
    assert lines[1].startswith("micro/micro@dev: unequal numbers of candidates; unequal numbers of dev seeds; fewer "
                               "than 2 dev seeds (every tuned method needs the same number of candidates")
    assert lines[2:5] == ["  atlas: 4 candidate(s), 1-2 dev seed(s) per candidate",
                          "  lora: 4 candidate(s), 2 dev seed(s) per candidate",
                          "  ewc: 3 candidate(s), 2 dev seed(s) per candidate"]
    # a method whose only candidate is the reference is not tuned here: its candidate count does not count
    ref_only = [r for r in both if r["method"] != "lora" or r["config"]["train"]["steps"] == 600]
    for rec in ref_only:
        write(tmp_path / "ref_only", rec)
    tuned = tune([str(tmp_path / "ref_only")], "lora:train.steps=600", 2)
    assert list(tuned.choices["method"]).count("lora") == 1
    with pytest.raises(ValueError, match="min dev seeds 0: at least 1"):
        tune([str(tmp_path / "ref_only")], "lora:train.steps=600", 2, min_seeds=0)


def test_the_candidates_table_lists_every_dev_candidate_with_its_seeds_and_what_was_chosen(tmp_path):
    for rec in edge_records():
        write(tmp_path / "runs", rec)
    tuned = tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, out=tmp_path / "point",
                 allow_edge=["ewc", "lwf"], candidates_dir=tmp_path / "audit")
    assert tuned.candidates_path == tmp_path / "audit" / "micro_main_candidates.csv"
    assert not (tmp_path / "point" / "micro_main_candidates.csv").exists()  # the folder named instead
    import pandas as pd

    frame = pd.read_csv(tuned.candidates_path, keep_default_na=False)
    assert list(frame.columns) == ["backbone", "benchmark", "method", "knobs", "seeds", "n_seeds", "pass@1",
                                   "pass@1_sd", "pass@1_per_seed", "kl", "kl_sd", "kl_per_seed", "chosen", "edge"]
    assert list(frame["method"]) == ["base"] + ["atlas"] * 4 + ["lora"] * 4 + ["ewc"] * 4 + ["lwf"] * 4
    assert set(frame["seeds"]) == {"0,1"} and set(frame["n_seeds"]) == {2}
    ewc = frame[frame["method"] == "ewc"].set_index("knobs")
    assert list(ewc.index) == ["ewc_lambda=10.0", "ewc_lambda=100.0", "ewc_lambda=1000.0", "ewc_lambda=10000.0"]
    top = ewc.loc["ewc_lambda=10000.0"]
    assert top["pass@1"] == pytest.approx(0.35) and top["pass@1_per_seed"] == "0.3600; 0.3400"
    assert top["pass@1_sd"] == pytest.approx(0.0141421, abs=1e-6)
    assert top["kl"] == pytest.approx(0.005) and top["kl_per_seed"] == "0.0055; 0.0045"
    assert top["chosen"] == "low" and top["edge"] == "ewc_lambda largest (allowed (--allow-edge); beyond: 100000, 1e+06)"
    assert ewc.loc["ewc_lambda=10.0", "chosen"] == "high: not reached"
    assert ewc.loc["ewc_lambda=10.0", "edge"] == "ewc_lambda smallest (allowed (--allow-edge); beyond: 1, 0.1)"
    assert ewc.loc["ewc_lambda=100.0", "chosen"] == "" and ewc.loc["ewc_lambda=100.0", "edge"] == ""
    lora = frame[frame["method"] == "lora"].set_index("knobs")
    assert lora.loc["train.steps=600", "chosen"] == "reference" and lora.loc["train.steps=600", "edge"] == ""
    assert frame.iloc[0]["chosen"] == "base" and frame.iloc[0]["pass@1_per_seed"] == "0.0000; 0.0000"


def test_report_lists_every_dev_candidate_and_marks_the_points_run_on_test():
    from analysis.analyze import analyze
    from analysis.tables import dev_candidates_table

    chosen_on_test = [r for r in dev_records(split="test") if r["method"] == "base"
                      or (r["method"] == "lora" and r["config"]["train"]["steps"] == 600)
                      or r["knobs"].get("ewc_lambda") == 10.0]
    t = dev_candidates_table(analyze(table(dev_records() + chosen_on_test), reference="lora:train.steps=600"))
    assert t.absent is None
    rows = {(c[0].text, c[1].text): c[5].text for c in t.rows}
    assert len(rows) == len(t.rows) == 1 + 4 * 3  # the base and every grid point of the three methods, once each
    assert {k for k, used in rows.items() if used == "yes"} == {("Base model", "—"), ("LoRA", "train.steps=600"),
                                                               ("EWC", "ewc_lambda=10.0")}
    assert dev_candidates_table(analyze(table(chosen_on_test), reference="lora:train.steps=600")).absent


# ATLAS's design round as a method's candidates (micro_v3_tune): two knobs, one numeric and one categorical
DESIGN = {(1.0, "all"): (0.56, 0.20), (0.5, "all"): (0.57, 0.07), (0.25, "all"): (0.58, 0.12),
          (0.5, "scored"): (0.58, 0.05)}


def design_records(design):
    recs = [r for r in dev_records() if r["method"] in ("base", "lora")]
    recs += [record("atlas", 0, p, {"math": kl, "commonsense": kl},
                    knobs={"rank": 8, "gate_temperature": t, "fit_tokens": fit}, split="dev")
             for (t, fit), (p, kl) in design.items()]
    return two_seeds(recs)


def test_a_design_round_chooses_points_by_every_knob_it_varies_and_only_a_numeric_knob_has_an_edge(tmp_path):
    for rec in design_records(DESIGN):
        write(tmp_path / "runs", rec)
    out = tmp_path / "point"
    _, written, _, _, edges, _, _ = tune([str(tmp_path / "runs")], "lora:train.steps=600", 2, out=out)
    # every point reaches 0.54: the least KL (T 0.5, scored), then the least of the rest (T 0.5, all): both inside
    # the temperature grid [0.25, 0.5, 1]; a categorical knob has no edge
    assert yaml.safe_load((out / "micro_main_atlas_1.yaml").read_text())["method"] == {
        "gate_temperature": 0.5, "fit_tokens": "scored"}
    assert yaml.safe_load((out / "micro_main_atlas_2.yaml").read_text())["method"] == {
        "gate_temperature": 0.5, "fit_tokens": "all"}
    assert not [e for e in edges if e.method == "atlas"]

    sharper = {**DESIGN, (0.25, "all"): (0.58, 0.01)}  # now the sharpest gate retains the most: the grid must go on
    for rec in design_records(sharper):
        write(tmp_path / "sharper", rec)
    with pytest.raises(Refused) as refused:
        tune([str(tmp_path / "sharper")], "lora:train.steps=600", 2)
    assert ("  atlas: high pick gate_temperature=0.25 is the smallest value of its grid [0.25, 0.5, 1]; next "
            "candidates beyond it (geometric): 0.125, 0.0625") in str(refused.value).splitlines()
