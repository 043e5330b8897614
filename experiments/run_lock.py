"""One run at a time per run directory.

Two launches of the same run (a user pressing enter twice, two overlapping sweeps) would both train and
evaluate, and the record would be whichever finished last. `hold(run_dir)` takes an exclusive `fcntl` lock on
`<run_dir>/.run.lock` for as long as the run works and writes its holder (host, pid, start time) into the
file; a second launch fails at once with `RunBusyError` naming the holder, or waits for it with
`wait_if_running=true`. The operating system releases the lock when the holding process ends, however it ends
(SIGKILL included), so the lock of a dead process is never stale and is simply taken over (on local file
systems; a network file system needs working `fcntl` locks).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

LOCK_NAME = ".run.lock"


class RunBusyError(RuntimeError):
    """Another live process holds the run directory's lock."""


@contextmanager
def hold(run_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold `<run_dir>/.run.lock` exclusively while the block runs (see the module docstring)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_NAME, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            fh.seek(0)
            try:
                who = json.loads(fh.read())
                holder = f"pid {who['pid']} on {who['host']} (since {who['started']})"
            except (ValueError, KeyError, TypeError):
                holder = "another process"
            raise RunBusyError(f"{run_dir} is being run by {holder}; this launch stops "
                               "(wait_if_running=true waits for it to finish instead)") from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
            fh.flush()
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
