"""run.py's overrides checked before Hydra acts on them: one line naming key, value and what is allowed; exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.command_line import CommandLineError, check
from tests.conftest import REPO

REFUSED = {
    "an unknown method": (["method=nosuch"], "method=nosuch is not allowed: one of atlas, atlas_global,"),
    "an unknown backbone": (["backbone=nosuch"], "backbone=nosuch is not allowed: one of gemma-2-9b,"),
    "a misspelt key": (["train.stepz=3"], "train.stepz=3 is not allowed: train has no key stepz: one of batch_size,"),
    "a misspelt eval key": (["eval.pass_kk=[1]"], "eval.pass_kk=[1] is not allowed: eval has no key pass_kk: did you mean pass_k?"),
    "an unparsable override": (["train.steps=[1"], "train.steps=[1 is not allowed: not an override Hydra can parse"),
    "a sweep without -m": (["method=lora,atlas"], "method=lora,atlas is not allowed: a list of values sweeps; add -m"),
    "an unknown preset": (["experiment=micro_mian"], "experiment=micro_mian is not allowed: one of micro_ablations,"),
    "a point close to a real one": (["+point=tune_lwf_l"], "+point=tune_lwf_l is not allowed: did you mean tune_lwf_l"),
    "appending a key that exists": (["+train.steps=4"], ("+train.steps=4 is not allowed: train.steps exists already; "
                                                        "set it with train.steps=4")),
    "a sweep over an unknown method": (["-m", "method=nosuch,lora"], "method=nosuch is not allowed: one of atlas,"),
    "a sweep over an unknown key": (["-m", "train.stepz=1,2"], "train.stepz=1 is not allowed: train has no key stepz"),
    "two commands": (["-m", "--cfg", "job", "seed=0,1"], "--multirun with --cfg is not allowed: one of --run,"),
    "a missing extra config dir": (["--config-dir", "/nonexistent/conf"], "--config-dir=/nonexistent/conf is not allowed"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_bad_override_is_one_line_naming_it(name):
    argv, expected = REFUSED[name]
    with pytest.raises(CommandLineError) as info:
        check(argv)
    message = str(info.value)
    assert message.startswith(expected), message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("argv", [
    [],
    ["method=lora", "train.steps=3", "seed=1"],
    ["--cfg", "job", "method=lora"],
    ["--help"],
    ["-m", "method=atlas,lora", "seed=0,1"],
    ["-m", "experiment=micro_main_1pt"],
    ["-m", "+experiment=micro_main_1pt"],  # the old spelling
    ["-m", "experiment=micro_ablations", "hydra/launcher=slurm"],
    ["+point=tune_lwf_l1", "method=lwf"],
])
def test_good_command_lines_pass(argv):
    check(argv)


@pytest.mark.slow
def test_run_py_exits_2_with_one_line_and_leaves_no_folder(tmp_path):
    for argv in (["method=nosuch"], ["-m", "method=nosuch,lora"], ["train.steps=[1"]):
        proc = subprocess.run([sys.executable, str(REPO / "run.py"), *argv, f"run_root={tmp_path}"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert "HYDRA_FULL_ERROR" not in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_deleted_plain_value_points_to_where_values_live():
    from hydra import compose, initialize_config_dir

    from experiments.config import validate_config
    from experiments.validation import ConfigError

    check(["~seed"])  # Hydra deletes the key: composing works, validation names it
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["~seed"])
    with pytest.raises(ConfigError, match=r"seed=\?\?\? is not allowed: a value: every key has its value in "
                                          r"conf/config.yaml or on the command line \(seed=\.\.\.\)"):
        validate_config(cfg)
