"""SIGTERM and SIGUSR2 as an exception where nothing else handles them: `interrupts_recorded` makes them raise
`SignalInterrupt`, which `run.py` ends with the interrupted exit code (4)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SignalInterrupt(BaseException):
    """SIGTERM or SIGUSR2 arrived outside training, where no other handler takes it (a BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it). `context` says what the process was
    doing (the message is `<SIGNAL> <context>`)."""

    def __init__(self, signum: int, context: str = "") -> None:
        super().__init__(f"{signal.Signals(signum).name} {context}".strip())
        self.signum = signum


def _raise_interrupt(signum, frame) -> None:
    raise SignalInterrupt(signum)


@contextmanager
def interrupts_recorded() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGUSR2 raise `SignalInterrupt` where nothing else handles them (their
    handler is the default, i.e. not under submitit, which ignores SIGTERM and requeues on SIGUSR2 itself); the
    training loop installs its own checkpointing handlers over these and restores them after."""
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGUSR2):
            if signal.getsignal(signum) == signal.SIG_DFL:
                installed[signum] = signal.signal(signum, _raise_interrupt)
    try:
        yield
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)
