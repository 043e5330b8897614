"""The run's log lines: `[run] ...`, `[train] ...`, `[atlas] ...` on stdout and in `<run_dir>/run.log`.

Every module logs through a child of the `suite` logger (`suite.run`, `suite.train`, ...); the tag
in brackets is the last part of its name. `console()` gives the `suite` logger its stdout handler
once per process (Hydra's own job logging is off: conf/config.yaml), and `run_log(run_dir)` adds
`run.log` for the duration of one run, with timestamps and, for a failure, the traceback.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from experiments.closed_output import QuietWhenClosed, is_closed_error, silence

ROOT = "suite"
RUN_LOG = "run.log"
#: `extra=FILE_ONLY` on a record keeps it out of the console (a traceback Python prints anyway).
FILE_ONLY = {"file_only": True}


class TagFormatter(logging.Formatter):
    """`[tag] message`, the tag being the last part of the logger's name (`suite.run` -> `run`)."""

    def __init__(self, timestamps: bool = False) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        tag = record.name.rsplit(".", 1)[-1]
        line = f"[{tag}] {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if self.timestamps:
            line = f"{self.formatTime(record, '%Y-%m-%d %H:%M:%S')} {line}"
        return line


class _Stdout(logging.StreamHandler):
    """A handler writing to whatever `sys.stdout` is at the time (captured output, redirected streams). When its
    reader has gone (`| head`), the stream is silenced (`experiments.closed_output`), run.log says so once, and the
    run goes on."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self._gone: list = []  # the streams found closed (kept, not their ids: an id can be reused)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is None or not is_closed_error(exc):
            super().handleError(record)
            return
        stream = sys.stdout
        if not any(s is stream for s in self._gone):
            self._gone.append(stream)
            silence(stream)
            _note_closed("stdout")

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def _note_closed(name: str) -> None:
    logging.getLogger(ROOT + ".run").warning(
        "%s is closed (its reader has gone): console output stops here; run.log keeps every line", name,
        extra=FILE_ONLY)


def quiet_console() -> None:
    """Make this process's `sys.stdout` and `sys.stderr` go quiet instead of raising once their reader has gone
    (`python run.py 2>&1 | head`; `experiments.closed_output`), for every writer: the log, tqdm bars (ours and
    libraries'), print. run.log notes when each closed. For an entry point (`run.py`), once, before any output."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, QuietWhenClosed):
            setattr(sys, name, QuietWhenClosed(stream, on_close=lambda name=name: _note_closed(name)))


def console() -> logging.Logger:
    """The `suite` logger, with one stdout handler at INFO (added on first use)."""
    logger = logging.getLogger(ROOT)
    if not any(getattr(h, "_suite_console", False) for h in logger.handlers):
        handler = _Stdout()
        handler.setFormatter(TagFormatter())
        handler.addFilter(_ConsoleFilter())
        handler._suite_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


@contextmanager
def run_log(run_dir: Path) -> Iterator[Path]:
    """Append every `suite` log line of the block to `<run_dir>/run.log` (created with the run directory)."""
    path = Path(run_dir) / RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(TagFormatter(timestamps=True))
    logger = console()
    logger.addHandler(handler)
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        handler.close()
