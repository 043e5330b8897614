"""W&B offline: group and job type, the run-record artifact of a complete run, and `experiments.wandb_sync` logging
finished runs from their records (the committed dev records, copied), read back from the offline run files."""

import contextlib
import io
import json
import os
import shutil

import pytest
from omegaconf import OmegaConf

from experiments import wandb_artifacts, wandb_sync
from experiments.config import LoggerConfig
from experiments.logger import SWEEP_FOLDER_ENV, make_logger, wandb_group
from suite_schema import layout
from tests.conftest import REPO
from tests.experiments.wandb_offline import offline_runs, read_run

DEV = REPO / "docs/results/micro_v3/dev_defaults"
ENRICHED = "4c8033df6378af2e"  # an ATLAS run: it gets code samples, retained samples and a post-hoc scale here
PRESET = "ab8a6b2565912e7e"  # its .hydra files name an experiment preset


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory):
    """W&B offline, silent, with its own config, cache and data folders (artifact staging) in a tmp folder."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(name, str(home / name.lower()))
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv(SWEEP_FOLDER_ENV, raising=False)
        yield home


@pytest.fixture(scope="module")
def synced(tmp_path_factory, wandb_env):
    """The 5 dev records copied (one with samples and a scale, one launched under a preset, plus a failed run) and
    logged twice: (root, stdout of the first pass, stdout of the second)."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(DEV / "records", root, dirs_exist_ok=True)
    run = root / ENRICHED
    rec = json.loads((run / layout.RECORD_NAME).read_text())
    (run / layout.CODE_SAMPLES_NAME).write_text(json.dumps([{"task_id": "t0", "completion": "x"}]))
    (run / "retained_samples.json").write_text(json.dumps({"math": []}))
    scale = layout.scale_dir(run, 0.5)
    scale.mkdir(parents=True)
    scaled = {**rec, "run_id": layout.scale_run_id(ENRICHED, 0.5), "scale": 0.5, "train_run_id": ENRICHED,
              "metrics": {**rec["metrics"], "target": {**rec["metrics"]["target"], "pass@1": 0.125}}}
    (scale / layout.RECORD_NAME).write_text(json.dumps(scaled))
    (scale / layout.CODE_SAMPLES_NAME).write_text("[]")
    hydra = root / PRESET / ".hydra"
    hydra.mkdir()
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n      experiment: micro_defaults\n")
    (hydra / "config.yaml").write_text("logger:\n  kind: wandb\n  group: null\n")
    failed = root / "0000000000000000"
    failed.mkdir()
    (failed / layout.RECORD_NAME).write_text(json.dumps({"run_id": "0000000000000000", "status": "failed",
                                                         "method": "lora"}))
    outs = []
    report = _report(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(report.parent)  # the report's W&B folder goes to ./wandb
        for _ in range(2):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                assert wandb_sync.main([str(root), "--report", str(report)]) == 0
            outs.append(buf.getvalue())
    return root, outs[0], outs[1]


def _report(root):
    """A small report folder beside the runs."""
    report = root.parent / "report_folder" / "report"
    if not report.is_dir():
        (report / "data").mkdir(parents=True)
        (report / "README.md").write_text("# report\n")
        (report / "data" / "table.csv").write_text("a,b\n1,2\n")
    return report


def runs_by_id(folder):
    out = {}
    for path in offline_runs(folder):
        run = read_run(path)
        out.setdefault(run.run_id, []).append(run)
    return out


def test_sync_logs_each_complete_run_with_config_summary_group_and_artifact(synced):
    root, first, _ = synced
    runs = runs_by_id(root)
    ids = sorted(p.name for p in (DEV / "records").iterdir())
    assert sorted(k for k in runs if not k.startswith("report-")) == ids  # the failed run is not logged
    for run_id in ids:
        (run,) = runs[run_id]
        rec = json.loads((root / run_id / layout.RECORD_NAME).read_text())
        assert run.job_type == rec["method"] and run.project == "atlas-suite"
        assert run.group == ("micro_defaults" if run_id == PRESET else "")
        assert {k: v for k, v in run.config.items() if k != "_wandb"} == rec["config"]
        assert run.summary["metrics/target/pass@1"] == rec["metrics"]["target"]["pass@1"]
        assert run.summary["metrics/retained_kl_mean"] == rec["metrics"]["retained_kl_mean"]
        assert run.summary["cost/trainable_params"] == rec["cost"]["trainable_params"]
        (art,) = run.artifacts
        assert art["name"] == f"record-{run_id}" and art["type"] == "run-record"
        expected = ["record.json"]
        if run_id == ENRICHED:
            expected = ["code_samples.json", "record.json", "retained_samples.json", "scales/0.5/code_samples.json",
                        "scales/0.5/record.json"]
            assert run.summary["scale/0.5/metrics/target/pass@1"] == 0.125
        assert art["files"] == expected
        assert f"{run_id} {rec['method']} seed {rec['seed']}: logged (group " in first
    assert "0000000000000000 lora: status failed; not logged (only complete runs are)" in first
    assert len(first.strip().splitlines()) == 7  # 5 logged, 1 not, the report


def test_report_folder_is_a_report_artifact(synced):
    root, first, _ = synced
    runs = runs_by_id(root.parent / "report_folder")["report-report_folder-report"]
    assert len(runs) == 2  # both passes; the same contents give the same digest, one version on the server
    for run in runs:
        (art,) = run.artifacts
        assert run.job_type == "report" and art["name"] == "report-report_folder-report"
        assert art["type"] == "report" and art["files"] == ["README.md", "data/table.csv"]
    assert runs[0].artifacts[0]["digest"] == runs[1].artifacts[0]["digest"]
    assert "report " in first and "artifact report-report_folder-report: 2 files" in first


def test_second_pass_logs_nothing_again_and_force_relogs_the_same_artifact_digest(synced, wandb_env):
    root, _, second = synced
    lines = second.strip().splitlines()
    assert sum("already logged" in line for line in lines) == 5
    runs = runs_by_id(root)
    assert all(len(runs[p.name]) == 1 for p in (DEV / "records").iterdir())  # no second offline run
    assert wandb_sync.main([str(root / ENRICHED), "--force", "--group", "forced"]) == 0
    again = runs_by_id(root)[ENRICHED]
    assert len(again) == 2 and {r.group for r in again} == {"", "forced"}
    assert again[0].artifacts[0]["digest"] == again[1].artifacts[0]["digest"]  # same files: one version on the server
    # Changed files are logged again on the next plain pass.
    (root / ENRICHED / "retained_samples.json").write_text(json.dumps({"math": [1]}))
    assert wandb_artifacts.logged_before(root / ENRICHED / "wandb", root / ENRICHED, wandb_sync.defaults()) is None


def test_bad_paths_and_settings_are_one_line_errors_before_anything_is_logged(tmp_path, capsys, wandb_env):
    (tmp_path / "empty").mkdir()
    good = tmp_path / "good"
    shutil.copytree(DEV / "records" / PRESET, good / PRESET)
    assert wandb_sync.main([str(good), str(tmp_path / "empty"), str(tmp_path / "nowhere"), "--mode", "loud"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --mode='loud' is not allowed: one of ['offline', 'online']",
                   f"error: {tmp_path / 'empty'}: no run record (record.json) under it",
                   f"error: {tmp_path / 'nowhere'}: no such run directory or record file"]
    assert not list(tmp_path.rglob("wandb"))
    assert wandb_sync.main([]) == 2
    assert "give at least one run root" in capsys.readouterr().err


def wandb_cfg(**extra):
    return OmegaConf.merge(OmegaConf.structured(LoggerConfig), OmegaConf.load(REPO / "conf/logger/wandb.yaml"), extra)


def test_live_logger_sets_group_job_type_and_logs_the_record_artifact(tmp_path, wandb_env):
    run_dir = tmp_path / PRESET
    shutil.copytree(DEV / "records" / PRESET, run_dir)
    rec = json.loads((run_dir / layout.RECORD_NAME).read_text())
    logger = make_logger(wandb_cfg(group="my-sweep"), PRESET, run_dir, rec["config"], "x", job_type=rec["method"])
    logger.log({"train/loss": 1.0}, step=1)
    logger.summary({"metrics": rec["metrics"]})
    logger.log_run_files(run_dir, rec)
    logger.close()
    (path,) = offline_runs(run_dir)
    run = read_run(path)
    assert (run.run_id, run.group, run.job_type) == (PRESET, "my-sweep", rec["method"])
    assert run.artifacts[0]["files"] == ["record.json"]
    # The backfill sees the live run's W&B folder holds this record already.
    line = wandb_sync.log_finished(run_dir, wandb_sync.defaults())
    assert line.endswith(f"({run_dir / 'wandb' / wandb_artifacts.MARKER_NAME}); skipped"), line
    # A configured job type wins over the method's name.
    other = make_logger(wandb_cfg(job_type="probe"), "fedcba9876543210", tmp_path / "o", {}, "y", job_type="lora")
    other.close()
    probe = read_run(offline_runs(tmp_path / "o")[0])
    assert probe.job_type == "probe", (probe, offline_runs(tmp_path / "o"))


def test_group_is_configured_else_the_preset_else_the_sweep_folder_else_none(monkeypatch):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    monkeypatch.setenv(SWEEP_FOLDER_ENV, "20260101-120000-42")
    assert wandb_group("mine") == "mine"
    assert wandb_group(None) is None  # no Hydra: a plain single run
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        preset = compose("config", ["experiment=micro_defaults", "+point=micro_base"], return_hydra_config=True)
        plain = compose("config", [], return_hydra_config=True)
    try:
        HydraConfig.instance().set_config(preset)
        assert wandb_group(None) == "micro_defaults" and wandb_group("mine") == "mine"
        HydraConfig.instance().set_config(plain)
        assert wandb_group(None) is None  # a single run (RUN mode)
        with read_write(plain.hydra):
            plain.hydra.mode = RunMode.MULTIRUN
        HydraConfig.instance().set_config(plain)
        assert wandb_group(None) == "sweep-20260101-120000-42"
        monkeypatch.delenv(SWEEP_FOLDER_ENV)
        assert wandb_group(None) is None
    finally:
        HydraConfig.instance().cfg = None



@pytest.mark.slow
def test_a_run_with_logger_wandb_logs_its_record_and_a_skipped_complete_run_is_logged_once(
        tiny_backbone_dir, tiny_benchmark_dir, tmp_path, wandb_env):
    from tests.conftest import run_cli, tiny_overrides

    args = ["method=lora", "logger=wandb", "logger.group=e2e",
            *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache")]
    first = run_cli(args)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "runs").glob(f"*/{layout.RECORD_NAME}")]
    (path,) = offline_runs(run_dir)
    run = read_run(path)
    assert (run.run_id, run.group, run.job_type) == (run_dir.name, "e2e", "lora")
    assert run.artifacts[0]["files"] == ["code_samples.json", "record.json", "retained_samples.json"]
    rec = json.loads((run_dir / layout.RECORD_NAME).read_text())
    assert run.summary["metrics/target/pass@1"] == rec["metrics"]["target"]["pass@1"]
    # Skipped as complete: its W&B run already holds the record; once the marker is gone, the record is logged.
    second = run_cli(args)
    assert second.returncode == 0 and "already logged" in second.stdout, second.stdout[-2000:]
    assert len(offline_runs(run_dir)) == 1
    (run_dir / "wandb" / wandb_artifacts.MARKER_NAME).unlink()
    third = run_cli(args)
    assert f"W&B: {run_dir.name} lora seed 0: logged (group e2e, job type lora" in third.stdout, third.stdout[-2000:]
    runs = [read_run(p) for p in offline_runs(run_dir)]
    assert len(runs) == 2 and runs[0].artifacts[0]["digest"] == runs[1].artifacts[0]["digest"]


def test_a_new_sweep_folder_names_itself_to_the_jobs(tmp_path, monkeypatch):
    from hydra_plugins.atlas_sweep.planner import new_sweep_folder

    monkeypatch.delenv(SWEEP_FOLDER_ENV, raising=False)
    folder = new_sweep_folder(tmp_path)
    assert folder.parent == tmp_path / ".sweeps" and folder.is_dir()
    assert os.environ[SWEEP_FOLDER_ENV] == folder.name


def test_a_complete_run_is_still_skipped_when_wandb_cannot_log_it(tmp_path, monkeypatch, caplog):
    from experiments import job

    run_dir = tmp_path / PRESET
    shutil.copytree(DEV / "records" / PRESET, run_dir)

    def unreachable(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(wandb_sync, "log_finished", unreachable)
    with caplog.at_level("WARNING", logger="suite.run"):
        rec = job._skipped(PRESET, run_dir, OmegaConf.create({"logger": wandb_cfg(mode="online")}))
    assert rec["run_id"] == PRESET
    assert f"W&B: {PRESET}: its record was not logged (ConnectionError: no network)" in caplog.text
