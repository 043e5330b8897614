"""One run at a time per run directory.

Two launches of the same run (a user pressing enter twice, two overlapping sweeps) would both train and
evaluate, and the record would be whichever finished last. `hold(run_dir)` takes an exclusive lock on
`<run_dir>/.run.lock` (`filelock.FileLock`: `fcntl.flock` on Unix) for as long as the run works and writes its
holder (host, pid, start time) into the file as soon as it has the lock; a second launch fails at once with
`RunBusyError` naming the holder, or waits for it with `wait_if_running=true` (trying again every 0.05 s; SIGTERM
or SIGUSR2 meanwhile raises `SignalInterrupt`, which `run.py` ends with the interrupted exit code, 4).
The operating system releases the lock when the holding process ends, however it ends (SIGKILL included), so
the lock of a dead process is never stale and is simply taken over (on local file systems; a network file
system needs working `flock` locks: where `flock` is missing, acquiring fails with the OS error rather than
falling back to filelock's marker-file lock, which a killed process would leave behind).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from experiments.signals import SignalInterrupt, interrupts_recorded

LOCK_NAME = ".run.lock"
log = logging.getLogger("suite.run")


class RunBusyError(RuntimeError):
    """Another live process holds the run directory's lock."""


class RunLockError(RuntimeError):
    """The run directory's lock cannot be taken at all (its path is a folder, the file system refuses it)."""


def _write_holder(fd: int) -> None:
    """Replace the lock file's content by this process's host, pid and start time (UTC, seconds), as JSON."""
    who = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                      "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    os.ftruncate(fd, 0)
    os.pwrite(fd, who.encode(), 0)


def holder(run_dir: Path) -> str:
    """'pid P on HOST (since T)': the last holder the run directory's lock file names, or 'another process' where
    it names none (the holder has the lock but has not written its name yet, or the file is not one of these)."""
    try:
        who = json.loads((Path(run_dir) / LOCK_NAME).read_text())
        return f"pid {who['pid']} on {who['host']} (since {who['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def is_held(run_dir: Path) -> bool:
    """Whether a live process holds `<run_dir>/.run.lock` now (tried without blocking and let go at once; a run
    directory without a lock file is not held, and none is created)."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextmanager
def hold(run_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold `<run_dir>/.run.lock` exclusively while the block runs (see the module docstring); with `wait`,
    block until the current holder ends instead of raising `RunBusyError`. A lock that cannot be taken at all (the
    path is a folder, the file system refuses) raises `RunLockError` naming it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    # The holder's name is written once the lock is held (on_acquired); filelock leaves the file's content to
    # the holder, so a refused launch reads it intact.
    lock = FileLock(path, on_acquired=_write_holder, fallback_to_soft=False, preserve_lock_file=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _acquire(lock, run_dir, wait)
    except Timeout:
        raise RunBusyError(f"{run_dir} is being run by {holder(run_dir)}; this launch stops "
                           "(wait_if_running=true waits for it to finish instead)") from None
    except OSError as exc:  # after Timeout, which is one
        raise RunLockError(f"cannot lock {path}: {exc.strerror or exc}; nothing was run") from None
    try:
        yield
    finally:
        lock.release()


def _acquire(lock: FileLock, run_dir: Path, wait: bool) -> None:
    """Take `lock` at once, or with `wait` after its holder ends (SIGTERM or SIGUSR2 meanwhile raise
    `SignalInterrupt` naming the holder); raises filelock's `Timeout` when it is held and `wait` is false."""
    try:
        lock.acquire(blocking=False)
        return
    except Timeout:
        if not wait:
            raise
    try:
        with interrupts_recorded():  # a SIGTERM while waiting ends the launch as interrupted, with no record
            log.info("%s is being run by %s; waiting for it to finish (wait_if_running=true)", run_dir, holder(run_dir))
            lock.acquire()
    except SignalInterrupt as exc:
        raise SignalInterrupt(exc.signum, f"while waiting for {holder(run_dir)} to finish {run_dir}; no record "
                                          "written") from None
