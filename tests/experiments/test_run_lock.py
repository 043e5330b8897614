"""One run at a time per run directory: a second launch names the holder and stops (exit 3), or waits; the lock of
a killed process is taken over."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.run_lock import LOCK_NAME, RunBusyError, hold
from tests.conftest import REPO, run_cli, tiny_overrides


def test_a_second_holder_is_refused_with_the_first_ones_name(tmp_path):
    with hold(tmp_path / "run"):
        who = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert who["pid"] == os.getpid()
        with pytest.raises(RunBusyError, match=f"is being run by pid {os.getpid()} on "):
            with hold(tmp_path / "run"):
                pass
    with hold(tmp_path / "run"):  # released: taken again
        pass


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    code = ("import sys, time; from experiments.run_lock import hold\n"
            "with hold(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunBusyError, match=f"pid {proc.pid}"):
            with hold(tmp_path / "run"):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with hold(tmp_path / "run"):
        pass


def test_a_second_launch_of_a_running_run_stops_with_exit_3(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    args = ["method=lora", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache",
                                           **{"train.steps": "400", "train.checkpoint_every": "1000"})]
    first = subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        locks = []
        while not locks and time.time() < deadline and first.poll() is None:
            locks = [p for p in (tmp_path / "runs").rglob(LOCK_NAME) if p.read_text()]
            time.sleep(0.2)
        assert locks, "the first launch never took its run's lock"
        second = run_cli(args)
        assert second.returncode == 3, second.stderr[-2000:]
        assert f"is being run by pid {first.pid}" in second.stderr and "wait_if_running=true" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
