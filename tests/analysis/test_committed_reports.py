"""The committed micro reproductions (docs/results/micro, its ablations and re-tune, docs/results/micro_extended):
each report is what `python -m analysis report` makes of its committed records, micro's records are the whole
micro_main preset on the test split with ATLAS at its current defaults, the ablation records give ATLAS and each variant
the same single trained point, the re-tune's records are micro_main's baselines with CorDA's moved point swapped
and ATLAS with its earlier filters at the points micro_main now uses, and the replication's are micro_main's runs
made again with one thread per run and read as the committed table; the dev records of the five methods beyond the
paper choose their committed micro_extended points, and their test records are micro_extended's runs of those points,
read on micro_main's levels."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from analysis.report import check_report
from suite_schema import run_identity
from tests.conftest import REPO

RESULTS = Path("docs/results/micro")
ABLATIONS = RESULTS / "ablations"
RETUNE = RESULTS / "retune"
# method -> (knob, micro_main's point the re-runs of micro_tune dropped, the point they chose instead). ATLAS's moved
# pair ({0.25, 1} -> {1, 0.75}) is micro_main's own since its filters changed (the test below).
RETUNE_SWAPS = {"corda": ("rank", 16, 4)}
# The code each committed record was made with: the baselines and the base at micro_main's commit; ATLAS at its
# current defaults (assigned filters in a 32-direction basis) at the commit of the dev study that chose them, its
# ablation variants at the next commit (documentation and the module holding LATER_KEYS only). Between the baselines'
# commit and these, the baselines and the training loop are unchanged (docs/results/micro/README.md shows a record
# re-made at the later code with identical metrics).
BASELINES_SHA = "cffe785cee681386dbfff1ea3a3bb19b89c51025"
ATLAS_SHA = "f572df23f77f75b6ff9c7242c3a4995e45692844"
VARIANTS_SHA = "ce02e054c1734eca72a544549e41431d284e2845"
REFERENCE = "lora:train.steps=600"  # LoRA at its defaults, the point micro_main's levels are shares of
SCALES = [0.25, 0.5, 0.75, 0.9]  # micro_main's post-hoc scales besides 1


def _records(folder: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(all records, trained runs at scale 1, post-hoc scale records) of a committed folder."""
    records = [json.loads(p.read_text()) for p in sorted((REPO / folder / "records").rglob("record.json"))]
    trained = [r for r in records if r.get("scale", 1) == 1]  # the base's records carry no scale
    return records, trained, [r for r in records if r.get("scale", 1) != 1]


FILTERS = RESULTS / "filters"  # ATLAS's current filters against its earlier ones: a report over two record folders
# The whole protocol again on a clean clone (micro_tune, analysis tune, micro_main with reuse_training_from, two runs
# at a time): micro_main's runs with one intra-op thread each instead of two.
REPLICATION = RESULTS / "replication"
REPLICATION_SHA = "12645ec14cf668b47d607f8278edaf82456df18b"
EXTENDED = RESULTS / "extended"  # the five methods beyond the paper under micro_main's protocol
# The protocol cut to fit 2 hours on 2 cores (micro_tune_1pt, analysis tune --points 1, micro_main_1pt) on a clean
# clone of the commit that added its presets, two one-thread runs at a time.
ONE_POINT = RESULTS / "one_point"
ONE_POINT_SHA = "4e1ee34abcedddee801ec252d09ac7d5403b4a13"
PAPER_METHODS = ("atlas", "lora", "olora", "replay", "ewc", "lwf", "corda", "inflora")
V3_DEV = Path("docs/results/micro_v3/dev_defaults")  # the v3 world's first records: dev only


V3_MAIN = Path("docs/results/micro_v3/main/records")  # micro_v3_main's and micro_v3_ablations' run root


