"""The run's log lines: `[run] ...`, `[train] ...`, `[atlas] ...` on stdout and in `<run_dir>/run.log`.

Every module logs through a child of the `suite` logger (`suite.run`, `suite.train`, ...); the tag
in brackets is the last part of its name. `console()` gives the `suite` logger its stdout handler
once per process (Hydra's own job logging is off: conf/config.yaml), and `run_log(run_dir)` adds
`run.log` for the duration of one run, with timestamps and, for a failure, the traceback.
`timed_phase` gives a long step without a progress bar its start line and its seconds; `quiet_console()` keeps an
entry point going when its output's reader has gone (`| head`, `experiments.closed_output`).
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from experiments.closed_output import QuietWhenClosed, is_closed_error, silence

ROOT = "suite"
RUN_LOG = "run.log"
#: Loggers of the suite's packages outside `experiments` whose lines a run prints and logs like its own.
FORWARDED = ("sandbox",)
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


class _Console(logging.StreamHandler):
    """A handler writing to whatever `sys.<name>` (stdout, stderr) is at the time (captured output, redirected
    streams). When its reader has gone (`| head`), the stream is silenced (`experiments.closed_output`), run.log says
    so once, and the run goes on."""

    def __init__(self, name: str = "stdout") -> None:
        self.name_of_stream = name
        super().__init__(getattr(sys, name))
        self._gone: list = []  # the streams found closed (kept, not their ids: an id can be reused)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is None or not is_closed_error(exc):
            super().handleError(record)
            return
        stream = self.stream
        if not any(s is stream for s in self._gone):
            self._gone.append(stream)
            silence(stream)
            _note_closed(self.name_of_stream)

    @property
    def stream(self):  # type: ignore[override]
        return getattr(sys, self.name_of_stream)

    @stream.setter
    def stream(self, value) -> None:
        pass


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "file_only", False)


def _note_closed(name: str) -> None:
    """Say in run.log (only there: no run.log open, nothing) that the console stopped."""
    if not any(isinstance(h, logging.FileHandler) for h in logging.getLogger(ROOT).handlers):
        return
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


class _ToSuite(logging.Handler):
    """Hands a record of another package's logger to the `suite` logger's handlers (console, run.log)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(ROOT).handle(record)


def console() -> logging.Logger:
    """The `suite` logger, with one stdout handler at INFO (added on first use); the loggers of `FORWARDED` go
    through it too (`[sandbox] ...` on stdout and in run.log)."""
    logger = logging.getLogger(ROOT)
    if not any(getattr(h, "_suite_console", False) for h in logger.handlers):
        handler = _Console("stdout")
        handler.setFormatter(TagFormatter())
        handler.addFilter(_ConsoleFilter())
        handler._suite_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for name in FORWARDED:
        other = logging.getLogger(name)
        if not any(isinstance(h, _ToSuite) for h in other.handlers):
            other.addHandler(_ToSuite())
        other.propagate = False  # else Hydra's root handler prints it a second time
    return logger


@contextmanager
def stderr_console() -> Iterator[logging.Logger]:
    """For the block, the `suite` logger's lines on stderr (unless it has its console already): for a command whose
    stdout is its result (a table, JSON) and whose long steps should still say what they do."""
    logger = logging.getLogger(ROOT)
    if any(getattr(h, "_suite_console", False) for h in logger.handlers):
        yield logger
        return
    handler = _Console("stderr")
    handler.setFormatter(TagFormatter())
    handler.addFilter(_ConsoleFilter())
    logger.addHandler(handler)
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


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


@contextmanager
def timed_phase(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log `<what> ...` as the block starts and `<what>: done in <seconds> s` as it ends: a long phase without a
    progress bar of its own is never silent, and its log says how long it took (seconds, wall clock)."""
    start = time.perf_counter()
    logger.info("%s ...", what)
    yield
    logger.info("%s: done in %.1f s", what, time.perf_counter() - start)
