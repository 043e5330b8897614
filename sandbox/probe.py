"""Which isolation mode works on this machine, and what it isolates there.

The mode is detected once per process: each candidate mode, best first (``isolation.MODES_ROOT``
for root, ``isolation.MODES_USER`` otherwise; only the mode named by ``ATLAS_SANDBOX_MODE`` when
that is set), runs a probe solution through the real check path (:func:`sandbox.run.run_pair`).
The first mode whose probe passes is used; the probe's observations (what it can see, write and
reach; whether the interpreter's imports work) make the isolation report
(:func:`sandbox.isolation_report`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path

from sandbox import isolation, syscall_filter
from sandbox.run import run_pair
from sandbox.types import Check, SandboxLimits

#: Named for where the sandbox lived before it became a package of its own, so that existing log
#: configurations keep selecting its warnings.
log = logging.getLogger("sandbox")


class SandboxUnavailable(RuntimeError):
    """No sandbox mode works on this machine (or the interpreter's imports would fail inside): no generated code can
    be checked here. The message names why each mode failed."""


_plan_lock = threading.Lock()
_plan: isolation.Plan | None = None
_report: dict | None = None
_plan_error: str | None = None


def detected_plan() -> isolation.Plan:
    """The plan of the best mode that works here, detected on first use; SandboxUnavailable when none works."""
    global _plan, _report, _plan_error
    if _plan is not None:
        return _plan
    with _plan_lock:
        if _plan is not None:
            return _plan
        if _plan_error is not None:
            raise SandboxUnavailable(_plan_error)
        forced = os.environ.get(isolation.MODE_ENV)
        modes = (forced,) if forced else (isolation.MODES_ROOT if os.geteuid() == 0 else isolation.MODES_USER)
        fallbacks: list[str] = []
        for mode in modes:
            try:
                plan = isolation.make_plan(mode)
                facts = probe(plan)
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to fall back
                fallbacks.append(f"mode {mode!r} unavailable: {type(exc).__name__}: {exc}")
                continue
            report = describe(plan, facts, fallbacks)
            if mode != modes[0] or not report["files_hidden"] or not report["network_isolated"]:
                log.warning("sandbox running in degraded mode %r (files hidden: %s, network isolated: %s): %s", mode,
                            report["files_hidden"], report["network_isolated"], "; ".join(fallbacks) or "forced")
            if not report["processes_limited"]:
                log.warning("sandbox runs solutions as root without a process limit: fork bombs are bounded only by the wall clock")
            if not report["memory_bounded_in_total"]:
                log.warning("sandbox memory is bounded per process only: %s", report["memory_limit"])
            if not report["syscall_filter_applied"]:
                log.warning("sandbox runs without its seccomp filter: %s", report["syscall_filter"])
            _report, _plan = report, plan
            return plan
        _plan_error = ("no sandbox mode works on this machine: " + "; ".join(fallbacks)
                       + " (scripts/install_sandbox.sh installs what the sandbox uses)")
        raise SandboxUnavailable(_plan_error)


def current_report() -> dict:
    """A copy of the isolation report of the detected plan (see :func:`sandbox.isolation_report`)."""
    detected_plan()
    assert _report is not None
    return json.loads(json.dumps(_report))


def reset() -> None:
    """Forget the detected plan: the next check detects again (tests switch modes through ATLAS_SANDBOX_MODE)."""
    global _plan, _report, _plan_error
    with _plan_lock:
        _plan = None
        _report = None
        _plan_error = None


# --------------------------------------------------------------------------------------------
# The probe: a solution that reports what it observes, run through the real check path


_PROBE = r'''
import ctypes, errno, importlib, importlib.util, json, os, socket

def probe():
    facts = {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd()}
    facts["keyctl_errno"] = None
    if KEYCTL_NR is not None:  # KEYCTL_GET_KEYRING_ID of the session keyring, creating nothing
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(KEYCTL_NR, 0, -3, 0) < 0:
            facts["keyctl_errno"] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
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
    for d in isolation.site_dirs():
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
    interp = isolation.interpreter_dirs()

    def targets(path: str) -> list[str]:
        if not any(d.startswith(path.rstrip("/") + "/") for d in interp):
            return [path]
        out = []
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(path))[:50]:
                out += targets(os.path.join(path, entry))
        return out

    roots = [str(isolation.PROJECT_ROOT), str(isolation.PROJECT_ROOT.parent / "shared"), str(Path.home()), os.getcwd()]
    roots += [os.environ[v] for v in ("ATLAS_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME") if os.environ.get(v)]
    paths = [p for root in roots if os.path.exists(root) for p in targets(os.path.realpath(root))]
    paths = [p for p in paths if os.path.exists(p) and not isolation.under(p, interp) and p != "/"]
    for data in isolation.benchmark_data_paths():  # the directory stays as the hiding mount's mount point
        with contextlib.suppress(OSError):
            paths += [os.path.join(data, entry) for entry in sorted(os.listdir(data))[:50]]
    return sorted(set(paths))


def probe(plan: isolation.Plan) -> dict:
    """Run the probe solution under ``plan`` (through the real check path) and return its observations."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    home = os.path.expanduser("~")
    candidates = sorted({"/", "/var/tmp", "/run/lock", "/dev/shm", "/tmp", home, os.getcwd(), str(isolation.PROJECT_ROOT)})
    site_modules = _site_probe_modules()
    counts = {}
    for d in isolation.site_dirs():
        with contextlib.suppress(OSError):
            counts[d] = len(os.listdir(d))
    source = (
        _PROBE.replace("PORT", str(port)).replace("CANDIDATES", repr(candidates)).replace("SECRETS", repr(_secret_paths()))
        .replace("SITE_DIRS", repr(isolation.site_dirs())).replace("SITE_COUNTS", repr(counts))
        .replace("SITE_MODULES", repr(sorted(site_modules.values()))).replace("STDLIB_MODULES", repr(_STDLIB_PROBE))
        .replace("KEYCTL_NR", repr(syscall_filter.syscall_number("keyctl")))
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


def describe(plan: isolation.Plan, facts: dict, fallbacks: list[str]) -> dict:
    """The isolation report of ``plan`` from the probe's ``facts`` (see ``isolation_report``)."""
    root = os.geteuid() == 0
    net = plan.mount_namespace
    network_isolated = net and not facts["loopback_reachable"]
    if plan.mode == "bwrap":
        user = f"a leased unprivileged uid per process ({isolation.UID_RANGE.start}-{isolation.UID_RANGE.stop - 1}), no capabilities"
    elif plan.mode == "bwrap-userns":
        user = "the invoking user inside a user namespace, no capabilities"
    elif plan.mode == "setuid":
        user = f"a leased unprivileged uid per process ({isolation.UID_RANGE.start}-{isolation.UID_RANGE.stop - 1})"
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
        "hidden_paths": list(plan.hidden) if net else [],
        "package_dirs": isolation.package_dirs(),
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
        "cpu_bounded_in_total": plan.cgroups is not None and plan.cgroups.cpu,
        "cpu_limit": ("one CPU's worth per check for all of the solution's processes (cpu controller of its cgroup); "
                      "the wall clock adds the time the check waited for a CPU other work held (at most wall_seconds)"
                      if plan.cgroups is not None and plan.cgroups.cpu else
                      "RLIMIT_CPU per process only: no cpu cgroup controller"
                      + (f" ({plan.cgroups.describe()})" if plan.cgroups is not None else f" ({plan.cgroup_reason})")
                      + "; the wall clock adds the time the check waited for a CPU other work held (at most wall_seconds)"),
        "memory_limit": memory,
        "cgroup": plan.cgroups.describe() if plan.cgroups is not None else None,
        "cgroup_unavailable": plan.cgroup_reason or None,
        "signals_contained": (net and facts["ppid"] == 1) or facts["uid"] != os.geteuid(),
        "imports_checked": facts.get("imports_checked", []),
        "syscall_filter_applied": plan.seccomp is not None and facts.get("keyctl_errno") == "EPERM",
        "syscall_filter": (syscall_filter.describe(plan.seccomp, plan.seccomp_reason)
                           if plan.seccomp is None or facts.get("keyctl_errno") == "EPERM" else
                           f"built but not in force: keyctl inside gave {facts.get('keyctl_errno') or 'success'}, not EPERM"),
        "resource_limits": "RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0 set in each process before its code runs",
        "wall_clock": "enforced by the parent: SIGKILL to both processes (and with them their namespaces and cgroup)",
        "command": plan.argv(False, 16),
        "python": sys.executable,
        "fallbacks": list(fallbacks),
        "probe": facts,
    }
