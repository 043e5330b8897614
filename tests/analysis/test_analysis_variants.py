"""Option studies (`analysis.variants`, `analysis report --variants`): a method's records away from its default
setting of a knob form a method of their own, with their own per-seed fronts and paired difference to the method."""

import math

import pandas as pd
import pytest
from analysis_synth import KNOBS, record, write

from analysis import methods as M
from analysis.analyze import analyze
from analysis.cli import main
from analysis.collect import collect
from analysis.variants import method_defaults, split_variants, variant_name

ASSIGNED = {**KNOBS["atlas"], "filter_members": "assigned"}
BASIS = {**KNOBS["atlas"], "filter_members": "assigned", "filter_basis": 32}
AT_DEFAULT = {**KNOBS["atlas"], "filter_members": "kmeans", "filter_basis": None}


@pytest.fixture(autouse=True)
def _kmeans_filters_in_the_full_space_are_the_default(monkeypatch):
    """The records below study the filter options against k-means filters in the full space as the default,
    whatever ATLAS's config sets today."""
    import analysis.variants as V

    real = V.method_defaults
    pinned = {**real("atlas"), "filter_members": "kmeans", "filter_basis": None}
    monkeypatch.setattr(V, "method_defaults", lambda m: pinned if m == "atlas" else real(m))


def _records() -> list[dict]:
    """ATLAS at its defaults (records without the option knobs, as made before they existed, and one seed with them
    written out at their default values), an assigned-filters variant that misses the level on seed 2, and LoRA."""
    recs = []
    for seed, (p1, kl) in enumerate([(0.30, 0.020), (0.31, 0.022), (0.29, 0.021)]):
        knobs = AT_DEFAULT if seed == 2 else None
        recs.append(record("atlas", seed, p1, {"math": kl, "commonsense": kl}, knobs=knobs))
    for seed, (p1, kl) in enumerate([(0.30, 0.010), (0.32, 0.012), (0.25, 0.008)]):
        recs.append(record("atlas", seed, p1, {"math": kl, "commonsense": kl}, knobs=ASSIGNED))
    recs.append(record("atlas", 0, 0.33, {"math": 0.015, "commonsense": 0.015}, knobs=BASIS))
    recs += [record("lora", s, 0.35, {"math": 0.1, "commonsense": 0.1}) for s in range(3)]
    return recs


def _table(tmp_path) -> pd.DataFrame:
    for rec in _records():
        write(tmp_path / "runs", rec)
    return collect([str(tmp_path / "runs")]).table


def test_defaults_come_from_the_method_config():
    d = method_defaults("atlas")
    assert d["filter_members"] == "assigned" and d["filter_basis"] == 32 and d["conditioning"] == 1.0
    assert "display" not in d and "_target_" not in d and "name" not in d
    assert method_defaults("no_such_method") == {}


def test_variant_names_only_the_knobs_away_from_the_default():
    keys = ["filter_members", "filter_basis"]
    row = pd.Series({"knob/filter_members": "assigned", "knob/filter_basis": 32.0})  # a NaN column makes ints floats
    assert variant_name("atlas", row, keys) == "atlas[filter_members=assigned,filter_basis=32]"
    assert variant_name("atlas", row, keys[::-1]) == "atlas[filter_basis=32,filter_members=assigned]"
    assert variant_name("atlas", pd.Series({"knob/filter_members": "kmeans", "knob/filter_basis": math.nan}), keys) == "atlas"
    assert variant_name("atlas", pd.Series({}), keys) == "atlas"  # a record from before the knobs existed
    assert variant_name("lora", pd.Series({"knob/filter_members": "assigned"}), keys) == "lora"  # not its knob
    assert variant_name("atlas", pd.Series({"knob/use_gate": False}), ["use_gate"]) == "atlas[use_gate=false]"


def test_a_record_from_before_a_later_key_keeps_its_behaviour_when_the_default_changes(monkeypatch):
    """A record without `filter_members` / `filter_basis` was made with k-means filters in the full space
    (`schema.LATER_KEYS`): if the defaults became assigned filters in a 32-direction basis, it is a variant, and a
    record at the new defaults is the method."""
    import analysis.variants as V

    flipped = {**V.method_defaults("atlas"), "filter_members": "assigned", "filter_basis": 32}
    monkeypatch.setattr(V, "method_defaults", lambda m: flipped if m == "atlas" else method_defaults(m))
    keys = ["filter_members", "filter_basis"]
    assert V.variant_name("atlas", pd.Series({}), keys) == "atlas[filter_members=kmeans,filter_basis=null]"
    at_new_defaults = pd.Series({"knob/filter_members": "assigned", "knob/filter_basis": 32.0})
    assert V.variant_name("atlas", at_new_defaults, keys) == "atlas"
    assert V.variant_name("atlas", pd.Series({"knob/filter_members": "assigned", "knob/filter_basis": math.nan}),
                          keys) == "atlas[filter_basis=null]"