def test_the_v3_test_split_is_read_once_per_committed_test_run():
    """The ledger of the v3 test split holds exactly one read per committed test run, and no other: every trained
    run's record (its scales are the same read) and every ledger line name each other, once."""
    ledger = REPO / V3_MAIN / "test_reads.jsonl"
    assert ledger.is_file()
    reads = Counter(json.loads(line)["run_id"] for line in ledger.read_text().splitlines())
    runs = [json.loads(p.read_text()) for p in sorted((REPO / V3_MAIN).glob("*/record.json"))]
    assert all(r["split"] == "test" and r["benchmark"] == "micro_v3" and r["status"] == "complete" for r in runs)
    assert reads == Counter(r["run_id"] for r in runs)
    assert not [p for p in (REPO / V3_MAIN).rglob("record.json") if p.parent.parent.name != "scales"
                and p.parent.parent != REPO / V3_MAIN]


def test_the_v3_test_runs_at_dev_seeds_train_their_dev_twins_models():
    """micro_v3_main trains seeds 0 and 1 again instead of reusing the dev checkpoints (docs/results/micro_v3/README.md,
    step 3): each such committed test run's config but its split is a committed dev run's, and its training losses are
    that run's, step for step (the same model). The ablations (micro_v3_ablations) have no dev run."""
    runs = [json.loads(p.read_text()) for p in sorted((REPO / V3_MAIN).glob("*/record.json"))]
    twins = [r for r in runs if r["seed"] in (0, 1) and r["method"] != "base" and not r["method"].startswith("atlas_")]
    assert len(twins) == 2 * 9 * 2  # seeds 0 and 1 of nine methods' two points
    for r in twins:
        dev_config = copy.deepcopy(r["config"])
        dev_config["benchmark"]["split"] = "dev"
        dev = json.loads((REPO / V3_TUNE / run_identity.run_id_of(dev_config) / "record.json").read_text())
        assert dev["split"] == "dev" and dev["seed"] == r["seed"], r["run_id"]
        assert len(r["train"]["losses"]) == r["train"]["steps"] and r["train"]["losses"] == dev["train"]["losses"], r["run_id"]


def test_the_v3_world_folder_holds_its_first_dev_records():
    records = [json.loads(p.read_text()) for p in sorted((REPO / V3_DEV / "records").rglob("record.json"))]
    assert len(records) == 5 and {r["benchmark"] for r in records} == {"micro_v3@dev"}
    assert all(r["metrics"]["retained_far"] and r["metrics"]["target"]["per_problem"] for r in records)


V3_TUNE = Path("docs/results/micro_v3/tune/records")  # micro_v3_tune's dev records, every round
# The commits micro_v3_tune's rounds ran at: the grid (round 0), then each extension round's point files
V3_ROUND_SHAS = ("56fd3cb50e2c3cda1d9e1924108722fb349e65b6", "7e99abe2aed58fa0f5d6c5fa1a160503c61c2d35",
                 "c5ade840feb8b9b0b092c6cf0b4528b27d5e8d15")
V3_METHODS = ("atlas", "lora", "olora", "replay", "ewc", "lwf", "corda", "inflora", "lwf_retained")


def _v3_rounds_records(rounds: int, into: Path) -> None:
    """Copy into `into` the dev records of micro_v3_tune's first `rounds` rounds (the grid: the base and 9 methods x 5
    candidates x seeds 0, 1; each extension round 9 x 2 x 2), after checking that each is complete, on dev, clean at
    its round's commit and made with 2 threads."""
    paths = sorted((REPO / V3_TUNE).glob("*/record.json"))
    kept = [p for p in paths if json.loads(p.read_text())["provenance"]["git_sha"] in V3_ROUND_SHAS[:rounds]]
    assert len(kept) == 92 + 36 * (rounds - 1)
    for p in kept:
        r = json.loads(p.read_text())
        assert r["status"] == "complete" and r["split"] == "dev" and r["benchmark"] == "micro_v3@dev", p
        assert not r["provenance"]["git_dirty"] and r["cost"]["threads"] == 2, p
        (into / p.parent.name).mkdir(parents=True)
        (into / p.parent.name / "record.json").write_bytes(p.read_bytes())
    per_method = 10 + 4 * (rounds - 1)
    assert Counter(json.loads(p.read_text())["method"] for p in kept) == {"base": 2, **{m: per_method for m in V3_METHODS}}


