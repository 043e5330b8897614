"""The record of a run that did not complete: `failed` with the traceback, or `interrupted` after a signal."""

from __future__ import annotations

import logging
import traceback
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from experiments import records
from experiments.log import FILE_ONLY
from experiments.train import Preempted, checkpoint_paths

log = logging.getLogger("suite.run")


@contextmanager
def failure_guard(run_dir: Path, base_record: dict, logger: Any) -> Iterator[None]:
    """Record any exception (status failed, with traceback; or interrupted after a signal) and always close the logger."""
    exit_code = 0
    try:
        yield
    except Preempted as exc:
        exit_code = 1
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_INTERRUPTED, "interrupted": {"step": exc.step, "reason": str(exc)},
             "provenance": records.provenance(_started(base_record))},
        )
        raise
    except SystemExit as exc:
        # A signal handler ended the process, e.g. submitit's on USR2 after the loop's checkpoint: the
        # job was requeued and resumes, so the run is interrupted, not failed.
        exit_code = 1
        checkpoints = checkpoint_paths(run_dir)
        step = int(checkpoints[-1].stem.split("_")[1]) if checkpoints else None
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_INTERRUPTED,
             "interrupted": {"step": step, "reason": f"exit({exc.code}) during the run: requeued (or stopped) by a signal handler"},
             "provenance": records.provenance(_started(base_record))},
        )
        raise
    except BaseException as exc:
        exit_code = 1
        log.error("failed: %s: %s\n%s", type(exc).__name__, exc, traceback.format_exc().rstrip(), extra=FILE_ONLY)
        records.atomic_write_json(
            run_dir / records.RECORD_NAME,
            {**base_record, "status": records.STATUS_FAILED,
             "error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()},
             "provenance": records.provenance(_started(base_record))},
        )
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


def _started(base_record: dict) -> datetime:
    return datetime.fromisoformat(base_record["started"])