def test_a_null_knob_away_from_a_set_default_is_named_null():
    assert method_defaults("atlas")["atlas_seed"] is None and method_defaults("atlas")["rank"] == 8
    assert variant_name("atlas", pd.Series({"knob/rank": math.nan}), ["rank"]) == "atlas[rank=null]"
    assert variant_name("atlas", pd.Series({"knob/atlas_seed": math.nan}), ["atlas_seed"]) == "atlas"


def test_split_variants_renames_records_and_nothing_else(tmp_path):
    table = _table(tmp_path)
    split = split_variants(table, ["filter_members", "filter_basis"])
    assert split["method"].value_counts().to_dict() == {
        "atlas": 3, "atlas[filter_members=assigned]": 3, "atlas[filter_members=assigned,filter_basis=32]": 1, "lora": 3}
    assert (table["method"] == "atlas").sum() == 7  # the input is not modified
    assert split.drop(columns="method").equals(table.drop(columns="method"))
    assert split_variants(table, []) is table
    assert all(M.is_atlas_family(m) for m in split["method"] if m.startswith("atlas"))
    assert M.ablation_methods(split["method"])[0] == "atlas"  # ATLAS first, its variants after it


def test_unknown_knob_is_an_error_naming_the_knobs(tmp_path):
    with pytest.raises(ValueError, match=r"--variants filter_member: not a knob of any method among the records "
                                         r"\(atlas, lora\); their knobs: .*filter_members"):
        split_variants(_table(tmp_path), ["filter_member"])


def test_each_variant_gets_its_own_fronts_and_paired_difference(tmp_path):
    table = _table(tmp_path)
    a = analyze(split_variants(table, ["filter_members", "filter_basis"]), ["0.28"], interpolate=False)
    ms = a.matched_seed.set_index(["method", "seed"])
    assert [ms.at[("atlas", s), "kl"] for s in range(3)] == pytest.approx([0.020, 0.022, 0.021])
    v = "atlas[filter_members=assigned]"
    assert [bool(ms.at[(v, s), "reached"]) for s in range(3)] == [True, True, False]
    assert [ms.at[(v, s), "kl"] for s in range(2)] == pytest.approx([0.010, 0.012])
    summary = a.matched.set_index("method")
    assert (int(summary.at[v, "n_reached"]), int(summary.at[v, "n_seeds"])) == (2, 3)
    pair = a.paired.set_index("method").loc[v]
    assert int(pair["n_pairs"]) == 2 and int(pair["only_reference"]) == 1
    assert pair["mean_diff"] == pytest.approx(0.010)  # KL(ATLAS) - KL(variant) on seeds 0 and 1
    # Without --variants the option's records join ATLAS's front: seed by seed the least KL reaching the level.
    pooled = analyze(table, ["0.28"], interpolate=False).matched_seed.set_index(["method", "seed"])
    assert [pooled.at[("atlas", s), "kl"] for s in range(3)] == pytest.approx([0.010, 0.012, 0.021])


@pytest.mark.slow
def test_cli_report_with_variants_writes_rows_and_its_command(tmp_path, capsys, monkeypatch):
    _table(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["report", "runs", "--out", "rep", "--levels", "0.28", "--variants", "filter_members", "filter_basis",
            "--no-progress"]
    assert main(args) == 0
    index = (tmp_path / "rep" / "index.md").read_text()
    assert "python -m analysis report runs --out rep --levels 0.28 --variants filter_members filter_basis\n" in index
    ablations = (tmp_path / "rep" / "tables" / "ablations.md").read_text()
    assert "atlas[filter_members=assigned]" in ablations and "(2/3 seeds)" in ablations
    assert main(args + ["--check"]) == 0
    assert main(["report", "runs", "--out", "rep", "--levels", "0.28", "--check", "--no-progress"]) == 1  # pooled
    capsys.readouterr()
    assert main(["report", "runs", "--out", "rep3", "--levels", "0.28", "--variants", "filter_member"]) == 2
    assert "not a knob of any method" in capsys.readouterr().err
