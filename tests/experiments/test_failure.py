"""The record of a run that stopped: when even it cannot be written (a full disk), one stderr line names both that
and the run's own cause, and the run's own exception is what propagates."""

import errno

import pytest

from experiments import failure, records


class Logger:
    closed = None

    def close(self, code):
        self.closed = code


def test_a_full_disk_does_not_bury_why_the_run_stopped(tmp_path, monkeypatch, capsys):
    def no_space(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "atomic_write_json", no_space)
    base = {"run_id": "r", "status": "running", "started": "2026-01-01T00:00:00+00:00"}
    logger = Logger()
    with pytest.raises(ValueError, match="the real cause"):
        with failure.failure_guard(tmp_path, base, logger):
            failure.set_phase("train")
            raise ValueError("the real cause")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: could not write the failed record in {tmp_path} (No space left on device); the run "
                   "stopped because: ValueError: the real cause"]
    assert logger.closed == 1


def test_a_failure_record_names_its_phase(tmp_path):
    base = {"run_id": "r", "status": "running", "started": "2026-01-01T00:00:00+00:00"}
    with pytest.raises(RuntimeError):
        with failure.failure_guard(tmp_path, base, Logger()):
            failure.set_phase("prepare")
            raise RuntimeError("boom")
    rec = records.read_record(tmp_path)
    assert rec["status"] == "failed" and rec["phase"] == "prepare" and rec["error"]["message"] == "boom"
