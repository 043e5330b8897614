"""The record of a run that did not complete: `failed` with the traceback, or `interrupted` after a signal
(SIGTERM/SIGUSR2 during training, Ctrl-C anywhere), each naming the phase the run was in (`set_phase`)."""

from __future__ import annotations

import errno
import logging
import traceback
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from experiments import records
from experiments.checkpoints import checkpoint_paths, step_of
from experiments.closed_output import say
from experiments.log import FILE_ONLY
from experiments.signals import SignalInterrupt, interrupts_recorded
from experiments.train import Preempted
from suite_schema import layout

log = logging.getLogger("suite.run")
_PHASE = {"name": "start"}


def set_phase(name: str) -> None:
    """What the run is doing now (`load`, `prepare`, `train`, `evaluate`): a failure or interruption names it."""
    _PHASE["name"] = name


def _last_checkpoint_step(run_dir: Path):
    checkpoints = checkpoint_paths(run_dir)
    return step_of(checkpoints[-1]) if checkpoints else None


@contextmanager
def failure_guard(run_dir: Path, base_record: dict, logger: Any) -> Iterator[None]:
    """Record any exception (status failed, with traceback; or interrupted after a signal) and always close the logger."""
    exit_code = 0
    set_phase("start")
    try:
        with interrupts_recorded():
            yield
    except Preempted as exc:
        exit_code = 1
        _write_outcome(run_dir, {**base_record, "status": layout.STATUS_INTERRUPTED, "phase": _PHASE["name"],
                                 "interrupted": {"step": exc.step, "reason": str(exc)}}, exc)
        raise
    except (SystemExit, KeyboardInterrupt, SignalInterrupt) as exc:
        # A signal ended the process: submitit's handler on USR2 after the loop's checkpoint (the job was requeued
        # and resumes), or Ctrl-C. Either way the run is interrupted, not failed; it resumes from its last checkpoint.
        exit_code = 1
        if isinstance(exc, KeyboardInterrupt):
            why = "SIGINT (Ctrl-C)"
        elif isinstance(exc, SignalInterrupt):
            why = str(exc)
        else:
            why = f"exit({exc.code}): requeued (or stopped) by a signal handler"
        _write_outcome(run_dir, {**base_record, "status": layout.STATUS_INTERRUPTED, "phase": _PHASE["name"],
                                 "interrupted": {"step": _last_checkpoint_step(run_dir),
                                                 "reason": f"{why} during {_PHASE['name']}"}}, exc)
        raise
    except BaseException as exc:
        exit_code = 1
        log.error("failed: %s: %s\n%s", type(exc).__name__, exc, traceback.format_exc().rstrip(), extra=FILE_ONLY)
        _write_outcome(run_dir, {**base_record, "status": layout.STATUS_FAILED, "phase": _PHASE["name"],
                                 "error": _error_of(exc)}, exc)
        raise
    finally:
        try:
            logger.close(exit_code)
        except Exception as exc:
            if not exit_code:
                raise
            # After a failure or a signal the logger's service may be gone already (a requeue kills the
            # job's processes): closing it must not hide why the run stopped.
            log.error("closing the logger failed after the run stopped: %s: %s", type(exc).__name__, exc)


def _error_of(exc: BaseException) -> dict:
    """The failed record's `error`: type, message, traceback, and for an OS error its errno by name (`ENOSPC`)."""
    error = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
    if isinstance(exc, OSError) and exc.errno is not None:
        error["errno"] = errno.errorcode.get(exc.errno, str(exc.errno))
    return error


def _write_outcome(run_dir: Path, record: dict, cause: BaseException) -> None:
    """Write the failed / interrupted record (with provenance). When even that cannot be written (a full disk),
    say so in one line on stderr together with the run's own cause, which the caller then raises: the write's
    error must not replace why the run stopped."""
    try:
        records.atomic_write_json(run_dir / layout.RECORD_NAME,
                                  {**record, "provenance": records.provenance(_started(record))})
    except OSError as exc:
        say(f"error: could not write the {record['status']} record in {run_dir} ({exc.strerror or exc}); "
            f"the run stopped because: {type(cause).__name__}: {str(cause) or '(no message)'}")


def _started(base_record: dict) -> datetime:
    return datetime.fromisoformat(base_record["started"])
