"""`python -m analysis report` refuses to compare what is not comparable, in one line, exit 2, writing nothing: runs of
one group with other evaluation sizes, split or benchmark version; no records; no complete record; gain levels without
base or reference runs. `--split-incomparable` splits such runs into groups of their own. The reference pass@1 shown
is the reference's; bold marks only a best of at least two values."""

import copy
import json

import pandas as pd
import pytest
from analysis_synth import record, scenario, write

from analysis.cli import main
from analysis.render import Cell, Table

REFERENCE = "lora:train.steps=300"  # scenario(): LoRA at steps 100, 300 and 900


def _micro() -> list[dict]:
    return [r for r in scenario() if r["backbone"] == "micro"]


def _resized(rec: dict, problems: int, items: int, pass_shift: float = 0.0) -> dict:
    """A copy of `rec` evaluated on other sizes (a distinct run id)."""
    out = copy.deepcopy(rec)
    out["run_id"] = rec["run_id"][::-1]
    out["metrics"]["target"]["n_problems"] = problems
    out["metrics"]["target"]["pass@1"] += pass_shift
    for entry in out["metrics"]["retained"].values():
        entry["n"] = items
    return out


def _report(args, capsys) -> tuple[int, str, str]:
    rc = main(["report", *args, "--no-progress"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def mixed_sizes(tmp_path):
    root = tmp_path / "runs"
    for rec in _micro():
        write(root / "full", rec)
        write(root / "small", _resized(rec, 30, 20, 0.01))
    return root


def test_mixed_evaluation_sizes_are_refused_in_one_line_and_nothing_is_written(mixed_sizes, tmp_path, capsys):
    out = tmp_path / "rep"
    rc, stdout, err = _report([str(mixed_sizes), "--out", str(out), "--reference", REFERENCE], capsys)
    line = _one_error_line(err)
    assert rc == 2 and not out.exists()
    n = len(_micro())
    assert line.startswith("error: runs on micro differ in evaluation sizes: 100 code problems / 40 commonsense items "
                           f"/ 40 math items ({n} runs, e.g. {mixed_sizes / 'full'}/")
    assert f" vs 30 / 20 / 20 ({n} runs, e.g. {mixed_sizes / 'small'}/" in line
    assert line.endswith("; report them separately or pass --split-incomparable")


def test_split_incomparable_makes_each_size_a_group_of_its_own(mixed_sizes, tmp_path, capsys):
    out = tmp_path / "rep"
    rc, stdout, err = _report([str(mixed_sizes), "--out", str(out), "--reference", REFERENCE,
                               "--split-incomparable"], capsys)
    assert rc == 0, err
    index = (out / "index.md").read_text()
    assert "--split-incomparable" in index.splitlines()[5]  # the command that regenerates it
    full = "micro [100 code problems / 40 commonsense items / 40 math items]"
    small = "micro [30 code problems / 20 commonsense items / 20 math items]"
    thresholds = pd.read_csv(out / "data" / "thresholds.csv")
    assert sorted(thresholds["backbone"].unique()) == [full, small]
    # Each group's levels come from its own base and reference: the small runs' pass@1 is 0.01 higher.
    lo = thresholds.groupby("backbone")["gain_lo"].first()
    assert lo[full] == pytest.approx(0.10) and lo[small] == pytest.approx(0.11)
    main_md = (out / "tables" / "main.md").read_text()
    assert f"| {full} (micro) | ATLAS |" in main_md and f"| {small} (micro) | ATLAS |" in main_md
    # Each run lands in exactly one group, its matched KL read only from its own group's points.
    summ = pd.read_csv(out / "data" / "matched_summary.csv")
    assert set(summ["backbone"]) == {full, small}
    assert (summ.groupby(["backbone", "method", "level_spec"])["n_seeds"].max() == 3).all()


def test_mixed_split_in_one_group_is_refused(tmp_path, capsys):
    root = tmp_path / "runs"
    for rec in _micro():
        write(root / "test", rec)
    # A dev-split run whose benchmark label does not say so would join the test group.
    dev = record("lora", 5, 0.3, steps=300)
    dev["split"] = "dev"
    write(root / "dev", dev)
    rc, _, err = _report([str(root), "--out", str(tmp_path / "rep"), "--reference", REFERENCE], capsys)
    line = _one_error_line(err)
    assert rc == 2 and not (tmp_path / "rep").exists()
    assert line.startswith("error: runs on micro differ in split: test (")
    assert " vs dev (1 runs, e.g. " in line


def test_other_benchmark_data_in_one_group_is_refused_naming_where(tmp_path, capsys):
    root = tmp_path / "runs"
    for rec in _micro():
        write(root / "a", rec)
        other = copy.deepcopy(rec)
        other["run_id"] = rec["run_id"][::-1]
        other["config"]["benchmark"]["seed"] = 99
        write(root / "b", other)
    rc, _, err = _report([str(root), "--out", str(tmp_path / "rep"), "--reference", REFERENCE], capsys)
    line = _one_error_line(err)
    assert rc == 2 and not (tmp_path / "rep").exists()
    assert "differ in benchmark version (config.benchmark) at seed: " in line
    # A null entry (a key added later with a null default) is no difference.
    for path in (root / "b").rglob("record.json"):
        rec = json.loads(path.read_text())
        del rec["config"]["benchmark"]["seed"]
        rec["config"]["benchmark"]["protect"] = None
        path.write_text(json.dumps(rec))
    rc, _, err = _report([str(root), "--out", str(tmp_path / "rep"), "--reference", REFERENCE], capsys)
    assert rc == 0, err


def test_an_empty_folder_is_refused_and_nothing_written(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    out = tmp_path / "rep"
    rc, stdout, err = _report([str(tmp_path / "runs"), "--out", str(out)], capsys)
    assert rc == 2 and not out.exists() and stdout == ""
    assert _one_error_line(err) == (f"error: no records in {tmp_path / 'runs'} (searched recursively for record.json): "
                                    "nothing to report")


def test_a_folder_of_incomplete_records_only_is_refused(tmp_path, capsys):
    failed = record("lora", 0, 0.3, status="failed")
    failed["error"] = {"type": "ValueError", "message": "bad config"}
    write(tmp_path / "runs", failed)
    write(tmp_path / "runs", record("atlas", 1, 0.3, status="running"))
    out = tmp_path / "rep"
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out)], capsys)
    assert rc == 2 and not out.exists()
    assert _one_error_line(err) == (f"error: no complete record in {tmp_path / 'runs'}: all 2 left out (failed: 1, "
                                    "running: 1; `python -m analysis collect` lists why): nothing to report")


