"""Sweep tests: launcher configs and the local launcher (always), and tests marked `slurm` that run
against the real single-node cluster of slurm/local_cluster.sh.

The `slurm` tests are collected only when the marker expression names them
(`python -m pytest -m slurm`, after `slurm/local_cluster.sh start`); a cluster that is not up
then fails them with a message that says how to start it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides

START_HINT = "start the local cluster first: slurm/local_cluster.sh start (as root)"


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: needs the local SLURM cluster (slurm/local_cluster.sh start); "
                                       "run with -m slurm")


def pytest_collection_modifyitems(config, items):
    if "slurm" in (config.getoption("markexpr") or ""):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("slurm") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def cluster() -> str:
    """The local cluster's partition, after checking that the controller answers and accounting works."""
    for tool in ("sbatch", "sacct", "scontrol"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: {START_HINT}")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        pytest.fail(f"slurmctld does not answer ({ping.stdout.strip()} {ping.stderr.strip()}): {START_HINT}")
    acct = subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], capture_output=True, text=True, timeout=30)
    if acct.returncode != 0:
        pytest.fail(f"sacct fails ({acct.stderr.strip()}): accounting (slurmdbd) is down; {START_HINT}")
    return "debug"


@pytest.fixture
def overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    """Tiny-budget overrides (tests/conftest.py) with the run root under this test's tmp folder."""
    def make(run_root: Path, **extra: str) -> list[str]:
        return tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, run_root, tmp_path / "cache", **extra)
    return make
