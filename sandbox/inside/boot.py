"""Child-side bootstrap of one sandboxed process (see ``docs/sandbox.md``).

Started by :mod:`sandbox` as ``python -I -S -c 'import boot; boot.main()'``
(with this directory first on ``sys.path``, so that the compiled module is used), inside
bubblewrap or, in the degraded modes, directly. Standard library only, nothing heavy imported: it runs twice
per checked solution (once for the test, once for the solution) and its start-up time is the
sandbox's per-check cost.

Protocol. stdin carries an 8-byte big-endian length, a ``marshal``-encoded configuration dict
written by the parent (the same interpreter, so ``marshal`` is safe in this direction), then the
source this process runs (UTF-8). Each process reports to the parent on its own status pipe
(``cfg['status_fd']``), one tab-separated line per event; only that process and the parent hold
the pipe, and the other process of the pair never shares a process, a uid or (with bubblewrap) a
PID namespace with it:

    ready                                 set-up done, the role starts
    done    <number of calls>             the test ran to its end (test role only)
    error   <kind> <exception type> <one-line reason>      (test role only)
    setup   <one-line reason>             the sandbox could not be set up
    exit    code|signal <number>          how the role's process ended (written by its supervisor)

The solution's process closes its status pipe before any of the solution's code runs: only its
supervisor (which the solution's uid cannot reach) reports how it ended.

Set-up, each step driven by the configuration (the parent decides which apply):
  1. stdin re-pointed at /dev/null; the solution's process joins its cgroups (memory, process
     count and CPU bounded for everything it starts) through the ``cgroup.procs`` files the parent
     opened; without bubblewrap (which applies it itself), the seccomp filter is loaded;
  2. a supervisor forks the role's process and stays behind to reap it and report how it ended
     (PID 1 of bubblewrap's PID namespace, or a child subreaper without one);
  3. in the role's process: no_new_privs (set by ``setpriv`` before bubblewrap where available);
     privileges dropped to the leased uid/gid; without PID namespaces, the test's process made
     non-dumpable (no ptrace, no /proc/<pid>/mem, even for its own uid); resource
     limits (CPU, address space, file size, processes, no core files); every file descriptor
     closed but stdout, stderr, the status pipe and the two channel pipes; the work directory;
     ``sys.path`` reduced to the interpreter's own directories; then the role runs
     (``harness.run_test`` or ``harness.serve_solution``).
"""
import marshal
import os
import resource
import sys

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _one_line(text, limit=600):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Status:
    """Event lines to the parent; only the process that created it writes (a fork does not)."""

    def __init__(self, fd, pid):
        self.fd = fd
        self.pid = pid

    def send(self, *fields):
        if os.getpid() != self.pid:
            return
        line = "\t".join(_one_line(f).replace("\t", " ") for f in fields) + "\n"
        try:
            os.write(self.fd, line.encode("utf-8", "replace"))
        except OSError:
            pass


def _prctl(option, value, arg3=0):
    import ctypes  # here, not at the top: ctypes is slow to load and only some modes call prctl (start-up time)

    libc = ctypes.CDLL(None, use_errno=True)
    c_ulong = ctypes.c_ulong
    if libc.prctl(ctypes.c_int(option), c_ulong(value), c_ulong(arg3), c_ulong(0), c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(%d): %s" % (option, os.strerror(err)))


def _load_seccomp(program):
    """Apply the parent's seccomp BPF program to this process and all it starts (modes without bubblewrap)."""
    import ctypes  # here, not at the top: ctypes is slow to load and bubblewrap applies the filter itself

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(code))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # required to load a filter without CAP_SYS_ADMIN; kept for the role anyway
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def _read_payload():
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    data = b"".join(chunks)
    size = int.from_bytes(data[:8], "big")
    return marshal.loads(data[8 : 8 + size]), data[8 + size :].decode("utf-8", "replace")


