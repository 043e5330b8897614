"""The time a process spends stopped (SIGSTOP, or Ctrl-Z's SIGTSTP, until SIGCONT), so that a run's training time
counts only the time it ran.

No clock leaves out the time a process is stopped while counting the time it waits for a device, and SIGSTOP cannot
be caught: a helper thread ticks every `TICK` seconds, and SIGCONT, written by Python's signal handler to the signal
wakeup fd, wakes it; the stop lasted from its last tick before the SIGCONT to the SIGCONT, to within `TICK`. (A
suspended machine needs nothing of this: `time.perf_counter` and `time.monotonic` do not count a suspend on Linux.)
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any

TICK = 0.05  # seconds between the helper thread's ticks: each stop is measured to within this
#: A gap between ticks longer than this is a stop when a SIGCONT ends it or follows it within `_PAIRING` seconds
#: (when the process continues, the thread's tick may come just before the signal's byte).
_GAP = 4 * TICK
_PAIRING = 1.0


class StoppedTime:
    """While the block runs, `seconds` adds up the time the process was stopped.

    Measured only in the main thread and where nothing else uses the signal wakeup fd (an asyncio loop would);
    elsewhere `seconds` stays 0 and `measured` is False. Any SIGCONT handler installed before is still called.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.measured = False
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._counted = threading.Event()  # set by the helper thread once it has handled a SIGCONT
        self._previous_handler: Any = None

    def __enter__(self) -> StoppedTime:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        try:
            previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            previous_fd = None
        if previous_fd != -1:  # taken by another owner (or not the main thread): leave it be
            if previous_fd is not None:
                signal.set_wakeup_fd(previous_fd)
            self._close_pipe()
            return self
        # The wakeup fd only hears signals that have a Python handler; SIGCONT still continues the process.
        self._previous_handler = signal.signal(signal.SIGCONT, self._on_continue)
        self.measured = True
        self._thread = threading.Thread(target=self._watch, name="stopped-time", daemon=True)
        self._thread.start()
        return self

    def _on_continue(self, signum: int, frame: Any) -> None:
        # Runs in the main thread right after the process continues: wait until the helper thread has counted the
        # stop, so that `seconds` read next (the training step that was stopped) already holds it.
        self._counted.wait(timeout=_PAIRING)
        self._counted.clear()
        if callable(self._previous_handler):
            self._previous_handler(signum, frame)

    def _watch(self) -> None:
        last = time.monotonic()
        long_gap, long_gap_end = 0.0, float("-inf")
        while not self._closing.is_set():
            readable, _, _ = select.select([self._read], [], [], TICK)
            now = time.monotonic()
            gap = now - last
            last = now
            if gap > _GAP:
                long_gap, long_gap_end = gap, now
            if readable and signal.SIGCONT in self._signals():
                if now - long_gap_end <= _PAIRING:
                    gap = max(gap, long_gap)
                long_gap, long_gap_end = 0.0, float("-inf")
                if gap > _GAP:  # the stop began somewhere in the tick before it: half of that tick is not counted
                    self.seconds += gap - TICK / 2
                self._counted.set()

    def _signals(self) -> set[int]:
        try:
            return set(os.read(self._read, 512))
        except BlockingIOError:
            return set()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._closing.set()
            self._thread.join()
            signal.set_wakeup_fd(-1)
            if self._previous_handler is not None:  # None: a handler installed outside Python, kept by C code
                signal.signal(signal.SIGCONT, self._previous_handler)
            self._close_pipe()

    def _close_pipe(self) -> None:
        os.close(self._read)
        os.close(self._write)
