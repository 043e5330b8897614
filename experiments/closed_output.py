"""Output whose reader has gone (`python run.py | head -1`): the run goes on, its console goes quiet.

Writing to a pipe whose reader exited raises `BrokenPipeError` (Python ignores SIGPIPE), and so does Python's own
flush of `sys.stdout` at exit ("Exception ignored ... BrokenPipeError", exit status 120). Following Python's
signal docs (Note on SIGPIPE), the closed stream's file descriptor is pointed at os.devnull at the first failure:
every later write, and the flush at exit, then succeed and go nowhere. run.log is a file and unaffected.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Callable, Optional, TextIO


def is_closed_error(exc: BaseException) -> bool:
    """True for the errors of writing to an output that is gone: a broken pipe (EPIPE), a closed file object."""
    if isinstance(exc, OSError):
        return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE
    return isinstance(exc, ValueError) and "closed" in str(exc)


def silence(stream: Any) -> None:
    """Point `stream`'s file descriptor at os.devnull, so that later writes and Python's flush at exit go nowhere
    instead of raising (no-op for a stream without a descriptor, e.g. captured output)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class QuietWhenClosed:
    """A text stream that passes writes to `stream` until its reader is gone, then silences it, calls `on_close`
    once and writes nothing more (`closed_output`: whether that happened). Other attributes (`isatty`, `fileno`,
    ...) are `stream`'s."""

    def __init__(self, stream: TextIO, on_close: Optional[Callable[[], None]] = None) -> None:
        self.stream = stream
        self.on_close = on_close
        self.closed_output = False

    def _guard(self, action: str, *args: Any) -> None:
        if self.closed_output:
            return
        try:
            getattr(self.stream, action)(*args)
        except (OSError, ValueError) as exc:
            if not is_closed_error(exc):
                raise
            self.closed_output = True
            silence(self.stream)
            if self.on_close is not None:
                self.on_close()

    def write(self, text: str) -> None:
        self._guard("write", text)

    def flush(self) -> None:
        self._guard("flush")

    def __getattr__(self, name: str) -> Any:
        if name == "stream":  # not set yet (a copy under construction): no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)


def say(text: str, file: Any = None) -> None:
    """`print(text, file=file, flush=True)` (default `sys.stderr`) that writes nothing where the output is gone."""
    stream = file if file is not None else sys.stderr
    if stream is None:  # Python started with that descriptor closed
        return
    out = QuietWhenClosed(stream)
    out.write(text + "\n")
    out.flush()


def flush_quietly() -> None:
    """Flush `sys.stdout` and `sys.stderr`, silencing either whose reader has gone (call before exiting)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            QuietWhenClosed(stream).flush()
