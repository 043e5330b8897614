"""Check one solution: its test and the solution itself in two sandboxed processes, the verdict
decided where the solution's code never runs.

For each :class:`Check` the parent starts two processes (``inside/boot.py``), each in its own
sandbox (``isolation.py``): the *test* process runs the benchmark's test code, the *solution*
process runs the model's code. They share nothing but two pipes that carry calls and return
values as plain data (``inside/wire.py``). Only the test process holds the pipe on which ``done``
is reported, and it reports it only when ``check`` has returned; the solution's process has its
own cgroup (memory and process count bounded in total), uid, PID namespace and filesystem view.
The parent waits on both with a wall-clock deadline and classifies the outcome
(:data:`STATUSES`).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from sandbox import isolation, syscall_filter
from sandbox.types import Check, ExecutionResult, SandboxLimits

_DRAIN_SECONDS = 0.5
#: How long the solution may take to exit after the test process has ended (its output and its
#: exit status arrive; then it is killed).
_SOLUTION_GRACE_SECONDS = 0.5
_STATUS_CAP = 1 << 16
_STDERR_TAIL = 2048


class _Capture:
    """Keeps the first ``cap`` bytes of a stream (and a short tail); drops the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail += chunk[-_STDERR_TAIL:]
        del self.tail[:-_STDERR_TAIL]

    def text(self) -> str:
        text = self.head.decode("utf-8", "replace")
        if self.total > len(self.head):
            text += f"\n[... {self.total - len(self.head)} more bytes dropped]"
        return text

    def last_line(self) -> str:
        lines = [ln for ln in self.tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""

    def events(self) -> dict[str, list[str]]:
        """First occurrence of each event; a 'setup' line after 'ready' is not a set-up failure."""
        out: dict[str, list[str]] = {}
        for line in bytes(self.head).decode("utf-8", "replace").splitlines():
            parts = line.split("\t")
            if not parts[0] or parts[0] in out or (parts[0] == "setup" and "ready" in out):
                continue
            out[parts[0]] = parts[1:]
        return out


class _Child:
    """One started sandboxed process and what the parent reads from it."""

    def __init__(self, role: str, proc: subprocess.Popen, status_r: int, payload: bytes, limits: SandboxLimits):
        self.role = role
        self.proc = proc
        self.status_r = status_r
        self.payload = memoryview(payload)
        self.out = _Capture(limits.max_output_bytes)
        self.err = _Capture(limits.max_output_bytes)
        self.status = _Capture(_STATUS_CAP)
        self.wait_status: int | None = None
        self.rusage = None
        self.pidfd: int | None = None
        self.killed_by_parent = False

    @property
    def done(self) -> bool:
        return self.wait_status is not None

    def cpu_seconds(self) -> float:
        return self.rusage.ru_utime + self.rusage.ru_stime if self.rusage is not None else 0.0


def _has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it (WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _reap(pid: int):
    while True:
        try:
            _, wait_status, rusage = os.wait4(pid, 0)
            return wait_status, rusage
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0, None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        pass
    found = []  # kernels without /proc/<pid>/task/<tid>/children: scan for the parent pid
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{entry.name}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    if int(fields[1]) == pid:
                        found.append(int(entry.name))
    return found


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _terminate(child: _Child) -> None:
    """Kill a running sandboxed process and reap it, leaving no orphan behind.

    The started process's own children go first: with bubblewrap that is the namespace's
    PID 1, whose death takes every process of the namespace with it, and bubblewrap reaps it
    and exits (killing bubblewrap first would leave that zombie to the host's init); without
    namespaces it is the supervisor. Then the rest of the process group, while the started
    process is still unreaped, then the reaping.
    """
    if child.done:
        return
    child.killed_by_parent = True
    pid = child.proc.pid
    for grandchild in _children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(grandchild, signal.SIGKILL)
    until = time.monotonic() + 1.0
    while time.monotonic() < until and not _has_exited(pid):
        time.sleep(0.002)
    _kill_group(pid)
    child.wait_status, child.rusage = _reap(pid)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _exit_of(child: _Child, events: dict) -> tuple[int | None, int | None]:
    """(exit code, signal) of the role's process, from its supervisor's report or the wait status."""
    info = events.get("exit")
    if info and len(info) == 2 and info[1].lstrip("-").isdigit():
        return (None, int(info[1])) if info[0] == "signal" else (int(info[1]), None)
    if child.wait_status is None:
        return None, None
    code = os.waitstatus_to_exitcode(child.wait_status)
    return (None, -code) if code < 0 else (code, None)


def _hint(reason: str, limits: SandboxLimits) -> str:
    if "[Errno 11]" in reason:
        return reason + f" (process limit {limits.max_processes})"
    if "[Errno 27]" in reason:
        return reason + f" (file size limit {limits.file_size_mb} MB)"
    if "[Errno 28]" in reason:
        return reason + f" (work directory tmpfs of {4 * limits.file_size_mb} MB)"
    if not limits.network and any(f"[Errno {n}]" in reason for n in (99, 101, 111, -2, -3)):
        return reason + " (no network in the sandbox: only a loopback interface of its own)"
    if "[Errno 30]" in reason:
        return reason + " (the filesystem outside the work directory is read-only)"
    return reason


def _solution_fate(child: _Child, events: dict, limits: SandboxLimits, oom_kills: int) -> tuple[str, str] | None:
    """Why the solution's process is gone, when that explains the failure; None otherwise."""
    code, signum = _exit_of(child, events)
    if child.killed_by_parent and "exit" not in events and not oom_kills:
        if child.cpu_seconds() >= limits.cpu_seconds:
            return "timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded"
        return "failed", "the solution stopped answering during a call (its process was still running)"
    if oom_kills:
        return "memory", (f"the solution's processes together exceeded the memory limit of {limits.memory_mb} MB "
                          f"(cgroup; {oom_kills} killed by the out-of-memory killer)")
    if signum is not None:
        name = _signal_name(signum)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and child.cpu_seconds() >= limits.cpu_seconds):
            return "timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded ({name})"
        if signum == signal.SIGXFSZ:
            return "killed", f"file size limit of {limits.file_size_mb} MB exceeded ({name})"
        return "killed", f"the solution was killed by {name}"
    if "ready" not in events and code is not None:
        tail = child.err.last_line()
        return "sandbox_error", f"the solution's sandbox exited with code {code} before it started" + (f": {tail}" if tail else "")
    if code is not None:
        return "failed", f"the solution's process exited with code {code} during a call"
    return None


def _classify(test: _Child, solution: _Child, timed_out: bool, limits: SandboxLimits, oom_kills: int) -> tuple[str, str]:
    t_ev, s_ev = test.status.events(), solution.status.events()
    for role, events, child in (("test", t_ev, test), ("solution", s_ev, solution)):
        if "setup" in events:
            return "sandbox_error", f"the {role}'s sandbox could not be set up: " + " ".join(events["setup"])
    if timed_out:
        return "timeout", f"wall-clock limit of {limits.wall_seconds:g} s exceeded"
    code, signum = _exit_of(test, t_ev)
    if "done" in t_ev and code == 0:
        return "passed", ""
    if "error" in t_ev:
        kind, _name, reason = (t_ev["error"] + ["", "", ""])[:3]
        if kind in ("test_load", "argument"):
            # The benchmark's own code failed, not the solution: never count it as a failed solution.
            return "sandbox_error", reason
        if kind in ("gone", "load", "memory"):
            fate = _solution_fate(solution, s_ev, limits, oom_kills)
            if fate is not None and (kind == "gone" or fate[0] in ("memory", "timeout", "killed", "sandbox_error")):
                return fate
        if kind == "memory":
            return "memory", f"{reason} (address-space limit {limits.memory_mb} MB)"
        return "failed", _hint(reason, limits)
    if signum is not None:
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and test.cpu_seconds() >= limits.cpu_seconds):
            return "timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded by the test ({_signal_name(signum)})"
        return "killed", f"the test was killed by {_signal_name(signum)}"
    if "ready" not in t_ev:
        tail = test.err.last_line()
        return "sandbox_error", f"the test's sandbox exited with code {code} before it started" + (f": {tail}" if tail else "")
    tail = test.err.last_line()
    return "failed", f"the test's process exited with code {code} before the end" + (f": {tail}" if tail else "")


