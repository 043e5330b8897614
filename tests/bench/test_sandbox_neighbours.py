"""bench.sandbox_neighbours: every neighbour is a valid solution that keeps a CPU busy, and a short run reports verdicts."""

from __future__ import annotations

import json

import pytest

from bench import sandbox_neighbours


@pytest.mark.parametrize("name", sandbox_neighbours.NEIGHBOURS)
def test_every_neighbour_compiles(name):
    check = sandbox_neighbours.neighbour_check(name)
    compile(check.solution, name, "exec")
    compile(check.test, name, "exec")


def test_an_unknown_neighbour_is_refused_before_any_check():
    with pytest.raises(SystemExit, match="--only=nosuch is not allowed: names among setsid_forks"):
        sandbox_neighbours.main(["--only", "setsid_forks,nosuch"])


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_short_run_keeps_the_verdict_beside_a_spinner(tmp_path):
    out = tmp_path / "neighbours.json"
    sandbox_neighbours.main(["--only", "setsid_forks", "--ordinary", "3", "--slow-seconds", "0.5", "--out", str(out)])
    result = json.loads(out.read_text())
    row = result["neighbours"]["setsid_forks"]
    assert row["ordinary_passed"] == 3 and row["neighbour_status"] == "timeout"
    if result["cpu_bounded_in_total"]:
        assert row["slow_status"] == "passed", row