@pytest.mark.parametrize("rounds,refused", [
    (1, ["atlas", "olora", "replay", "ewc", "lwf", "lwf_retained"]),
    (2, ["lwf_retained"]),
])
def test_the_v3_tuning_rounds_dev_records_name_the_committed_next_round(tmp_path, rounds, refused):
    """`analysis tune` over micro_v3_tune's first `rounds` rounds refuses the picks at a grid's edge and writes exactly
    the committed point files of the next round (2 new candidates per method), and no point file of the evaluation
    preset."""
    from analysis.tune import Refused, tune

    _v3_rounds_records(rounds, tmp_path / "records")
    prefix = f"micro_v3_tune_ext{rounds}"
    with pytest.raises(Refused) as refused_by:
        tune([str(tmp_path / "records")], REFERENCE, 2, out=tmp_path / "point", prefix="micro_v3_main",
             extension_prefix=prefix)
    edges = str(refused_by.value).split("\nthe extension round")[0].splitlines()[2:]
    assert [line.split(":")[0].strip() for line in edges] == refused
    written = sorted(p.name for p in (tmp_path / "point").iterdir())
    committed = sorted((REPO / "conf/point").glob(f"{prefix}_*.yaml"))
    assert written == [p.name for p in committed] and len(written) == 18
    for p in committed:
        assert (tmp_path / "point" / p.name).read_text() == p.read_text(), p.name


