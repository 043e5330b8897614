"""A run writes only into its own directory, `<run_root>/<run_id>` (or one holding its record): any other folder is
refused with one line and exit code 2 before Hydra writes into it, and a complete run is skipped without a write."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.job import run_id_for
from experiments.run_dir import RunDirCheck, RunDirError, check_folder, check_run_dir
from experiments.run_id import register_run_id_resolver
from suite_schema.layout import RECORD_NAME
from tests.conftest import REPO

RUN_ID = "0123456789abcdef"


def test_only_the_runs_own_directory_or_one_holding_its_record_is_allowed(tmp_path):
    root = tmp_path / "runs"
    check_run_dir(root / RUN_ID, root, RUN_ID, "hydra.run.dir", root / RUN_ID)  # not made yet: fine
    (tmp_path / "link").symlink_to(root, target_is_directory=True)
    root.mkdir()
    check_run_dir(tmp_path / "link" / RUN_ID, root, RUN_ID, "hydra.run.dir", "x")  # the same folder through a link

    folder = tmp_path / "elsewhere"
    with pytest.raises(RunDirError, match=rf"^hydra.run.dir='{folder}' is not allowed: a run writes only into its own "
                                          rf"directory {root / RUN_ID} \(<run_root>/<run_id>"):
        check_run_dir(folder, root, RUN_ID, "hydra.run.dir", str(folder))
    folder.mkdir()
    (folder / RECORD_NAME).write_text(json.dumps({"run_id": RUN_ID, "status": "failed"}))
    check_run_dir(folder, root, RUN_ID, "hydra.run.dir", str(folder))  # an earlier launch of this run wrote there

    other = root / "fedcba9876543210"
    other.mkdir()
    (other / RECORD_NAME).write_text(json.dumps({"run_id": "fedcba9876543210", "status": "complete"}))
    with pytest.raises(RunDirError, match="holds the record of run 'fedcba9876543210'"):
        check_run_dir(other, root, RUN_ID, "hydra.run.dir", str(other))


def hydra_config(*overrides):
    """The composed config of `python run.py OVERRIDES` with its `hydra` node, as the callback gets it."""
    register_run_id_resolver()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=["method=base", *overrides], return_hydra_config=True)


def run_id_of(cfg):
    return run_id_for(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))


def test_the_callback_is_configured():
    cfg = hydra_config()
    assert cfg.hydra.callbacks.run_dir_check._target_ == "experiments.run_dir.RunDirCheck"


@pytest.mark.parametrize("setting", ["hydra.run.dir", "train.lr"])
def test_a_foreign_folder_or_a_bad_value_ends_the_launch_before_hydra_writes(tmp_path, capsys, setting):
    foreign = tmp_path / "someone_elses"
    foreign.mkdir()
    (foreign / "notes.tmp").write_text("mine")
    value = {"hydra.run.dir": str(foreign), "train.lr": "-1"}[setting]
    cfg = hydra_config(f"run_root={tmp_path / 'runs'}", f"{setting}={value}")
    with pytest.raises(SystemExit) as stop:
        RunDirCheck().on_run_start(config=cfg, config_name="config")
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {setting}=") and "is not allowed" in err[0], err
    assert [p.name for p in foreign.iterdir()] == ["notes.tmp"] and not (tmp_path / "runs").exists()


def test_a_complete_run_is_skipped_without_hydra_writing_into_its_directory(tmp_path):
    cfg = hydra_config(f"run_root={tmp_path}")
    run_dir = tmp_path / run_id_of(cfg)
    RunDirCheck().on_run_start(config=cfg, config_name="config")
    assert cfg.hydra.output_subdir == ".hydra"  # no record yet: Hydra writes its files as always
    run_dir.mkdir()
    (run_dir / RECORD_NAME).write_text(json.dumps({"run_id": run_id_of(cfg), "status": "complete"}))
    RunDirCheck().on_run_start(config=cfg, config_name="config")
    assert cfg.hydra.output_subdir is None


def test_a_run_root_that_is_a_file_is_refused_before_a_run_or_a_sweep_writes(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    check_folder("run_root", tmp_path / "runs" / "new")  # made when needed
    for value, existing in ((tmp_path / "a_file", "a_file"), (tmp_path / "a_file" / "runs", "a_file"),
                            (tmp_path / "dangling" / "runs", "dangling")):
        with pytest.raises(RunDirError, match=rf"^run_root='{value}' is not allowed: a folder; "
                                              rf"{tmp_path / existing} is not one$"):
            check_folder("run_root", value)
    for mode in ("run", "multirun"):
        cfg = hydra_config(f"run_root={tmp_path / 'a_file'}")
        with pytest.raises(SystemExit) as stop:
            getattr(RunDirCheck(), f"on_{mode}_start")(config=cfg, config_name="config")
        assert stop.value.code == 2
        assert capsys.readouterr().err == f"error: run_root='{tmp_path / 'a_file'}' is not allowed: a folder; " \
                                          f"{tmp_path / 'a_file'} is not one\n"
