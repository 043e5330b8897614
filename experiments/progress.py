"""Progress bars that suit where the output goes.

On a terminal, tqdm's bar redrawn in place. When the output is redirected (a log file, a SLURM job's output,
CI), tqdm's `\\r` redraws pile up in the file (53 kB for one 300-step training bar); there the same bar writes
a plain line at most every `PLAIN_INTERVAL_S` seconds, and its final state when it closes. Written by hand
because tqdm has no line mode: this only chooses tqdm's target and its redraw interval.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional, TextIO

from tqdm.auto import tqdm

from experiments.closed_output import QuietWhenClosed

#: Seconds between two progress lines when the output is not a terminal.
PLAIN_INTERVAL_S = 30.0


class PlainLines:
    """A file-like target for tqdm that writes each redraw as one plain line (empty redraws, i.e. clearing the
    bar, write nothing)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def library_bars_on_terminal_only() -> Iterator[None]:
    """For the block, transformers' own tqdm bars (`Loading weights`) only where stderr is a terminal: redirected,
    their `\\r` redraws would pile up in the log as one line; the caller logs the step instead."""
    # here, not at the top: drawing a bar does not need transformers (analysis and tools import this module)
    from transformers.utils import logging as hf_logging

    off = hf_logging.is_progress_bar_enabled() and not _is_terminal(sys.stderr)
    if off:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if off:
            hf_logging.enable_progress_bar()


def progress_bar(iterable: Optional[Iterable] = None, **kwargs: Any):
    """`tqdm(iterable, **kwargs)` on a terminal; elsewhere the same bar as plain lines every `PLAIN_INTERVAL_S`.
    Either way a bar whose output has gone (`2>&1 | head`) stops drawing and the loop goes on."""
    stream = kwargs.pop("file", None) or sys.stderr
    if stream is None:  # Python started with stderr closed: nowhere to draw
        kwargs["disable"], stream = True, sys.stdout
    stream = QuietWhenClosed(stream)
    if not kwargs.get("disable") and not _is_terminal(stream):
        # leave: a closing bar's last state is its one line saying it finished (clearing it would write nothing)
        kwargs.update(file=PlainLines(stream), mininterval=PLAIN_INTERVAL_S, maxinterval=PLAIN_INTERVAL_S,
                      dynamic_ncols=False, ncols=100, leave=True)
        return _plain_tqdm(tqdm)(iterable, **kwargs)
    kwargs["file"] = stream
    return tqdm(iterable, **kwargs)


def _plain_tqdm(base: type) -> type:
    """tqdm whose `set_postfix` / `set_description` wait for the next timed redraw: their default forced redraw
    would write one line per call (a training loop sets the loss every step)."""

    class PlainTqdm(base):
        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            super().set_postfix(ordered_dict, refresh=False, **kwargs)

        def set_description(self, desc=None, refresh=True):
            super().set_description(desc, refresh=False)

    return PlainTqdm
