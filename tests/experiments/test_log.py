"""The run's log: a phase without a bar says when it starts and how long it took; the sandbox's lines are the run's
lines too (stdout and run.log); a command whose stdout is its result logs on stderr."""

import logging
import re
import time

import pytest

from experiments import log as L


@pytest.fixture
def loggers():
    """Restore the `suite` and forwarded loggers as they were (console() changes them for the whole process)."""
    names = (L.ROOT, *L.FORWARDED)
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate, logging.getLogger(n).level)
             for n in names}
    yield
    for n, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(n)
        logger.handlers[:] = handlers
        logger.propagate = propagate
        logger.setLevel(level)


def test_a_timed_phase_logs_its_start_and_its_seconds(loggers, capsys):
    L.console()
    with L.timed_phase(logging.getLogger("suite.eval"), "reference cache: building"):
        time.sleep(0.3)
    start, end = capsys.readouterr().out.splitlines()
    assert start == "[eval] reference cache: building ..."
    seconds = float(re.fullmatch(r"\[eval\] reference cache: building: done in (\d+\.\d) s", end).group(1))
    assert 0.3 <= seconds < 5


def test_sandbox_lines_go_to_stdout_and_run_log_once(loggers, capsys, tmp_path):
    with L.run_log(tmp_path):
        logging.getLogger("sandbox").warning("sandbox running in degraded mode %r", "plain")
    out = capsys.readouterr()
    assert out.out == "[sandbox] sandbox running in degraded mode 'plain'\n" and out.err == ""
    (line,) = (tmp_path / L.RUN_LOG).read_text().splitlines()
    assert line.endswith("[sandbox] sandbox running in degraded mode 'plain'")


def test_stderr_console_logs_on_stderr_for_the_block_only(loggers, capsys):
    logging.getLogger(L.ROOT).handlers[:] = [h for h in logging.getLogger(L.ROOT).handlers
                                             if not getattr(h, "_suite_console", False)]
    with L.stderr_console() as logger:
        logger.getChild("inspect").info("loading")
    logging.getLogger("suite.inspect").info("after the block")
    out = capsys.readouterr()
    assert out.err == "[inspect] loading\n" and out.out == ""


def test_a_closed_console_is_noted_in_run_log_only(loggers, caplog, tmp_path):
    # a command without run.log (atlas.inspect | head): no record at all, else Python's last-resort handler
    # would print the note on stderr
    with caplog.at_level(logging.DEBUG):
        L._note_closed("stdout")
    assert caplog.records == []
    with L.run_log(tmp_path):
        L._note_closed("stderr")
    (line,) = (tmp_path / L.RUN_LOG).read_text().splitlines()
    assert line.endswith("[run] stderr is closed (its reader has gone): console output stops here; run.log keeps "
                         "every line")
