"""Collecting records: recursive discovery, skipped runs with reasons, deduplication, W&B, table files."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from analysis_synth import record, write

from analysis import schema
from analysis.cli import main
from analysis.collect import collect, read_table, record_from_wandb, unflatten, write_table
from suite_schema import layout


def _by_kind(col):
    out = {}
    for s in col.skipped:
        out.setdefault(s.kind, []).append(s)
    return out


def test_collects_nested_run_dirs_and_builds_rows(tmp_path):
    a = record("atlas", 0, 0.3, {"math": 0.02, "commonsense": 0.04}, steps=100)
    b = record("atlas", 1, 0.4, {"math": 0.03, "commonsense": 0.05}, steps=100)
    c = record("lora", 0, 0.5, {"math": 0.1, "commonsense": 0.2}, steps=300, scale=0.5)
    write(tmp_path / "runs", a)
    write(tmp_path / "multirun" / "2026-01-01" / "10-00-00", b)
    write(tmp_path / "multirun" / "2026-01-01" / "10-00-00" / "deeper", c)
    # A folder named like a run's own subfolder is searched when it is not inside a run directory.
    d = record("ewc", 0, 0.2)
    write(tmp_path / "checkpoints" / "sweep", d)
    col = collect([tmp_path])
    df = col.table
    assert col.skipped == [] and len(df) == 4 and col.n_sources == 4
    assert set(df["run_id"]) == {a["run_id"], b["run_id"], c["run_id"], d["run_id"]}
    row_a = df[df["run_id"] == a["run_id"]].iloc[0]
    assert row_a[schema.TARGET_COL] == 0.3 and row_a[schema.KL_MEAN_COL] == pytest.approx(0.03)
    assert row_a["retained/math/kl_token_mean"] == 0.02
    assert row_a["retained/math/kind"] == "math" and row_a["retained/commonsense/kind"] == "choice"
    assert row_a["retained/math/answer_change_rate"] == 0.1
    assert row_a["retained/commonsense/choice_flip_rate"] == 0.05
    assert row_a["knob/rank"] == 8 and row_a["knob/train.steps"] == 100 and row_a["knob/train.lr"] == 1e-3
    assert row_a["scale"] == 1.0 and row_a["cost/stored_bytes"] == 4000
    # Seeds of one sweep point share its key; the scale is a knob.
    assert row_a["sweep_key"] == df[df["run_id"] == b["run_id"]].iloc[0]["sweep_key"]
    row_c = df[df["run_id"] == c["run_id"]].iloc[0]
    assert row_c["scale"] == 0.5
    c1 = record("lora", 0, 0.5, steps=300, scale=1.0)
    assert schema.to_row(c1, "x")["train_key"] == row_c["train_key"]
    assert schema.to_row(c1, "x")["sweep_key"] != row_c["sweep_key"]


def test_failed_incomplete_and_malformed_runs_are_listed_not_mixed_in(tmp_path):
    root = tmp_path / "runs"
    good = record("lora", 0, 0.5)
    write(root, good)
    failed = record("lora", 1, 0.5, status="failed")
    failed["error"] = {"type": "RuntimeError", "message": "CUDA out of memory.\nTried to allocate 2 GiB",
                       "traceback": "..."}
    write(root, failed)
    interrupted = record("lora", 2, 0.5, status="interrupted")
    interrupted["interrupted"] = {"step": 120, "reason": "SIGTERM"}
    write(root, interrupted)
    write(root, record("lora", 3, 0.5, status="running"))
    write(root, None, "unparseable", text='{"run_id": "abc", "status": ')
    no_seed = record("lora", 4, 0.5)
    del no_seed["seed"]
    write(root, no_seed)
    str_seed = record("lora", 5, 0.5)
    str_seed["seed"] = "5"
    write(root, str_seed)
    bad_p1 = record("lora", 6, 0.5)
    bad_p1["metrics"]["target"]["pass@1"] = "0.5"
    write(root, bad_p1)
    nan_kl = record("lora", 7, 0.5)
    nan_kl["metrics"]["retained_kl_mean"] = float("nan")
    write(root, nan_kl)
    bad_knobs = record("lora", 8, 0.5)
    bad_knobs["knobs"] = ["rank", 8]
    write(root, bad_knobs)
    weird = record("lora", 9, 0.5)
    weird["status"] = "done"
    write(root, weird)
    write(root, None, "array", text="[1, 2]")
    (root / "0123456789abcdef" / ".hydra").mkdir(parents=True)
    (root / "0123456789abcdef" / "run.log").write_text("started\n")

    col = collect([root])
    assert list(col.table["run_id"]) == [good["run_id"]]
    kinds = _by_kind(col)
    assert [s.reason for s in kinds["failed"]] == ["RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"]
    assert kinds["failed"][0].method == "lora" and kinds["failed"][0].seed == 1
    assert "step 120" in kinds["interrupted"][0].reason and "SIGTERM" in kinds["interrupted"][0].reason
    assert kinds["running"][0].reason.startswith("still running")
    assert kinds["no record"][0].run_id == "0123456789abcdef"
    reasons = sorted(s.reason for s in kinds["malformed"])
    assert len(reasons) == 8
    expected = ["unparseable JSON", "missing required key 'seed'", "'seed' is string", "'metrics.target.pass@1' is string",
                "'metrics.retained_kl_mean' is number (nan)", "'knobs' is array", "unknown status 'done'",
                "JSON array, expected an object"]
    for fragment in expected:
        assert any(fragment in r for r in reasons), (fragment, reasons)
    assert col.counts() == {"failed": 1, "interrupted": 1, "malformed": 8, "no record": 1, "running": 1}
    frame = col.skipped_frame()
    assert list(frame.columns) == ["source", "kind", "reason", "run_id", "method", "seed"] and len(frame) == 12


def test_duplicate_run_ids_keep_one_record(tmp_path):
    old = record("atlas", 0, 0.30, end_time="2026-01-01T00:00:00+00:00")
    new = json.loads(json.dumps(old))
    new["metrics"]["target"]["pass@1"] = 0.31
    new["provenance"]["end_time"] = "2026-02-01T00:00:00+00:00"
    failed = json.loads(json.dumps(old))
    failed["status"] = "failed"
    failed["error"] = {"type": "ValueError", "message": "boom"}
    write(tmp_path / "a", old)
    write(tmp_path / "b", new)
    write(tmp_path / "c", failed)
    same = json.loads(json.dumps(new))
    same["provenance"]["end_time"] = "2026-01-15T00:00:00+00:00"
    write(tmp_path / "d", same)
    col = collect([tmp_path])
    assert len(col.table) == 1 and col.table.iloc[0][schema.TARGET_COL] == 0.31
    kinds = _by_kind(col)
    dups = kinds["duplicate"] + kinds["duplicate, disagrees"]
    assert len(dups) == 3 and all(str(tmp_path / "b") in s.reason for s in dups)
    assert any(s.reason.startswith("failed record") for s in kinds["duplicate"])
    # a complete duplicate with other metrics is flagged with both numbers; an identical one is not
    [disagree] = kinds["duplicate, disagrees"]
    assert disagree.source.startswith(str(tmp_path / "a"))
    assert "its metrics differ from the used record's (pass@1 0.3 vs 0.31" in disagree.reason
    assert any(s.source.startswith(str(tmp_path / "d")) for s in kinds["duplicate"])
    assert "failed" not in kinds
    # The same directory given twice is read once.
    assert len(collect([tmp_path / "a", tmp_path / "a"]).table) == 1


class FakeApi:
    def __init__(self, runs):
        self._runs = runs
        self.paths = []

    def runs(self, path):
        self.paths.append(path)
        return list(self._runs)


def _wandb_run(rec, state="finished", nested=False, wrapped=False):
    flat = {}  # the flat "metrics/target/pass@1" form is what the W&B logger writes

    def flatten(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict):
                flatten(v, f"{prefix}{k}/")
            else:
                flat[f"{prefix}{k}"] = v

    summary = {"metrics": rec["metrics"], "cost": rec["cost"]} if "metrics" in rec else {}
    if nested:
        flat = summary
    else:
        flatten(summary, "")
    config = {k: {"value": v, "desc": None} for k, v in rec["config"].items()} if wrapped else rec["config"]
    return SimpleNamespace(id=rec["run_id"], state=state, config=config, summary_metrics=flat)


def test_wandb_runs_are_read_through_an_injected_api(tmp_path):
    local = record("lora", 0, 0.5)
    write(tmp_path, local)
    local_copy = _wandb_run(local)
    remote = record("atlas", 1, 0.4, {"math": 0.01, "commonsense": 0.03})
    nested = record("atlas", 2, 0.45, {"math": 0.02, "commonsense": 0.02})
    crashed = record("atlas", 3, 0.45, status="failed")
    running = record("atlas", 4, 0.45, status="running")
    api = FakeApi([_wandb_run(remote, wrapped=True), _wandb_run(nested, nested=True), local_copy,
                   _wandb_run(crashed, state="crashed"), _wandb_run(running, state="running")])
    col = collect([tmp_path], wandb_paths=["team/atlas"], api=api)
    assert api.paths == ["team/atlas"]
    df = col.table.set_index("run_id")
    assert sorted(df.index) == sorted([local["run_id"], remote["run_id"], nested["run_id"]])
    assert df.loc[local["run_id"], "source"] == str(tmp_path / local["run_id"] / "record.json")
    r = df.loc[remote["run_id"]]
    assert r["source"] == f"wandb:team/atlas/{remote['run_id']}"
    assert r["method"] == "atlas" and r["seed"] == 1 and r[schema.TARGET_COL] == 0.4
    assert r["retained/math/kl_token_mean"] == 0.01 and r[schema.KL_MEAN_COL] == pytest.approx(0.02)
    assert r["knob/rank"] == 8 and r["knob/train.steps"] == 300
    # A local record and its W&B run give one sweep point.
    assert r["sweep_key"] == schema.to_row(remote, "x")["sweep_key"]
    assert df.loc[nested["run_id"], schema.TARGET_COL] == 0.45
    kinds = _by_kind(col)
    assert "W&B run state 'crashed'" in kinds["failed"][0].reason
    assert kinds["running"][0].run_id == running["run_id"]
    assert kinds["duplicate"][0].source == f"wandb:team/atlas/{local['run_id']}"


def test_wandb_record_and_unflatten():
    assert unflatten({"a/b": 1, "a/c/d": 2, "e": {"f": 3}}) == {"a": {"b": 1, "c": {"d": 2}}, "e": {"f": 3}}
    rec = record_from_wandb(SimpleNamespace(id="r1", state="finished", config={}, summary_metrics={}))
    assert layout.validate(rec) == "'method' is null (None), expected string"


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_table_files_round_trip(tmp_path, suffix):
    recs = [record("atlas", s, 0.3 + s / 10, steps=100 * (s + 1)) for s in range(3)]
    recs.append(record("lora", 0, 0.5, knobs={"rank": 8, "target_modules": ["q_proj", "v_proj"]}))
    for r in recs:
        write(tmp_path / "runs", r)
    col = collect([tmp_path / "runs"])
    path = write_table(col.table, tmp_path / f"table{suffix}")
    back = read_table(path)
    assert len(back) == 4 and list(back.columns) == list(col.table.columns)
    assert sorted(back["run_id"]) == sorted(r["run_id"] for r in recs)
    pd.testing.assert_series_equal(back[schema.TARGET_COL], col.table[schema.TARGET_COL])
    tm = back.set_index("method").loc["lora", "knob/target_modules"]
    assert json.loads(tm) == ["q_proj", "v_proj"]


def test_collect_cli(tmp_path, capsys):
    write(tmp_path / "runs", record("atlas", 0, 0.3))
    failed = record("atlas", 1, 0.3, status="failed")
    failed["error"] = {"type": "OSError", "message": "disk full"}
    write(tmp_path / "runs", failed)
    out = tmp_path / "t.csv"
    assert main(["collect", str(tmp_path / "runs"), "--out", str(out), "--skipped", str(tmp_path / "s.csv"),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "1 complete runs" in text and "OSError: disk full" in text
    assert len(pd.read_csv(out)) == 1 and len(pd.read_csv(tmp_path / "s.csv")) == 1
    assert main(["collect"]) == 2
    assert main(["collect", str(tmp_path / "missing")]) == 2


def test_boolean_cost_flags_are_accepted_but_not_strings(tmp_path):
    flagged = record("ewc", 0, 0.4, cost={"train_seconds": 10.0})
    flagged["cost"]["fisher_cache_hit"] = True
    worded = record("ewc", 1, 0.4, cost={"train_seconds": 10.0})
    worded["cost"]["train_seconds"] = "fast"
    write(tmp_path, flagged)
    write(tmp_path, worded)
    result = collect([tmp_path])
    assert list(result.table["run_id"]) == [flagged["run_id"]]
    assert "cost/fisher_cache_hit" not in result.table.columns
    (skip,) = [s for s in result.skipped if s.run_id == worded["run_id"]]
    assert "'cost.train_seconds' is" in skip.reason


def test_no_progress_bar_off_a_terminal(tmp_path, capsys):
    # stderr is captured here, not a terminal: a bar's redraws would land in the file as they are
    write(tmp_path, record("atlas", 0, 0.3))
    assert len(collect([str(tmp_path)], progress=True).table) == 1
    err = capsys.readouterr().err
    assert "records" not in err and "\r" not in err
