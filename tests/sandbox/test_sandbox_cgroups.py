"""Per-check cgroups: the kernel's interface on this machine (where it offers one), and the v2 file
protocol on a stand-in directory tree (a machine with cgroup v2 controllers is not always at hand)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import cgroups


@pytest.fixture(scope="module")
def support():
    found, reason = cgroups.detect()
    if found is None:
        pytest.skip(f"this machine offers no writable cgroup with memory and pids controllers: {reason}")
    return found


@pytest.mark.sandbox
def test_a_group_bounds_what_joins_it_and_is_removed(support):
    group = support.create(96 << 20, 5)
    try:
        for path in group.paths:
            assert path.is_dir() and path.name.startswith(f"atlas-sandbox-{os.getpid()}-")
        memory = group.paths[0]
        limit_file = "memory.limit_in_bytes" if support.version == 1 else "memory.max"
        assert int((memory / limit_file).read_text()) == 96 << 20
        pids_dir = group.paths[1] if support.version == 1 else group.paths[0]
        assert (pids_dir / "pids.max").read_text().strip() == "5"
        if support.cpu:  # one CPU's worth per 100 ms period
            if support.version == 1:
                assert (group.paths[2] / "cpu.cfs_quota_us").read_text().strip() == "100000"
                assert (group.paths[2] / "cpu.cfs_period_us").read_text().strip() == "100000"
            else:
                assert (group.paths[0] / "cpu.max").read_text().split() == ["100000", "100000"]
        fds = group.open_procs()
        # A child joins through the inherited descriptors (as the bootstrap does), then forks until refused.
        code = (
            "import os, sys, time\n"
            f"for fd in {fds!r}:\n    os.write(fd, b'0')\n"
            "started = 0\n"
            "for _ in range(20):\n"
            "    try:\n"
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "        started += 1\n"
            "    except OSError:\n        break\n"
            "print(started, flush=True)\n"
            "time.sleep(30)\n"
        )
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", code], pass_fds=fds, stdout=subprocess.PIPE, text=True)
        for fd in fds:
            os.close(fd)
        started = int(proc.stdout.readline())
        assert started == 4  # 5 tasks in all: the child and four of its own
        assert proc.pid in group.pids() and len(group.pids()) == 5
        group.kill()
        proc.wait(timeout=10)
        assert group.pids() == []
    finally:
        group.remove()
    assert not any(path.exists() for path in group.paths)


@pytest.mark.sandbox
def test_memory_over_the_group_limit_is_an_oom_kill_with_a_peak(support):
    group = support.create(64 << 20, 16)
    try:
        fds = group.open_procs()
        code = f"import os\nfor fd in {fds!r}:\n    os.write(fd, b'0')\nblock = bytearray(200 << 20)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\n"
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], pass_fds=fds, capture_output=True, timeout=60)
        for fd in fds:
            os.close(fd)
        assert proc.returncode == -9, proc
        assert group.oom_kills() >= 1
        peak = group.peak_bytes()
        assert peak is None or peak <= (64 << 20) + (1 << 20)
    finally:
        group.remove()


@pytest.mark.sandbox
def test_the_processes_of_a_group_share_one_cpu(support):
    """Four busy processes, each in a session of its own (a scheduler autogroup each), get the group's quota between them.

    Half a CPU, so that the group runs into its quota even when other work holds a core of this machine."""
    if not support.cpu:
        pytest.skip(f"no cpu controller here: {support.describe()}")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a quota of one CPU bounds nothing here")
    group = support.create(512 << 20, 16, cpus=0.5)
    try:
        fds = group.open_procs()
        code = (
            "import os, time\n"
            f"for fd in {fds!r}:\n    os.write(fd, b'0')\n"
            "for _ in range(4):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        t = time.monotonic()\n"
            "        while time.monotonic() - t < 1.5:\n            pass\n"
            "        os._exit(0)\n"
            "for _ in range(4):\n    os.wait()\n"
            "c = os.times()\n"
            "print(c.children_user + c.children_system, flush=True)\n"
        )
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], pass_fds=fds, capture_output=True, text=True, timeout=60)
        wall = time.monotonic() - start
        for fd in fds:
            os.close(fd)
        cpu = float(out.stdout)
        # 4 x 1.5 s of spinning: unbounded, every CPU of the machine; bounded, half a CPU-second per second of wall time.
        assert cpu <= 0.6 * wall, (cpu, wall)
        assert group.throttled_seconds() > 0.3
    finally:
        group.remove()


def test_the_v2_file_protocol(tmp_path):
    parent = tmp_path / "cgroup"
    parent.mkdir()
    support = cgroups.CgroupSupport(2, (parent,), cpu=True)
    group = support.create(1 << 30, 64, cpus=1.5)
    (path,) = group.paths
    assert (path / "memory.max").read_text() == str(1 << 30) and (path / "pids.max").read_text() == "64"
    assert (path / "cpu.max").read_text() == "150000 100000"
    (path / "cpu.stat").write_text("usage_usec 10\nthrottled_usec 2500000\n")
    assert group.throttled_seconds() == 2.5
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (path / "memory.peak").write_text("12345\n")
    (path / "cgroup.procs").write_text("")
    assert group.oom_kills() == 2 and group.peak_bytes() == 12345 and group.pids() == []
    assert "cgroup v2" in support.describe()
    for name in ("memory.max", "pids.max", "cpu.max", "cpu.stat", "memory.events", "memory.peak", "cgroup.procs"):
        (path / name).unlink()
    group.remove()
    assert not path.exists()


def test_names_left_by_an_earlier_process_of_the_same_pid_are_skipped(tmp_path):
    parent = tmp_path / "cgroup"
    parent.mkdir()
    support = cgroups.CgroupSupport(2, (parent,))
    first = support.create(1 << 20, 4)
    taken = first.paths[0]
    # A stale group of this pid with the next counter value: the next group gets another name.
    counter = int(taken.name.rsplit("-", 1)[1])
    stale = parent / f"atlas-sandbox-{os.getpid()}-{counter + 1}"
    stale.mkdir()
    second = support.create(1 << 20, 4)
    assert second.paths[0] not in (taken, stale) and second.paths[0].is_dir()


def test_stale_groups_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    time.sleep(0.05)
    stale = tmp_path / f"atlas-sandbox-{dead.pid}-0"
    live = tmp_path / f"atlas-sandbox-{os.getpid()}-999999"
    other = tmp_path / "something-else"
    for path in (stale, live, other):
        path.mkdir()
    if Path(f"/proc/{dead.pid}").exists():
        pytest.skip("the pid was reused already")
    cgroups._remove_stale((tmp_path,))
    assert not stale.exists() and live.exists() and other.exists()
