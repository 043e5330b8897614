"""`python run.py --plan`: every job of a sweep validated as a launch validates it, listed with run id, run directory
and state, and nothing run or written; `--help`, `--cfg` and the preset spelling of run.py's command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from experiments import command_line, run_lock
from hydra_plugins.atlas_sweep import plan_command
from tests.conftest import REPO


def _plan(argv):
    out = io.StringIO()
    code = plan_command.main(argv, out=out)
    return code, out.getvalue()


def _rows(text):
    """{job number: (state, run id, run dir)} of the plan's table."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("[plan]   ") and len(parts) > 3 and parts[1].isdigit():
            state = "to run" if parts[2] == "to" else parts[2]
            rest = parts[4:] if state == "to run" else parts[3:]
            rows[int(parts[1])] = (state, rest[0], next(p for p in rest if p.endswith(rest[0]) and "/" in p))
    return rows


def test_the_plan_lists_every_job_with_its_state_and_writes_nothing(tmp_path):
    root = tmp_path / "runs"
    argv = ["-m", "method=atlas,lora", "seed=0,1", f"run_root={root}"]
    code, text = _plan(argv)
    assert code == 0, text
    rows = _rows(text)
    assert sorted(rows) == [0, 1, 2, 3] and {s for s, _, _ in rows.values()} == {"to run"}
    assert "4 run(s), every job's config valid: 4 to run; nothing was launched" in text
    assert not root.exists()  # nothing written: no run directory, no sweep folder, no multirun.yaml
    # The run ids are the ones a run of the same overrides gets (its `${run_id:}` directory).
    ids = [rows[i][1] for i in range(4)]
    assert len(set(ids)) == 4 and all(rows[i][2].endswith(f"runs/{ids[i]}") for i in range(4))

    # Job 0 failed earlier, job 1 is held by a live process, job 2 is complete (a launch skips it).
    (root / ids[0]).mkdir(parents=True)
    (root / ids[0] / "record.json").write_text(json.dumps({"run_id": ids[0], "status": "failed",
                                                            "error": {"type": "Diverged", "message": "loss is nan"}}))
    (root / ids[2]).mkdir(parents=True)
    (root / ids[2] / "record.json").write_text(json.dumps({"run_id": ids[2], "status": "complete"}))
    with run_lock.hold(root / ids[1]):
        code, text = _plan(argv)
    assert code == 0, text
    rows = _rows(text)
    assert [rows[i][0] for i in range(4)] == ["failed", "running", "done", "to run"]
    assert "Diverged: loss is nan" in text
    assert "a launch runs 2 of them" in text


@pytest.mark.parametrize("argv, expected", [
    (["-m", "method=atlas,lora", "eval.pass_k=[1,5]"], "2 of 2 sweep jobs have an invalid config; nothing was launched"),
    (["-m", "method=atlas,nosuch"], "method=nosuch is not allowed: one of atlas,"),
])
def test_a_job_a_launch_would_refuse_is_exit_2(argv, expected, tmp_path, capsys):
    code, text = _plan([*argv, f"run_root={tmp_path}"])
    assert code == 2 and text == ""
    assert capsys.readouterr().err.startswith(f"error: {expected}")


def test_a_backbone_that_is_not_here_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 sets it
    code, text = _plan(["-m", "method=atlas,lora", "backbone=qwen3-8b", "seed=0,1,2", f"run_root={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2 and text == "" and err.count("\n") == 1
    assert err.startswith("error: backbone.path='Qwen/Qwen3-8B' is not allowed: a backbone in the local hub cache "
                          "while HF_HUB_OFFLINE is set")
    assert not (tmp_path / "runs").exists()


def test_help_lists_every_group_with_its_options_and_the_common_keys():
    text = command_line.help_text()
    loader = command_line.config_loader()
    for group in [g for g in loader.list_groups("") if g != "hydra"] + ["hydra/launcher"]:
        line = next(line for line in text.splitlines() if line.strip().startswith(group + " "))
        options = sorted(loader.get_group_options(group))
        if len(options) <= command_line.HELP_LISTED:
            listed = text[text.index(line):].split("\n\n")[0]
            assert all(o in listed for o in options), group
        else:
            assert f"{len(options)} options" in line
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    cfg = loader.load_configuration("config", [], RunMode.RUN)
    for key, _ in command_line.COMMON_KEYS:  # every key the help names is a key of the config
        assert key.startswith("hydra.launcher.") or OmegaConf.select(cfg, key, default="absent") != "absent", key
        assert f"  {key} " in text
    assert "seed" in text and "default 0" in text


def test_a_preset_is_selected_without_plus_and_the_old_spelling_still_works():
    assert command_line.normalized(["+experiment=micro_main", "+point=x", "seed=1"]) == [
        "experiment=micro_main", "+point=x", "seed=1"]
    new = command_line.multirun_jobs(["experiment=micro_main_1pt"])
    assert new == command_line.multirun_jobs(["+experiment=micro_main_1pt"]) and len(new) > 1


@pytest.mark.slow
def test_cfg_job_validates_and_cfg_hydra_resolves(tmp_path, capsys):
    bad = subprocess.run([sys.executable, str(REPO / "run.py"), "--cfg", "job", "eval.pass_k=[1,5]"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "error: eval.n_samples=1 is not allowed: an integer >= max(pass_k) = 5\n"
    from experiments.run_id import register_run_id_resolver

    register_run_id_resolver()
    command_line.show_config(["--cfg", "hydra", "--resolve", "method=lora", f"run_root={tmp_path}"])
    shown = capsys.readouterr().out
    assert f"dir: {tmp_path}/" in shown and "${" not in shown.split("sweep:")[0]
    command_line.show_config(["--cfg", "job", "-p", "train", "train.steps=7"])
    assert "steps: 7" in capsys.readouterr().out.splitlines()