def test_the_v3_dev_records_of_all_rounds_choose_the_committed_points(tmp_path):
    """After round 2 no pick sits at a grid's edge: `analysis tune` over all 164 dev records, at its defaults (2 dev
    seeds, no method let through), writes exactly the committed conf/point/micro_v3_main_* (2 points per method, LoRA's
    high the 600-step reference) and its candidates table, byte for byte."""
    from analysis.tune import tune

    _v3_rounds_records(3, tmp_path / "records")
    tuned = tune([str(tmp_path / "records")], REFERENCE, 2, out=tmp_path / "point", prefix="micro_v3_main")
    assert not [e for e in tuned.edges if e.refused]
    committed = sorted((REPO / "conf/point").glob("micro_v3_main_*"))
    assert sorted(p.name for p in (tmp_path / "point").iterdir()) == [p.name for p in committed]
    assert len(committed) == 19  # 9 methods x 2 points + micro_v3_main_candidates.csv
    for p in committed:
        assert (tmp_path / "point" / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.mark.slow
@pytest.mark.parametrize("records,report,reference,variants", [
    ([RESULTS / "records"], RESULTS / "report", REFERENCE, ()),
    ([ABLATIONS / "records"], ABLATIONS / "report", REFERENCE, ()),
    ([RETUNE / "records"], RETUNE / "report", REFERENCE, ()),
    ([RESULTS / "records", RETUNE / "records"], FILTERS / "report", REFERENCE, ("filter_members", "filter_basis")),
    ([Path("docs/results/micro_extended/records")], Path("docs/results/micro_extended/report"), "lora", ()),
    ([REPLICATION / "records"], REPLICATION / "report", REFERENCE, ()),
    ([RESULTS / "records", EXTENDED / "records"], EXTENDED / "report", REFERENCE, ()),
    ([ONE_POINT / "records"], ONE_POINT / "report", REFERENCE, ()),
    ([V3_DEV / "records"], V3_DEV / "report", REFERENCE, ()),
    ([V3_MAIN], V3_MAIN.parents[1] / "report", REFERENCE, ()),
])
def test_committed_micro_report_matches_a_rerun_over_its_records(monkeypatch, records, report, reference, variants):
    monkeypatch.chdir(REPO)  # the report names its records by these relative paths
    assert (report / "index.md").is_file() and all(folder.is_dir() for folder in records)
    diffs = check_report([str(folder) for folder in records], report, reference=reference, variants=variants)
    # Figures are byte-identical only for the same matplotlib and font versions; tables, data and the
    # index must match exactly, and every figure must be there.
    assert [d for d in diffs if not d.startswith("differs: figures/")] == []
    figures = sorted((report / "figures").iterdir())
    assert any(p.name.startswith("pareto_micro") and p.stem.endswith("_mean") for p in figures)


def _commit(method: str, atlas_sha: str) -> str:
    if method == "atlas":
        return atlas_sha
    return VARIANTS_SHA if method.startswith("atlas_") else BASELINES_SHA


def _check_provenance(records: list[dict], atlas_sha: str = ATLAS_SHA) -> None:
    # One committed code version per method, named above, not edited while the sweep ran, all on the test split.
    for r in records:
        expected = _commit(r["method"], atlas_sha)
        assert r["provenance"]["git_sha"] == expected, (r["run_id"], r["method"], r["provenance"]["git_sha"])
    assert not any(r["provenance"]["git_dirty"] for r in records)
    assert {r["split"] for r in records} == {"test"} and {r["backbone"] for r in records} == {"micro"}
    assert all(r["status"] == "complete" for r in records)


def test_committed_records_are_the_whole_micro_main_preset():
    records, trained, scaled = _records(RESULTS)
    assert len(trained) == 51
    per_method = Counter(r["method"] for r in trained)
    # Equal budget: 2 trained points x 3 seeds for every method (micro_main's tuned points), the base 3 seeds.
    assert per_method == {"base": 3, **{m: 6 for m in ("atlas", "lora", "olora", "replay", "ewc", "lwf", "corda",
                                                           "inflora")}}
    assert Counter(r["seed"] for r in trained) == {0: 17, 1: 17, 2: 17}
    # Dense fronts: every trained run also at each post-hoc scale, one record each.
    per_run = Counter(r["run_id"].split("@")[0] for r in scaled)
    assert sorted(per_run) == sorted(r["run_id"] for r in trained if r["method"] != "base")
    assert set(per_run.values()) == {len(SCALES)}
    assert sorted({r["scale"] for r in scaled}) == SCALES
    _check_provenance(records)


def test_committed_ablation_records_give_every_variant_atlas_s_point():
    records, trained, scaled = _records(ABLATIONS)
    _check_provenance(records)
    atlas_family = {"atlas", "atlas_global", "atlas_nofilter", "atlas_nogate", "atlas_random", "atlas_target"}
    assert Counter(r["method"] for r in trained) == {"base": 3, "lora": 3, **{m: 3 for m in atlas_family}}
    atlas_like = [r for r in trained if r["method"] in atlas_family]
    # The same trained point for all: 600 steps, conditioning 1, seeds 0-2, and the same scales.
    assert {r["config"]["train"]["steps"] for r in atlas_like} == {600}
    assert {float(r["knobs"]["conditioning"]) for r in atlas_like} == {1.0}
    assert Counter(r["seed"] for r in atlas_like) == {0: 6, 1: 6, 2: 6}
    assert sorted({r["scale"] for r in scaled}) == SCALES
    # The reference is micro_main's LoRA at its defaults: its records are the main folder's, byte for byte.
    main = {p.parent.name: p.read_bytes() for p in (REPO / RESULTS / "records").glob("*/record.json")}
    for p in (REPO / ABLATIONS / "records").glob("*/record.json"):
        if json.loads(p.read_text())["method"] in {"base", "lora", "atlas"}:
            assert main.get(p.parent.name) == p.read_bytes(), p


def test_committed_main_atlas_records_are_atlas_at_its_current_defaults():
    # The main table's ATLAS is the method a user gets from `python run.py`: its filter options as in its config.
    defaults = yaml.safe_load((REPO / "conf/method/atlas.yaml").read_text())
    _, trained, _ = _records(RESULTS)
    atlas = [r for r in trained if r["method"] == "atlas"]
    assert len(atlas) == 6
    for key in ("filter_members", "filter_basis", "num_centers", "filter_rank", "filter_energy", "gate_signal"):
        assert {str(r["config"]["method"][key]) for r in atlas} == {str(defaults[key])}, key


def test_committed_retune_records_are_micro_main_s_with_only_the_moved_points_swapped():
    # The re-tune was made at micro_main's first commit, ATLAS with its earlier filters (k-means members, each in the
    # full input space: the keys did not exist yet) at the re-runs' points, which are those micro_main uses now.
    records, trained, scaled = _records(RETUNE)
    _check_provenance(records, atlas_sha=BASELINES_SHA)
    main_records, _, _ = _records(RESULTS)
    # The same budget as micro_main: 2 trained points x 3 seeds per method, each at every post-hoc scale.
    assert Counter(r["method"] for r in trained) == Counter(
        r["method"] for r in main_records if r.get("scale", 1) == 1)
    assert Counter(r.get("scale", 1) for r in records) == Counter(r.get("scale", 1) for r in main_records)
    retune_atlas = [r for r in trained if r["method"] == "atlas"]
    assert not any("filter_members" in r["config"]["method"] for r in retune_atlas)
    main_atlas = [r for r in main_records if r["method"] == "atlas" and r.get("scale", 1) == 1]
    assert sorted(float(r["knobs"]["conditioning"]) for r in retune_atlas) == sorted(
        float(r["knobs"]["conditioning"]) for r in main_atlas) == [0.75] * 3 + [1.0] * 3

    def point(r):
        knob = RETUNE_SWAPS.get(r["method"], (None,))[0]
        return r["method"], float(r["knobs"][knob]) if knob else None

    def baselines(folder: Path) -> dict:
        out = {}
        for path in (REPO / folder / "records").rglob("record.json"):
            if not json.loads(path.read_bytes())["method"].startswith("atlas"):
                out[path.relative_to(REPO / folder / "records")] = path.read_bytes()
        return out

    main, retune = baselines(RESULTS), baselines(RETUNE)
    kept = [path for path in retune if path in main]
    assert all(retune[path] == main[path] for path in kept)  # byte for byte
    dropped = Counter(point(json.loads(main[p])) for p in main if p not in retune)
    added = Counter(point(json.loads(retune[p])) for p in retune if p not in main)
    per_point = 3 * (1 + len(SCALES))  # 3 seeds, the trained run and its scales
    assert dropped == {(m, float(old)): per_point for m, (_, old, _) in RETUNE_SWAPS.items()}
    assert added == {(m, float(new)): per_point for m, (_, _, new) in RETUNE_SWAPS.items()}


def test_replication_records_are_micro_main_again_with_one_thread_per_run():
    records, trained, _ = _records(REPLICATION)

    def paths(folder: Path) -> list[Path]:
        root = REPO / folder / "records"
        return sorted(p.relative_to(root) for p in root.rglob("record.json"))

    assert paths(REPLICATION) == paths(RESULTS)  # the same run ids (configs) and scales
    for r in records:
        assert r["provenance"]["git_sha"] == REPLICATION_SHA and not r["provenance"]["git_dirty"], r["run_id"]
        assert r["split"] == "test" and r["status"] == "complete" and r["cost"]["threads"] == 1, r["run_id"]
    # Each seed-0 training is the dev run micro_tune made of the same config (one thread); seeds 1 and 2 trained anew.
    reused = {r["run_id"]: r["train"]["reused_from"] for r in trained if (r.get("train") or {}).get("reused_from")}
    assert sorted(reused) == sorted(r["run_id"] for r in trained if r["seed"] == 0 and r["method"] != "base")
    assert {(d["split"], d["threads"], d["git_sha"], d["git_dirty"]) for d in reused.values()} == {
        ("dev", 1, REPLICATION_SHA, False)}
    # Evaluation alone does not depend on the thread count: the base runs' metrics are the committed ones.
    committed = {r["run_id"]: r for r in _records(RESULTS)[1]}
    bases = [r for r in trained if r["method"] == "base"]
    assert len(bases) == 3 and all(r["metrics"] == committed[r["run_id"]]["metrics"] for r in bases)
    # Training amplifies the rounding (the README's figures): pass@1 the same in 16 of 48 trained runs, apart by at
    # most 11 of the 132 problems; retained KL at most 10.7% apart.
    pairs = [(r["metrics"], committed[r["run_id"]]["metrics"]) for r in trained if r["method"] != "base"]
    problems = [round(abs(a["target"]["pass@1"] - b["target"]["pass@1"]) * a["target"]["n_problems"])
                for a, b in pairs]
    assert len(pairs) == 48 and problems.count(0) == 16 and max(problems) == 11
    kl_apart = sorted(abs(a["retained_kl_mean"] / b["retained_kl_mean"] - 1) for a, b in pairs)
    assert sorted(problems)[23:25] == [1, 1] and round((kl_apart[23] + kl_apart[24]) / 2, 3) == 0.009  # medians
    assert round(kl_apart[-1], 3) == 0.107
    # InfLoRA's runs and LoRA's 150-step runs: the same pass@1, retained KL within 0.1%.
    steady = [(r["metrics"], committed[r["run_id"]]["metrics"]) for r in trained
              if r["method"] == "inflora" or (r["method"] == "lora" and r["config"]["train"]["steps"] == 150)]
    assert len(steady) == 9
    assert all(a["target"]["pass@1"] == b["target"]["pass@1"] for a, b in steady)
    assert all(abs(a["retained_kl_mean"] / b["retained_kl_mean"] - 1) < 1e-3 for a, b in steady)


def test_replication_reads_as_the_committed_main_table():
    # What docs/results/micro/README.md says of it: at every level each mean of the replication lies inside the
    # committed 95% interval, and the methods come in the same order.
    import pandas as pd

    committed, again = (pd.read_csv(REPO / folder / "report/data/matched_summary.csv").set_index(["level", "method"])
                        for folder in (RESULTS, REPLICATION))
    assert sorted(committed.index) == sorted(again.index)
    with_interval = committed[committed["n_reached"] >= 2].index
    assert len(with_interval) == 22
    for key in with_interval:
        assert committed.loc[key, "lo"] <= again.loc[key, "mean"] <= committed.loc[key, "hi"], key
    def order(table, level):  # methods by mean matched KL, those reaching the level on no seed left out
        return list(table.loc[level].dropna(subset=["mean"]).sort_values("mean").index)

    for level in committed.index.get_level_values("level").unique():
        assert order(again, level) == order(committed, level), level


# The five methods beyond the paper under micro_main's protocol: micro_tune_extended on dev on a clean clone of the
# commit that added the presets, two one-thread runs at a time (its records in dev_records), then `analysis tune`.
EXTENDED_DEV_SHA = "53c5f98"
FIVE = ("milora", "pissa", "dora", "loranull", "fullft")


def _dev_records_choosing(folder: Path, sha: str, n_points: int, prefix: str, tmp_path: Path,
                          allow_edge: tuple[str, ...]) -> tuple[list[dict], int]:
    """(dev records, number of committed point files) of a committed `dev_records` folder, after checking that every
    record is complete, on dev, one-thread and clean at `sha`, and that `analysis tune` over them writes
    conf/point/<prefix>_* exactly as committed.

    These records document the earlier protocol: one dev seed per candidate, and picks at the edge of their grid
    that `analysis tune` now refuses (issue 59). The replay passes the relaxing flags explicitly (`--min-dev-seeds 1`,
    `--allow-edge` naming exactly the methods refused at an edge), and the committed files, written before the
    refusal existed, lack the comment a let-through pick now gets: it is compared with that line removed."""
    from analysis.collect import collect
    from analysis.tune import Refused, earlier_definitions, tune

    dev = [json.loads(p.read_text()) for p in sorted((REPO / folder / "dev_records").rglob("record.json"))]
    for r in dev:
        assert r["provenance"]["git_sha"].startswith(sha) and not r["provenance"]["git_dirty"], r["run_id"]
        assert r["split"] == "dev" and r["status"] == "complete" and r["cost"]["threads"] == 1, r["run_id"]
    with pytest.raises(Refused, match="fewer than 2 dev seeds"):  # today's default refuses them
        tune([str(REPO / folder / "dev_records")], REFERENCE, n_points)
    tuned = tune([str(REPO / folder / "dev_records")], REFERENCE, n_points, out=tmp_path / "point", prefix=prefix,
                 allow_edge=allow_edge, min_seeds=1)
    assert sorted({e.method for e in tuned.edges if e.refused}) == sorted(allow_edge)  # no more let through
    written = tuned.written
    edge_note = "# At the edge of its grid, let through by `--allow-edge "
    for p in written:
        text = p.read_text()
        p.write_text("".join(line for line in text.splitlines(keepends=True) if not line.startswith(edge_note)))
    committed = sorted((REPO / "conf/point").glob(f"{prefix}_*.yaml"))
    # A method whose definition changed after its dev records were made gets no point from them; its committed points
    # say so (stale) or name the method whose definition those records had (lwf_retained: the earlier lwf).
    earlier = {m.partition("[")[0] for m in earlier_definitions(collect([REPO / folder / "dev_records"]).table)}
    kept = [p for p in committed if not _from_an_earlier_definition(p.read_text())]
    assert {_method_of(p.read_text()) for p in committed if p not in kept} - {"lwf_retained"} == earlier
    assert all(_method_of(p.read_text()) != "lwf_retained" or "lwf" in earlier for p in committed)
    assert sorted(p.name for p in written) == [p.name for p in kept]
    for p in kept:
        assert (tmp_path / "point" / p.name).read_text() == p.read_text(), p.name
    return dev, len(committed)


def _method_of(point: str) -> str:
    return point.split("override /method: ", 1)[1].split()[0]


def _from_an_earlier_definition(point: str) -> bool:
    return "# Stale: chosen under" in point or "under its 2026-11 definition" in point


def _assert_seed_0_trainings_are_the_dev_runs(trained: list[dict], folder: Path, sha: str) -> None:
    """Each trained seed-0 run evaluated the dev run that chose its point (committed in `dev_records`), made
    with one thread and clean at `sha`, instead of training again."""
    dev = {json.loads(p.read_text())["run_id"] for p in (REPO / folder / "dev_records").rglob("record.json")}
    reused = {r["run_id"]: r["train"]["reused_from"] for r in trained if (r.get("train") or {}).get("reused_from")}
    assert sorted(reused) == sorted(r["run_id"] for r in trained if r["seed"] == 0 and r["method"] != "base")
    for run_id, donor in reused.items():
        assert donor["run_id"] in dev and donor["split"] == "dev" and donor["threads"] == 1, run_id
        assert donor["git_sha"].startswith(sha) and not donor["git_dirty"], run_id


def test_extended_dev_records_choose_the_committed_points(tmp_path):
    # PiSSA's and DoRA's low picks are their grid's 150 steps, full FT's best pass@1 (it misses the high level) its
    # grid's largest lr, 3e-4 (MiLoRA's and DoRA's high picks, 600 steps, are the budget: nothing beyond)
    dev, committed = _dev_records_choosing(EXTENDED, EXTENDED_DEV_SHA, 2, "micro_extended", tmp_path,
                                           allow_edge=("pissa", "dora", "fullft"))
    assert Counter(r["method"] for r in dev) == {"base": 1, "lora": 1, **{m: 4 for m in FIVE}}
    assert committed == 11


EXTENDED_TEST_SHA = "4b152df"  # the commit micro_extended ran at on the test split (a clean clone)


def test_extended_records_are_micro_extended_s_five_at_the_committed_points():
    records, trained, scaled = _records(EXTENDED)
    # Equal budget: the chosen 2 points x 3 seeds per method, each also at micro_main's post-hoc scales. The base and
    # the reference are micro_main's own records (the same run ids), which the sweep skipped: they are not repeated.
    assert Counter(r["method"] for r in trained) == {m: 6 for m in FIVE}
    assert Counter(r["seed"] for r in trained) == {0: 10, 1: 10, 2: 10}
    per_run = Counter(r["run_id"].split("@")[0] for r in scaled)
    assert sorted(per_run) == sorted(r["run_id"] for r in trained) and set(per_run.values()) == {len(SCALES)}
    assert sorted({r["scale"] for r in scaled}) == SCALES
    for r in records:
        prov = r["provenance"]
        assert prov["git_sha"].startswith(EXTENDED_TEST_SHA) and not prov["git_dirty"], r["run_id"]
        assert r["split"] == "test" and r["status"] == "complete" and r["backbone"] == "micro", r["run_id"]
    assert {r["cost"]["threads"] for r in trained} == {1}
    # Each method's trained runs are its two committed points (conf/point/micro_extended_<method>_<i>.yaml), 3 seeds
    # each.
    chosen = Counter()
    for p in (REPO / "conf/point").glob("micro_extended_*.yaml"):
        cfg = yaml.safe_load(p.read_text())
        method = cfg["defaults"][0]["override /method"]
        if method in FIVE:
            runs = [r for r in trained if r["method"] == method
                    and all(r["config"]["train"][k] == v for k, v in cfg["train"].items())]
            assert sorted(r["seed"] for r in runs) == [0, 1, 2], p.name
            chosen.update(r["run_id"] for r in runs)
    assert sorted(chosen) == sorted(r["run_id"] for r in trained) and set(chosen.values()) == {1}
    _assert_seed_0_trainings_are_the_dev_runs(trained, EXTENDED, EXTENDED_DEV_SHA)


def test_extended_report_leaves_micro_main_s_levels_and_numbers_where_they_were():
    # Levels are shares of the reference LoRA's gain, so adding five methods moves no level and no main method's number.
    import pandas as pd

    main, extended = (REPO / folder / "report/data" for folder in (RESULTS, EXTENDED))
    assert (extended / "thresholds.csv").read_bytes() == (main / "thresholds.csv").read_bytes()
    before = pd.read_csv(main / "matched_summary.csv")
    after = pd.read_csv(extended / "matched_summary.csv")
    # The five, LoRA-Null under the definition its records ran (loranull[definition=2026-11]).
    assert set(before["method"]) <= set(after["method"])
    assert {m.partition("[")[0] for m in set(after["method"]) - set(before["method"])} == set(FIVE)
    kept = after[after["method"].isin(set(before["method"]))].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, before)


