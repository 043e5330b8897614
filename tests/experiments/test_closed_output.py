"""A run whose output is closed early (`python run.py | head -1`, `... 2>&1 | head`) goes on to the end: exit code 0,
its record complete, every log line in run.log; the console just stops."""

import errno
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from experiments.closed_output import QuietWhenClosed, is_closed_error
from suite_schema.layout import RECORD_NAME
from tests.conftest import REPO, run_cli, tiny_overrides

LINES = 3000  # ~300 kB: well past a pipe's buffer, so most lines are written after the reader has gone

LOGGING = textwrap.dedent(f"""
    import logging, sys
    from pathlib import Path
    from experiments.log import console, run_log
    from experiments.progress import progress_bar
    console()
    log = logging.getLogger("suite.run")
    with run_log(Path(sys.argv[1])):
        bar = progress_bar(total={LINES}, desc="lines")
        for i in range({LINES}):
            log.info("line %05d %s", i, "x" * 90)
            bar.update(1)
        bar.close()
        log.info("done")
    print("after the run")
""")


def test_a_pipe_whose_reader_has_gone_is_pointed_at_devnull_once_and_later_writes_succeed():
    read_end, write_end = os.pipe()
    os.close(read_end)
    closes = []
    with open(write_end, "w", buffering=1) as raw:
        out = QuietWhenClosed(raw, on_close=lambda: closes.append(1))
        out.write("lost\n")  # line buffered: written (and failing) at once
        out.write("lost too\n")
        out.flush()
        assert out.closed_output and closes == [1]
        assert os.readlink(f"/proc/self/fd/{raw.fileno()}") == os.devnull
        raw.write("straight to the stream now succeeds\n")
        raw.flush()


def test_other_write_errors_still_raise():
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        QuietWhenClosed(Full()).write("x")
    assert is_closed_error(BrokenPipeError()) and is_closed_error(ValueError("I/O operation on closed file."))
    assert not is_closed_error(OSError(errno.ENOSPC, "full")) and not is_closed_error(ValueError("bad value"))
    closed = io.StringIO()
    closed.close()
    out = QuietWhenClosed(closed)
    out.write("x")  # a closed file object without a descriptor: nothing to silence, nothing raised
    assert out.closed_output


def piped_into_head(cmd: list[str], both: bool, tmp_path) -> tuple[int, str, bytes]:
    """Run `cmd` with stdout (and stderr when `both`) piped into `head -1`; (its exit code, its stderr, head's output)."""
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if both else err_file)
        head = subprocess.Popen(["head", "-1"], stdin=proc.stdout, stdout=subprocess.PIPE)
        proc.stdout.close()  # head holds the only reading end: when it exits, the pipe is closed
        shown, _ = head.communicate(timeout=300)
        code = proc.wait(timeout=300)
    return code, err.read_text(), shown


@pytest.mark.slow
@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_logging_into_a_closed_pipe_goes_on_and_run_log_gets_every_line(tmp_path, both):
    code, stderr, shown = piped_into_head([sys.executable, "-c", LOGGING, str(tmp_path / "run")], both, tmp_path)
    assert shown.startswith(b"[run] line 00000") or shown.startswith(b"lines:"), shown
    assert code == 0, stderr
    for noise in ("Traceback", "Exception ignored", "Logging error", "BrokenPipeError"):
        assert noise not in stderr, stderr
    logged = (tmp_path / "run" / "run.log").read_text().splitlines()
    assert len(logged) == LINES + 2, logged[-3:]  # every line, stdout's closing noted once, "done"
    assert logged[-1].endswith("[run] done")
    assert sum("stdout is closed" in line for line in logged) == 1


@pytest.mark.slow
def test_run_piped_into_head_completes_and_records_complete(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    args = ["method=lora", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache",
                                           **{"train.progress": "true"})]
    code, _, shown = piped_into_head([sys.executable, "run.py", *args], True, tmp_path)
    assert shown, "the run printed nothing"
    assert code == 0
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / RECORD_NAME).exists()]
    record = json.loads((run_dir / RECORD_NAME).read_text())
    assert record["status"] == "complete", record.get("error")
    logged = (run_dir / "run.log").read_text()
    assert "[result] pass@1" in logged and f"{record['run_id']}: complete; record" in logged
    # another seed on an open stdout: its run.log holds every line it printed there
    again = run_cli([*args, "seed=1"])
    assert again.returncode == 0, again.stderr[-3000:]
    (other,) = [d for d in (tmp_path / "runs").iterdir() if d != run_dir and (d / RECORD_NAME).exists()]
    logged = (other / "run.log").read_text().splitlines()
    for line in again.stdout.splitlines():
        assert any(entry.endswith(line) for entry in logged), line
