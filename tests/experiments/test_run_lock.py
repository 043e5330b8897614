"""One run at a time per run directory: a second launch names the holder and stops (exit 3), or waits; the lock of
a killed process is taken over."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from experiments.run_lock import LOCK_NAME, RunBusyError, RunLockError, hold
from tests.conftest import REPO, run_cli, tiny_overrides


def test_a_second_holder_is_refused_with_the_first_ones_name(tmp_path):
    with hold(tmp_path / "run"):
        who = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert who["pid"] == os.getpid() and who["host"] == socket.gethostname()
        for _ in range(2):  # a refused attempt leaves the holder's name in place for the next one
            with pytest.raises(RunBusyError, match=f"is being run by pid {os.getpid()} on {socket.gethostname()} "):
                with hold(tmp_path / "run"):
                    pass
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text()) == who
    with hold(tmp_path / "run"):  # released: taken again
        pass


def test_a_lock_that_cannot_be_taken_at_all_is_one_error_naming_it(tmp_path):
    (tmp_path / "run" / LOCK_NAME).mkdir(parents=True)  # a folder where the lock file goes
    with pytest.raises(RunLockError, match=f"^cannot lock {tmp_path / 'run' / LOCK_NAME}: Is a directory; nothing "
                                           "was run$"):
        with hold(tmp_path / "run"):
            pass


HOLD_FOR = ("import sys, time; from experiments.run_lock import hold\n"
            "with hold(sys.argv[1]):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n")


def _holding_process(run_dir, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD_FOR, str(run_dir), str(seconds)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _wait_for_lock(run_dir, limit=60.0):
    """(time.monotonic() when `hold(run_dir, wait=True)` got the lock, the lock file's content then); the wait runs
    in a thread so that one which never ends fails after `limit` seconds instead of hanging the tests."""
    out = {}

    def waiter():
        try:
            with hold(run_dir, wait=True):
                out["at"] = time.monotonic()
                out["who"] = json.loads((run_dir / LOCK_NAME).read_text())
        except BaseException as exc:  # reported by the test below
            out["error"] = exc

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"hold(wait=True) did not get the lock within {limit} s"
    assert "error" not in out, out.get("error")
    return out["at"], out["who"]


@pytest.mark.slow
def test_waiting_takes_the_lock_when_the_holder_finishes(tmp_path):
    proc = _holding_process(tmp_path / "run", 1.5)
    held_at = time.monotonic()
    try:
        with pytest.raises(RunBusyError, match=f"pid {proc.pid}"):
            with hold(tmp_path / "run"):
                pass
        at, who = _wait_for_lock(tmp_path / "run")
        assert at - held_at >= 1.4 and who["pid"] == os.getpid()  # only once the holder let go
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_waiting_takes_the_lock_of_a_holder_killed_meanwhile(tmp_path):
    proc = _holding_process(tmp_path / "run", 600)
    held_at = time.monotonic()
    threading.Timer(1.0, proc.send_signal, (signal.SIGKILL,)).start()
    try:
        at, who = _wait_for_lock(tmp_path / "run")
        assert at - held_at >= 0.9 and who["pid"] == os.getpid()
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    proc = _holding_process(tmp_path / "run", 60)
    try:
        with pytest.raises(RunBusyError, match=f"pid {proc.pid}"):
            with hold(tmp_path / "run"):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with hold(tmp_path / "run"):  # the file still names the killed process: the lock, not the name, decides
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()


@pytest.mark.slow
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


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_holder_exits_4_and_writes_no_record(tiny_backbone_dir, tiny_benchmark_dir,
                                                                           tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments.job import run_id_for

    args = ["method=base", "wait_if_running=true",
            *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache")]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        run_dir = tmp_path / "runs" / run_id_for(compose("config", overrides=args))
    holder = _holding_process(run_dir, 120)
    since = json.loads((run_dir / LOCK_NAME).read_text())["started"]
    try:
        waiter = subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        said = waiter.stdout.readline()
        assert said.strip() == (f"[run] {run_dir} is being run by pid {holder.pid} on {socket.gethostname()} "
                                f"(since {since}); waiting for it to finish (wait_if_running=true)"), said
        waiter.send_signal(signal.SIGTERM)
        _, err = waiter.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert waiter.returncode == 4, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"interrupted: SIGTERM while waiting for pid {holder.pid} on "
                                            f"{socket.gethostname()} (since {since}) to finish {run_dir}; no record "
                                            "written; the same command resumes the run")
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", LOCK_NAME]
