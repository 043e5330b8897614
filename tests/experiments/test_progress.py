"""Progress bars: in place on a terminal; redirected, plain lines at most every PLAIN_INTERVAL_S (no `\\r` redraws
piling up in a log file)."""

import io
import time

from experiments import progress as P


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_redirected_output_gets_plain_lines_not_redraws(monkeypatch):
    monkeypatch.setattr(P, "PLAIN_INTERVAL_S", 0.05)
    out = io.StringIO()
    for _ in P.progress_bar(range(300), desc="train lora", file=out):
        time.sleep(0.001)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and 2 <= len(lines) <= 12, lines  # ~0.3 s of work at one line per 0.05 s
    assert lines[-1].startswith("train lora: 100%") and "300/300" in lines[-1]


def test_a_loss_set_every_step_does_not_force_a_line_per_step(monkeypatch):
    # the training loop calls set_postfix(loss=...) after every step; tqdm redraws on each call by default
    monkeypatch.setattr(P, "PLAIN_INTERVAL_S", 0.05)
    out = io.StringIO()
    bar = P.progress_bar(total=300, desc="train atlas", file=out)
    for step in range(300):
        time.sleep(0.001)
        bar.update(1)
        bar.set_postfix(loss=f"{1.0 / (step + 1):.4f}")
        bar.set_description("train atlas")
    bar.close()
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 12, len(lines)
    assert "300/300" in lines[-1] and "loss=0.0033" in lines[-1]


def test_a_terminal_gets_the_bar_redrawn_in_place():
    out = Terminal()
    for _ in P.progress_bar(range(50), desc="x", file=out, mininterval=0):
        pass
    assert "\r" in out.getvalue()


def test_a_disabled_bar_writes_nothing():
    out = io.StringIO()
    for _ in P.progress_bar(range(10), file=out, disable=True):
        pass
    assert out.getvalue() == ""


def test_a_redirected_bar_that_would_vanish_on_a_terminal_still_writes_its_last_state():
    # evaluation bars pass leave=False (on a terminal they clear when done); redirected, a bar shorter than
    # PLAIN_INTERVAL_S would otherwise leave only its 0% line, as if it had stalled
    out = io.StringIO()
    for _ in P.progress_bar(range(40), desc="greedy math", file=out, leave=False):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("greedy math:   0%") and lines[-1].startswith("greedy math: 100%"), lines
    assert "40/40" in lines[-1] and len(lines) == 2