def test_gain_levels_without_base_runs_are_refused_naming_how_to_add_them(tmp_path, capsys):
    for rec in _micro():
        if rec["method"] != "base":
            write(tmp_path / "runs", rec)
    out = tmp_path / "rep"
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out), "--reference", REFERENCE], capsys)
    line = _one_error_line(err)
    assert rc == 2 and not out.exists()
    assert line.startswith("error: no complete base runs on micro/micro: gain levels are shares of the coding gain")
    assert "python run.py method=base backbone=micro benchmark=micro" in line
    # Absolute levels need no base.
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out), "--levels", "0.3"], capsys)
    assert rc == 0, err


def test_gain_levels_without_the_reference_point_are_refused(tmp_path, capsys):
    for rec in _micro():
        if rec["method"] != "lora":
            write(tmp_path / "runs", rec)
    out = tmp_path / "rep"
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out)], capsys)
    line = _one_error_line(err)
    assert rc == 2 and not out.exists()
    assert line.startswith("error: reference 'lora': no complete lora runs on micro/micro")
    assert "--reference" in line


def test_the_reference_pass1_column_shows_the_reference_not_the_base(tmp_path, capsys):
    """A reference below the base: its own pass@1 is shown (the level stays at the base's, there is no gain)."""
    recs = [record("base", s, 0.20, {"math": 0.0, "commonsense": 0.0}) for s in range(2)]
    recs += [record("lora", s, p, steps=300) for s, p in enumerate((0.04, 0.06))]
    recs += [record("atlas", s, 0.25, steps=300) for s in range(2)]
    for rec in recs:
        write(tmp_path / "runs", rec)
    out = tmp_path / "rep"
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out), "--levels", "gain:0.5"], capsys)
    assert rc == 0, err
    rows = [line for line in (out / "index.md").read_text().splitlines() if line.startswith("| micro | micro | 50%")]
    assert rows == ["| micro | micro | 50% of gain | 0.2000 | 0.2000 | 0.05000 |"]
    header = next(line for line in (out / "index.md").read_text().splitlines() if "pass@1 required" in line)
    assert header.endswith("| base pass@1 (mean over runs) | reference pass@1 (LoRA, mean over seeds) |")
    t = pd.read_csv(out / "data" / "thresholds.csv").iloc[0]
    assert (t["gain_lo"], t["reference_pass1"], t["threshold"]) == pytest.approx((0.20, 0.05, 0.20))
    assert "pass@1 from 0.200 to 0.0500; none: every gain level is the base's pass@1" in \
        (out / "tables" / "main.md").read_text()


def test_kl_columns_name_their_unit(tmp_path, capsys):
    for rec in _micro():
        write(tmp_path / "runs", rec)
    out = tmp_path / "rep"
    rc, _, err = _report([str(tmp_path / "runs"), "--out", str(out), "--reference", REFERENCE], capsys)
    assert rc == 0, err
    header = (out / "tables" / "main.md").read_text().splitlines()[2]
    assert header == ("| Backbone | Method | Data | Seeds | KL at 50% of gain (nats/token) | KL at 75% of gain "
                      "(nats/token) | KL at 90% of gain (nats/token) |")
    assert "| Mean Δ KL (nats/token) |" in (out / "tables" / "paired.md").read_text()
    assert "| math KL (nats/token) | commonsense KL (nats/token) | Mean over domains KL (nats/token) |" in \
        (out / "tables" / "domains.md").read_text()


def test_a_lone_value_is_not_bold():
    """One method reaching the level and the other not: nothing to be best against."""
    t = Table("t", "t", columns=["Method", "KL"], rows=[[Cell("ATLAS"), Cell("0.1", 0.1)],
                                                         [Cell("LoRA"), Cell("not reached")]], best={1: "min"})
    assert t.bold_mask() == [[False, False], [False, False]]
    t.rows.append([Cell("EWC"), Cell("0.2", 0.2)])
    assert t.bold_mask() == [[False, True], [False, False], [False, False]]


def test_the_command_to_add_base_runs_names_the_backbone_without_a_split_label():
    from analysis import matched, schema

    label = "micro [8 code problems / 16 math items]"  # a group --split-incomparable made
    df = pd.DataFrame({"backbone": [label], "benchmark": ["micro_v3@dev"], "method": ["lora"], schema.TARGET_COL: [0.1]})
    with pytest.raises(ValueError, match=r"\(python run\.py method=base backbone=micro benchmark=micro_v3 "
                                         r"benchmark\.split=dev\)"):
        matched.base_pass1(df, label, "micro_v3@dev")