def _spawn(plan: isolation.Plan, role: str, source: str, entry_point: str, limits: SandboxLimits, uid: int | None,
           fds: dict[str, int], cgroup_fds: list[int], stack: contextlib.ExitStack) -> _Child:
    if plan.mount_namespace:
        workdir, host_dir = isolation.WORKDIR_SANDBOX, None
    else:
        host_dir = tempfile.mkdtemp(prefix="atlas-sandbox-")
        stack.callback(_rmtree, host_dir)
        workdir = host_dir
        if uid is not None:
            os.chown(host_dir, uid, uid)
    max_processes = limits.max_processes
    if plan.count_user_processes:
        max_processes += _user_process_count(os.getuid())
    status_r, status_w = os.pipe()
    cfg = {
        "role": role,
        "entry_point": entry_point,
        "status_fd": status_w,
        "send_fd": fds["send"],
        "recv_fd": fds["recv"],
        "cgroup_fds": list(cgroup_fds),
        "uid": uid,
        "workdir": workdir,
        "make_workdir": host_dir is None,
        "pid_namespace": plan.pid_namespace,
        "no_new_privs_set": any(part.endswith("setpriv") for part in plan.prefix),
        "site_dirs": isolation.site_dirs(),
        "inside_dir": plan.inside_dir,
        "cpu_seconds": int(limits.cpu_seconds),
        "memory_bytes": int(limits.memory_mb) << 20,
        "file_size_bytes": int(limits.file_size_mb) << 20,
        "max_processes": int(max_processes),
        "max_message_bytes": int(limits.max_message_bytes),
        # Without bubblewrap to apply it, the bootstrap loads the filter itself.
        "seccomp": plan.seccomp if plan.bwrap is None else None,
    }
    blob = marshal.dumps(cfg)
    payload = len(blob).to_bytes(8, "big") + blob + source.encode("utf-8", "replace")
    env = isolation.scrubbed_env()
    if host_dir is not None:
        env.update(HOME=host_dir, TMPDIR=host_dir)
    seccomp_fd = None
    try:
        if plan.bwrap is not None and plan.seccomp is not None:
            seccomp_fd = syscall_filter.program_fd(plan.seccomp)
        proc = subprocess.Popen(
            plan.argv(limits.network and role == "solution", limits.file_size_mb, seccomp_fd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w, fds["send"], fds["recv"], *cgroup_fds, *([seccomp_fd] if seccomp_fd is not None else [])),
            start_new_session=True,
            env=env,
            cwd=host_dir or "/",
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    child = _Child(role, proc, status_r, payload, limits)
    stack.callback(_close_child, child)
    return child


def _close_child(child: _Child) -> None:
    _terminate(child)
    if child.pidfd is not None:
        with contextlib.suppress(OSError):
            os.close(child.pidfd)
    for stream in (child.proc.stdin, child.proc.stdout, child.proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    with contextlib.suppress(OSError):
        os.close(child.status_r)


def run_pair(plan: isolation.Plan, check: Check, limits: SandboxLimits) -> ExecutionResult:
    """Run ``check`` under ``plan``: the test and the solution, each in its own sandbox."""
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            uids = [stack.enter_context(isolation.lease_uid()) for _ in range(2)] if plan.lease_uid else [None, None]
            if uids[0] is not None and plan.mode == "setuid":
                for uid in uids:
                    stack.callback(_kill_uid, uid)
            group = None
            if plan.cgroups is not None:
                group = plan.cgroups.create(int(limits.memory_mb) << 20, int(limits.max_processes), cpus=1.0)
                stack.callback(group.remove)
            request_r, request_w = os.pipe()
            reply_r, reply_w = os.pipe()
            ends = [request_r, request_w, reply_r, reply_w]
            stack.callback(_close_fds, ends)
            cgroup_fds = group.open_procs() if group is not None else []
            stack.callback(_close_fds, cgroup_fds)
            test = _spawn(plan, "test", check.test, check.entry_point, limits, uids[0],
                          {"send": request_w, "recv": reply_r}, [], stack)
            solution = _spawn(plan, "solution", check.solution, check.entry_point, limits, uids[1],
                              {"send": reply_w, "recv": request_r}, cgroup_fds, stack)
            _close_fds(cgroup_fds)
            _close_fds(ends)  # only the two sandboxed processes hold the channel now
        except (OSError, RuntimeError) as exc:
            return ExecutionResult(False, "sandbox_error", f"sandbox set-up failed: {exc}", None, time.monotonic() - start)
        clock = _CheckClock(start, limits.wall_seconds, (test, solution))
        timed_out = _wait(test, solution, clock)
        if group is not None:
            group.kill()
        _terminate(solution)
        oom_kills = group.oom_kills() if group is not None else 0
        peak = group.peak_bytes() if group is not None else None
        status, reason = _classify(test, solution, timed_out, limits, oom_kills)
        if status == "timeout" and timed_out:
            reason += _clock_note(clock)
        s_code, s_signal = _exit_of(solution, solution.status.events())
        returncode = -signal.SIGKILL if timed_out else (s_code if s_signal is None else -s_signal)
        return ExecutionResult(status == "passed", status, reason, returncode, time.monotonic() - start,
                               solution.out.text(), solution.err.text(), peak)


def _clock_note(clock: _CheckClock) -> str:
    """What the clock measured at the deadline, for a timed-out check's reason: the extension it gave, and
    the CPU time its processes ran and their longest wait for a CPU, which tell a slow check from a starved one."""
    note = f" (plus {clock.waited:.1f} s it waited for a CPU that other work held)" if clock.waited > 0.05 else ""
    if clock.measured is not None:
        elapsed, ran, delay = clock.measured
        note += f" [at {elapsed:.2f} s: its processes ran {ran:.2f} s of CPU, longest wait for a CPU {delay:.2f} s]"
    return note


def _close_fds(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def _schedstat(pid: int) -> tuple[float, float] | None:
    """(CPU time of all its threads, longest time one of them waited runnable for a CPU) of ``pid``, in seconds
    (``/proc/<pid>/task/<tid>/schedstat``); None when it is gone."""
    ran = waited = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                fields = fh.read().split()
            ran += int(fields[0]) / 1e9
            waited = max(waited, int(fields[1]) / 1e9)
        except (OSError, ValueError, IndexError):
            continue
    return ran, waited


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(_children(current))
    return found


class _CheckClock:
    """The wall-clock deadline of one check, counting only the time the check was given a CPU.

    The limit is ``wall_seconds`` from the start, plus the time the check waited, runnable, for
    a CPU that other work held: the longest run delay of any of its threads
    (``/proc/<pid>/task/<tid>/schedstat``), but no more than the CPU time the check did not get in
    the time elapsed (elapsed less the CPU time its threads ran), so a check whose own processes or
    threads crowd each other (a spinner, a process pool past its CPU quota) gains nothing. Sleeping adds
    nothing either: a check that hangs still ends at ``wall_seconds``. The extension is capped at
    ``wall_seconds`` (no check runs past twice its limit) and measured only when the deadline is
    reached, so an unhindered check pays nothing for it.
    """

    def __init__(self, start: float, wall_seconds: float, children: tuple[_Child, ...]) -> None:
        self.start = start
        self.wall_seconds = wall_seconds
        self.children = children
        self.waited = 0.0
        self.deadline = start + wall_seconds
        self.measured: tuple[float, float, float] | None = None  # (elapsed, CPU ran, longest run delay), seconds

    def extend(self) -> bool:
        """Move the deadline by the CPU wait measured now; True when it moved."""
        stats = [st for child in self.children if not child.done for st in map(_schedstat, _tree(child.proc.pid)) if st]
        if not stats:
            return False
        elapsed = time.monotonic() - self.start
        ran = sum(ran for ran, _ in stats)
        delay = max(waited for _, waited in stats)
        self.measured = (elapsed, ran, delay)
        waited = min(delay, max(0.0, elapsed - ran), self.wall_seconds)
        if waited <= self.waited + 0.01:
            return False
        self.waited = waited
        self.deadline = self.start + self.wall_seconds + waited
        return True


def _wait(test: _Child, solution: _Child, clock: _CheckClock) -> bool:
    """Feed both processes their payloads, collect their output, wait for the test (True: timed out)."""
    children = (test, solution)
    sel = selectors.DefaultSelector()
    for child in children:
        with contextlib.suppress(AttributeError, OSError):
            child.pidfd = os.pidfd_open(child.proc.pid)
            sel.register(child.pidfd, selectors.EVENT_READ, (child, "exit"))
        os.set_blocking(child.proc.stdin.fileno(), False)
        sel.register(child.proc.stdin, selectors.EVENT_WRITE, (child, "stdin"))
        sel.register(child.proc.stdout, selectors.EVENT_READ, (child, child.out))
        sel.register(child.proc.stderr, selectors.EVENT_READ, (child, child.err))
        sel.register(child.status_r, selectors.EVENT_READ, (child, child.status))
    timed_out = False
    drain_until = None
    solution_deadline = None
    try:
        while True:
            for child in children:
                if not child.done and _has_exited(child.proc.pid):
                    # Still a zombie, so its pid (the process group's id) cannot have been reused.
                    _kill_group(child.proc.pid)
                    child.wait_status, child.rusage = _reap(child.proc.pid)
                if child.done and child.pidfd is not None:
                    sel.unregister(child.pidfd)
                    os.close(child.pidfd)
                    child.pidfd = None
            now = time.monotonic()
            if test.done and not solution.done:
                # The verdict is in. Give the solution a moment to end on its own (it sees the
                # test's end of file): its last output arrives, and after a failure its exit status
                # (a signal, a limit) can explain it. One that lingers is killed.
                if solution_deadline is None:
                    solution_deadline = now + _SOLUTION_GRACE_SECONDS
                elif now >= solution_deadline:
                    _terminate(solution)
            readers = [k for k in sel.get_map().values() if k.data[1] not in ("exit", "stdin")]
            if test.done and solution.done:
                if not readers:
                    break
                drain_until = drain_until or now + _DRAIN_SECONDS
            if not (test.done and solution.done) and now >= clock.deadline and not clock.extend():
                timed_out = True
                for child in children:
                    _terminate(child)
                drain_until = time.monotonic() + _DRAIN_SECONDS
                continue
            if drain_until is not None and now >= drain_until:
                break
            limit_at = min(x for x in (drain_until, clock.deadline, solution_deadline) if x is not None)
            timeout = max(0.0, limit_at - now)
            if any(c.pidfd is None and not c.done for c in children):
                timeout = min(timeout, 0.02)
            for key, _ in sel.select(timeout):
                child, what = key.data
                if what == "exit":
                    continue  # handled at the top of the loop
                if what == "stdin":
                    try:
                        sent = os.write(key.fd, child.payload[:65536])
                    except OSError:
                        sent = len(child.payload)
                    child.payload = child.payload[sent:]
                    if not child.payload:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    what.add(chunk)
                else:
                    sel.unregister(key.fileobj)
    finally:
        for child in children:
            if not child.done and timed_out:
                _terminate(child)
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
        sel.close()
    return timed_out


def _kill_uid(uid: int) -> None:
    """Kill every process of ``uid`` (setuid mode: processes that left the process group)."""
    code = "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\n"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", code], user=uid, group=uid, extra_groups=[], env={}, cwd="/", timeout=5
        )


def _user_process_count(uid: int) -> int:
    count = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def _rmtree(path: str) -> None:
    def fix(func, p, _exc):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        with contextlib.suppress(OSError):
            func(p)

    shutil.rmtree(path, onerror=fix)