def _set_limits(cfg):
    limits = [
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_CPU, cfg["cpu_seconds"], cfg["cpu_seconds"] + 1),
        (resource.RLIMIT_AS, cfg["memory_bytes"], cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, cfg["file_size_bytes"], cfg["file_size_bytes"]),
        (resource.RLIMIT_NPROC, cfg["max_processes"], cfg["max_processes"]),
    ]
    for which, soft, hard in limits:
        cur_soft, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))


def _descendants(pid):
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (current, current)) as fh:
                children = [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            children = []
        found.extend(children)
        todo.extend(children)
    return found


def _kill_descendants():
    """Without a PID namespace: kill what the role's process left running (we are its subreaper)."""
    import signal  # here, not at the top: needed only without a PID namespace (start-up time)

    for _ in range(1000):
        pids = _descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def _supervise(status, cfg):
    """Fork the role's process and wait for it; the supervisor side never returns.

    The supervisor closes its copies of the channel pipes, so the other process of the pair sees
    end-of-file as soon as the role's process (and whatever it started) is gone. In a PID namespace
    the supervisor is PID 1: its exit takes every remaining process of the namespace with it.
    Without one it is a child subreaper and kills all of its descendants before it exits.
    """
    child = os.fork()
    if child == 0:
        status.pid = os.getpid()
        return
    for fd in (cfg["send_fd"], cfg["recv_fd"]):
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            break
    if not cfg["pid_namespace"]:
        _kill_descendants()
    if os.WIFSIGNALED(wait_status):
        status.send("exit", "signal", str(os.WTERMSIG(wait_status)))
        os._exit(128 + os.WTERMSIG(wait_status))
    code = os.waitstatus_to_exitcode(wait_status)
    status.send("exit", "code", str(code))
    os._exit(code & 0xFF)


def _close_other_fds(keep):
    previous = -1
    for fd in sorted(set(keep)) + [1 << 16]:
        if fd > previous + 1:
            os.closerange(previous + 1, fd)
        previous = fd


def main():
    cfg, source = _read_payload()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    status = Status(cfg["status_fd"], os.getpid())
    uid = cfg["uid"]
    try:
        for fd in cfg["cgroup_fds"]:
            os.write(fd, b"0")  # "0": the writing process; its children inherit the cgroup
            os.close(fd)
        if not cfg["pid_namespace"]:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if cfg.get("seccomp"):
            _load_seccomp(cfg["seccomp"])
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the parent
        status.send("setup", "%s: %s" % (type(exc).__name__, exc))
        os._exit(70)
    _supervise(status, cfg)
    workdir = cfg["workdir"]
    try:
        if not cfg["no_new_privs_set"]:
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise OSError("could not drop privileges to uid %d" % uid)
        if cfg["role"] == "test" and not cfg["pid_namespace"]:
            # Without namespaces between them, keep the solution (maybe of the same uid) from
            # attaching to the test with ptrace or reading its memory through /proc.
            _prctl(PR_SET_DUMPABLE, 0)
        if cfg["make_workdir"]:
            os.makedirs(workdir, mode=0o700, exist_ok=True)
        os.chdir(workdir)
        _set_limits(cfg)
        _close_other_fds([0, 1, 2, cfg["status_fd"], cfg["send_fd"], cfg["recv_fd"]])
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the parent
        status.send("setup", "%s: %s" % (type(exc).__name__, exc))
        os._exit(70)
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    os.environ["PWD"] = workdir
    sys.path[:] = [cfg["inside_dir"]] + [p for p in sys.path if p] + list(cfg["site_dirs"])
    sys.dont_write_bytecode = True
    import harness  # noqa: E402 - from the directory just added

    del sys.path[0]
    status.send("ready")
    if cfg["role"] == "test":
        harness.run_test(source, cfg, status)
    else:
        # From here on the solution's code runs: it gets no channel to the parent at all. Its
        # failures reach the test as replies; how its process ended, the supervisor reports.
        os.close(cfg["status_fd"])
        harness.serve_solution(source, cfg)
