"""One cgroup per checked solution: its memory, its process count and its CPU bounded in total.

Resource limits (RLIMIT_AS, RLIMIT_NPROC) bound each process, so a solution that starts 64
processes of 1 GB each could hold 64 GB. A cgroup bounds everything the solution starts
together: ``memory`` (``memory.limit_in_bytes`` in cgroup v1, ``memory.max`` in v2; page cache,
tmpfs files and kernel memory included), ``pids`` (``pids.max``) and, where the ``cpu``
controller is there too, CPU time (``cpu.cfs_quota_us`` in v1, ``cpu.max`` in v2: one CPU's worth
per period, however many processes or sessions the solution starts; a process in a cpu cgroup is
also out of reach of the scheduler's per-session autogroups). The solution's bootstrap
joins the group through a ``cgroup.procs`` file that this process opened, before any of the
solution's code runs, so every process it starts is born inside.

Written here rather than taken from a library: what is needed is five file writes per group
(the kernel's cgroup interface), and the maintained tools that do it (systemd-run, cgcreate)
are not present on every machine, need a running systemd or are themselves unmaintained.

Where the machine offers no writable cgroup with both controllers (a container without
delegation, a non-root user without systemd delegation), :func:`detect` says why and the
sandbox falls back to the per-process limits (``docs/sandbox.md``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupSupport", "ProgramCgroup", "detect"]

_PREFIX = "atlas-sandbox"
_CPU_PERIOD_US = 100_000
_counter = itertools.count()
_lock = threading.Lock()


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-program cgroups are made: ``version`` 1 (one directory per controller) or 2."""

    version: int
    parents: tuple[Path, ...]  # v1: (memory parent, pids parent[, cpu parent]); v2: (parent,)
    cpu: bool = False  # the cpu controller is there: each group gets a CPU quota

    def describe(self) -> str:
        where = ", ".join(str(p) for p in self.parents)
        controllers = "memory, pids and cpu controllers" if self.cpu else "memory and pids controllers; no cpu controller"
        return f"cgroup v{self.version} ({controllers}) under {where}"

    def create(self, memory_bytes: int, max_processes: int, cpus: float = 1.0) -> "ProgramCgroup":
        """A new empty group with these limits (removed by :meth:`ProgramCgroup.remove`).

        ``cpus``: CPU time per period, in CPUs (1.0: one CPU's worth), where :attr:`cpu` holds.
        """
        while True:
            with _lock:
                name = f"{_PREFIX}-{os.getpid()}-{next(_counter)}"
            paths = tuple(parent / name for parent in self.parents)
            if not any(path.exists() for path in paths):  # one left by an earlier process of this pid
                break
        group = ProgramCgroup(self.version, paths)
        try:
            for path in paths:
                path.mkdir()
            quota = max(1000, int(cpus * _CPU_PERIOD_US))
            if self.version == 1:
                memory, pids = paths[:2]
                if self.cpu:
                    _write(paths[2] / "cpu.cfs_period_us", _CPU_PERIOD_US)
                    _write(paths[2] / "cpu.cfs_quota_us", quota)
                _write(memory / "memory.limit_in_bytes", memory_bytes)
                if (memory / "memory.memsw.limit_in_bytes").exists():
                    with contextlib.suppress(OSError):  # no swap accounting: nothing to bound
                        _write(memory / "memory.memsw.limit_in_bytes", memory_bytes)
                _write(pids / "pids.max", max_processes)
            else:
                (path,) = paths
                _write(path / "memory.max", memory_bytes)
                if (path / "memory.swap.max").exists():
                    with contextlib.suppress(OSError):
                        _write(path / "memory.swap.max", 0)
                _write(path / "pids.max", max_processes)
                if self.cpu:
                    _write(path / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
        except BaseException:
            group.remove()
            raise
        return group


@dataclass(frozen=True)
class ProgramCgroup:
    """The cgroup(s) of one checked solution."""

    version: int
    paths: tuple[Path, ...]

    def open_procs(self) -> list[int]:
        """File descriptors of each ``cgroup.procs``, open for writing (the bootstrap writes "0")."""
        fds: list[int] = []
        try:
            for path in self.paths:
                fds.append(os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _memory(self) -> Path:
        return self.paths[0]

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the group's memory limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self._memory() / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int | None:
        """The group's peak memory use in bytes (None where the kernel does not report it)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self._memory() / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def throttled_seconds(self) -> float:
        """How long the group was held back by its own CPU quota, in seconds (0.0 without a cpu controller)."""
        path = self.paths[2] if self.version == 1 and len(self.paths) > 2 else self.paths[0] if self.version == 2 else None
        if path is None:
            return 0.0
        try:
            text = (path / "cpu.stat").read_text()
        except OSError:
            return 0.0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":  # v1, nanoseconds
                return int(value) / 1e9
            if key == "throttled_usec":  # v2, microseconds
                return int(value) / 1e6
        return 0.0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process still in the group (repeated until none is left, at most ~1 s)."""
        if self.version == 2 and (self.paths[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.paths[0] / "cgroup.kill", 1)
        deadline = time.monotonic() + 1.0
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def remove(self) -> None:
        """Kill what is left and remove the group (retried briefly while exiting tasks drain)."""
        self.kill()
        for path in self.paths:
            for attempt in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 49:
                        break
                    time.sleep(0.002)


def _write(path: Path, value: object) -> None:
    with open(path, "w") as fh:
        fh.write(str(value))


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, filesystem type, super options) of every cgroup mount of this process."""
    out = []
    with contextlib.suppress(OSError):
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fstype, _source, options = (right.split() + ["", "", ""])[:3]
                if fstype in ("cgroup", "cgroup2"):
                    out.append((left.split()[4], fstype, options.split(",")))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under '' its v2 path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _writable_parent(parent: Path) -> None:
    """Raise OSError unless a child group can be made and removed under ``parent``."""
    probe = parent / f"{_PREFIX}-{os.getpid()}-probe"
    with contextlib.suppress(FileExistsError):
        probe.mkdir()
    probe.rmdir()


def _remove_stale(parents: tuple[Path, ...]) -> None:
    """Remove empty groups left by processes that no longer exist (a killed evaluation)."""
    for parent in parents:
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                parts = entry.name.split("-")
                if not entry.name.startswith(_PREFIX + "-") or len(parts) < 4 or not parts[2].isdigit():
                    continue
                if not Path(f"/proc/{parts[2]}").exists():
                    with contextlib.suppress(OSError):
                        entry.rmdir()


def detect() -> tuple[CgroupSupport | None, str]:
    """Where per-program cgroups can be made here, or None and why not.

    Tries cgroup v2 first (the group this process is in must have, or be able to enable, the
    memory and pids controllers for its children), then v1 (memory and pids hierarchies,
    groups made below this process's own group in each). The cpu controller is used where it is
    there too (:attr:`CgroupSupport.cpu`), never required.
    """
    own = _own_paths()
    reasons = []
    mounts = _mounts()
    for point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        parent = Path(point + own[""])
        try:
            available = (parent / "cgroup.controllers").read_text().split()
            if not {"memory", "pids"} <= set(available):
                reasons.append(f"cgroup v2 at {parent}: the memory and pids controllers are not available there ({' '.join(available) or 'none'})")
                continue
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            missing = [c for c in ("memory", "pids") if c not in enabled]
            if missing:
                _write(parent / "cgroup.subtree_control", " ".join("+" + c for c in missing))
            _writable_parent(parent)
        except OSError as exc:
            reasons.append(f"cgroup v2 at {parent}: {exc.strerror or exc}")
            continue
        cpu = "cpu" in available
        if cpu and "cpu" not in enabled:
            try:
                _write(parent / "cgroup.subtree_control", "+cpu")
            except OSError:
                cpu = False
        _remove_stale((parent,))
        return CgroupSupport(2, (parent,), cpu), ""
    v1 = {}
    for point, fstype, options in mounts:
        for controller in ("memory", "pids", "cpu"):
            if fstype == "cgroup" and controller in options and controller in own:
                v1[controller] = Path(point + own[controller])
    if {"memory", "pids"} <= set(v1):
        try:
            for controller in ("memory", "pids"):
                _writable_parent(v1[controller])
        except OSError as exc:
            reasons.append(f"cgroup v1 at {v1['memory']}, {v1['pids']}: {exc.strerror or exc}")
        else:
            parents = (v1["memory"], v1["pids"])
            cpu = "cpu" in v1
            if cpu:
                try:
                    _writable_parent(v1["cpu"])
                    parents += (v1["cpu"],)
                except OSError:
                    cpu = False
            _remove_stale(parents)
            return CgroupSupport(1, parents, cpu), ""
    elif v1 or not reasons:
        reasons.append("no cgroup v1 hierarchy with both the memory and pids controllers is mounted")
    return None, "; ".join(reasons)
