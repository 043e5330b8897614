"""One run at a time per run directory.

Two launches of the same run (a user pressing enter twice, two overlapping sweeps) would both train and
evaluate, and the record would be whichever finished last. `hold(run_dir)` takes an exclusive lock on
`<run_dir>/.run.lock` (`filelock.FileLock`: `fcntl.flock` on Unix) for as long as the run works and writes its
holder (host, pid, start time) into the file as soon as it has the lock; a second launch fails at once with
`RunBusyError` naming the holder, or waits for it with `wait_if_running=true` (trying again every 0.05 s).
The operating system releases the lock when the holding process ends, however it ends (SIGKILL included), so
the lock of a dead process is never stale and is simply taken over (on local file systems; a network file
system needs working `flock` locks: where `flock` is missing, acquiring fails with the OS error rather than
falling back to filelock's marker-file lock, which a killed process would leave behind).
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

LOCK_NAME = ".run.lock"


class RunBusyError(RuntimeError):
    """Another live process holds the run directory's lock."""


def _write_holder(fd: int) -> None:
    """Replace the lock file's content by this process's host, pid and start time (UTC, seconds), as JSON."""
    who = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                      "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    os.ftruncate(fd, 0)
    os.pwrite(fd, who.encode(), 0)


def _holder(path: Path) -> str:
    """'pid P on HOST (since T)' from the lock file at `path`, or 'another process' where it names none (the
    holder has the lock but has not written its name yet, or the file is not one of these)."""
    try:
        who = json.loads(path.read_text())
        return f"pid {who['pid']} on {who['host']} (since {who['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def hold(run_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold `<run_dir>/.run.lock` exclusively while the block runs (see the module docstring); with `wait`,
    block until the current holder ends instead of raising `RunBusyError`."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    # The holder's name is written once the lock is held (on_acquired); filelock leaves the file's content to
    # the holder, so a refused launch reads it intact.
    lock = FileLock(path, blocking=wait, on_acquired=_write_holder, fallback_to_soft=False, preserve_lock_file=True)
    try:
        lock.acquire()
    except Timeout:
        raise RunBusyError(f"{run_dir} is being run by {_holder(path)}; this launch stops "
                           "(wait_if_running=true waits for it to finish instead)") from None
    try:
        yield
    finally:
        lock.release()