def test_one_point_dev_records_choose_the_committed_points(tmp_path):
    # Two candidates per method: every pick is at an edge; replay's rho 0.5 and O-LoRA's lambda1 0.05 (its best
    # pass@1, missing the high level) are refused (ATLAS's conditioning 1 is the knob's bound, LoRA's is the reference)
    dev, committed = _dev_records_choosing(ONE_POINT, ONE_POINT_SHA, 1, "micro_1pt", tmp_path,
                                           allow_edge=("replay", "olora"))
    assert Counter(r["method"] for r in dev) == {"base": 1, **{m: 2 for m in PAPER_METHODS}}
    assert committed == 9  # and lwf_retained, the earlier lwf


def test_one_point_records_are_micro_main_1pt_at_the_committed_points():
    records, trained, scaled = _records(ONE_POINT)
    # One trained point per method at seeds 0, 1, 2 and the base, each trained run also at micro_main's scales.
    assert Counter(r["method"] for r in trained) == {"base": 3, **{m: 3 for m in PAPER_METHODS}}
    per_run = Counter(r["run_id"].split("@")[0] for r in scaled)
    assert sorted(per_run) == sorted(r["run_id"] for r in trained if r["method"] != "base")
    assert set(per_run.values()) == {len(SCALES)} and sorted({r["scale"] for r in scaled}) == SCALES
    for r in records:
        assert r["provenance"]["git_sha"] == ONE_POINT_SHA and not r["provenance"]["git_dirty"], r["run_id"]
        assert r["split"] == "test" and r["status"] == "complete" and r["backbone"] == "micro", r["run_id"]
    assert {r["cost"]["threads"] for r in trained} == {1}
    # The cut keeps micro_main's runs: every record is one of micro_main's (same run id and scale); which of its
    # points they are, tests/experiments/test_presets.py checks on the presets.
    main = {p.relative_to(REPO / RESULTS / "records") for p in (REPO / RESULTS / "records").rglob("record.json")}
    mine = {p.relative_to(REPO / ONE_POINT / "records") for p in (REPO / ONE_POINT / "records").rglob("record.json")}
    assert mine <= main and len(mine) == 3 + 24 * (1 + len(SCALES))
    _assert_seed_0_trainings_are_the_dev_runs(trained, ONE_POINT, ONE_POINT_SHA)
