"""Helpers of the sweep tests: parse the launcher's output, read records, ask sacct."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path


def sweep_lines(out: str) -> list[str]:
    """The launcher's own lines ([sweep] ...)."""
    return [line for line in out.splitlines() if line.startswith("[sweep]")]


def summary_rows(out: str) -> dict[str, tuple[str, str]]:
    """{label: (state, reason)} parsed from the printed sweep summary."""
    rows: dict[str, tuple[str, str]] = {}
    lines = sweep_lines(out)
    start = max(i for i, line in enumerate(lines) if line.startswith("[sweep] summary:"))
    last = None
    for line in lines[start + 1:]:
        m = re.match(r"\[sweep\]   (\S+(?: run)?)\s+([0-9a-f]{16})  (.*?)(?: \[slurm [^\]]+\])?$", line)
        if m:
            last = m.group(3)
            rows[last] = (m.group(1), "")
        elif last is not None and line.startswith("[sweep]       "):
            rows[last] = (rows[last][0], line.split(None, 1)[1].strip())
    return rows


def sweep_folder(out: str) -> Path:
    m = re.search(r"\[sweep\] summary written to (\S+)/summary.txt", out)
    assert m, out[-3000:]
    return Path(m.group(1))


def submitted_job(out: str) -> str:
    m = re.search(r"\[sweep\] submitted (\d+) job\(s\) to SLURM as job (\d+)", out)
    assert m, out[-3000:]
    return m.group(2)


def records_under(root: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(root.glob("*/record.json")):
        rec = json.loads(path.read_text())
        out[rec["run_id"]] = rec
    return out


def sacct(job_id: str, duplicates: bool = False, wait_final_s: float = 30.0, min_rows: int = 1) -> list[dict]:
    """sacct rows (JobID, State, ExitCode, Elapsed) of a job or array; waits (bounded) until at least
    `min_rows` are recorded and none is still running: the accounting daemon can lag a finished task."""
    cmd = ["sacct", "-n", "-X", "-P", "-o", "JobID,JobName,State,ExitCode,Elapsed", "-j", job_id]
    if duplicates:
        cmd.insert(1, "-D")
    deadline = time.time() + wait_final_s
    while True:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        rows = [dict(zip(("JobID", "JobName", "State", "ExitCode", "Elapsed"), line.split("|")))
                for line in out.splitlines() if line.strip()]
        if len(rows) >= min_rows and not any(r["State"] in ("PENDING", "RUNNING", "COMPLETING") for r in rows):
            return rows
        if time.time() > deadline:
            return rows
        time.sleep(1)


def format_sacct(rows: list[dict]) -> str:
    return "\n".join("|".join(r.values()) for r in rows)
