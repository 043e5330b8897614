"""Child-side bootstrap of the code sandbox (see ``sandbox.py`` and ``docs/sandbox.md``).

Started by :mod:`experiments.evaluation.sandbox` as ``python -I -S _sandbox_boot.py``, either
directly or as the first process of fresh namespaces made by ``unshare``. It is written against
the standard library only and imports nothing heavy, because it runs once per evaluated program
and its start-up time is the sandbox's per-program cost.

Protocol. stdin carries an 8-byte big-endian length, a ``marshal``-encoded configuration dict
written by the parent (same interpreter, so ``marshal`` is safe in this direction), then the
program source (UTF-8). The bootstrap reports on a separate pipe (``cfg['status_fd']``) with
one tab-separated line per event, each starting with a per-run nonce that only the parent and
this process know (it never appears in a file, argv or the environment):

    <nonce> ready                                 set-up done, the program starts
    <nonce> done                                  the program ran to its end
    <nonce> error   <kind> <exception type> <one-line reason>
    <nonce> setup   <one-line reason>             the sandbox could not be set up
    <nonce> exit    code|signal <number>          how the program's process ended

A program that exits early (``sys.exit(0)``, ``os._exit(0)``, a closed status pipe) never
produces ``done``, so it cannot be mistaken for a pass. Only the original process writes
events: a forked child that reaches the end of the program does not count.

Set-up steps, each driven by the configuration (the parent decides which apply):
  1. stdin is re-pointed at /dev/null; a new session when namespaces isolate the process;
  2. in a private mount namespace: tmpfs over /tmp (the work directory lives there) and
     /dev/shm, interpreter directories hidden behind a non-traversable ancestor (``/root`` for
     a pyenv install) re-exposed read-only, every other mount remounted read-only;
  3. a supervisor forks the program's process and stays behind, with its credentials
     unchanged, to reap it and report how it ended;
  4. in the program's process: no_new_privs; privileges dropped to the leased uid/gid, or, in
     a user namespace without a spare uid, a nested user namespace so the program holds no
     capability over the mounts; resource limits (CPU, address space, file size, processes,
     no core files); then the program is compiled and executed as ``__main__`` in the work
     directory.
"""
import marshal
import os
import resource
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

_LOCKED_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}


def _one_line(text, limit=500):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Status:
    def __init__(self, fd, nonce, pid):
        self.fd = fd
        self.nonce = nonce
        self.pid = pid

    def send(self, *fields):
        if os.getpid() != self.pid:
            return
        line = "\t".join([self.nonce] + [_one_line(f).replace("\t", " ") for f in fields]) + "\n"
        try:
            os.write(self.fd, line.encode("utf-8", "replace"))
        except OSError:
            pass


class _Libc:
    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def _check(self, rc, what):
        if rc != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def mount(self, source, target, fstype, flags, data=None):
        enc = lambda s: s.encode() if s is not None else None  # noqa: E731
        rc = self.lib.mount(enc(source), enc(target), enc(fstype), self.ctypes.c_ulong(flags), enc(data))
        self._check(rc, "mount %s" % target)

    def unshare(self, flags):
        self._check(self.lib.unshare(self.ctypes.c_int(flags)), "unshare")

    def prctl(self, option, value):
        c_ulong = self.ctypes.c_ulong
        rc = self.lib.prctl(self.ctypes.c_int(option), c_ulong(value), c_ulong(0), c_ulong(0), c_ulong(0))
        self._check(rc, "prctl(%d)" % option)


def _unescape_mount_path(path):
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(path):
        octal = path[i + 1 : i + 4]
        if path[i] == "\\" and len(octal) == 3 and octal.isdigit():
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _mounts():
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            yield _unescape_mount_path(parts[4]), parts[5].split(",")


def _setup_mounts(libc, cfg):
    tmpfs_opts = "size=%dm,mode=1777" % cfg["tmpfs_mb"]
    # Interpreter directories below a directory the sandbox uid cannot traverse: keep a
    # handle on them before hiding that ancestor behind an empty tmpfs, then bind them back.
    exposed = []
    for hidden, paths in cfg["expose"]:
        handles = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in paths]
        exposed.append((hidden, handles))
    libc.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts)
    if os.path.isdir("/dev/shm"):
        libc.mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts)
    for hidden, handles in exposed:
        libc.mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path, fd in handles:
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
            os.close(fd)
    # A mount that refuses the remount stays writable; the parent's probe program lists such
    # mounts (isolation_report()['probe']['mounts_left_writable']).
    keep_writable = ("/tmp", "/dev/shm", "/proc")
    for point, options in list(_mounts()):
        if point in keep_writable or point.startswith("/proc/") or point.startswith("/tmp/"):
            continue
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in options:
            flags |= _LOCKED_FLAGS.get(opt, 0)
        if not (flags & (MS_NOATIME | MS_RELATIME)):
            flags |= MS_STRICTATIME
        try:
            libc.mount(None, point, None, flags)
        except OSError:
            pass


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


def _describe(exc, filename, source_lines):
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not break the report
        message = "<unprintable>"
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    reason = "%s: %s" % (name, message) if message else name
    if line and 0 < line <= len(source_lines):
        reason += " (line %d: %s)" % (line, source_lines[line - 1].strip()[:200])
    return name, reason


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a broken stream must not change the result
            pass


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
    """Without a PID namespace: kill what the program left running (we are its subreaper)."""
    import signal

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


def _supervise(status, pid_namespace):
    """Fork the program's process and wait for it; the parent side never returns.

    The supervisor stays behind as the program's parent. In a PID namespace it is PID 1: it
    reaps orphans, and its exit takes every remaining process of the namespace with it.
    Without one it is a child subreaper, so orphans of the program (a daemon that called
    setsid) become its children, and it kills all of its descendants before it exits. The
    program is not PID 1, so signals it sends itself behave as usual. The program's fate is
    reported as an ``exit`` event because a PID 1 cannot re-raise a signal on itself.
    """
    child = os.fork()
    if child == 0:
        status.pid = os.getpid()
        return
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            break
    if not pid_namespace:
        _kill_descendants()
    if os.WIFSIGNALED(wait_status):
        status.send("exit", "signal", str(os.WTERMSIG(wait_status)))
        os._exit(128 + os.WTERMSIG(wait_status))
    code = os.waitstatus_to_exitcode(wait_status)
    status.send("exit", "code", str(code))
    os._exit(code & 0xFF)


def main():
    data = sys.stdin.buffer.read()
    size = int.from_bytes(data[:8], "big")
    cfg = marshal.loads(data[8 : 8 + size])
    source = data[8 + size :].decode("utf-8", "replace")
    del data
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    status = _Status(cfg["status_fd"], cfg["nonce"], os.getpid())
    workdir = cfg["workdir"]
    program_path = os.path.join(workdir, "program.py")
    uid = cfg["uid"]
    try:
        if cfg["setsid"]:
            os.setsid()
        libc = _Libc()
        if cfg["mount"]:
            _setup_mounts(libc, cfg)
            os.makedirs(workdir, mode=0o700, exist_ok=True)
        with open(program_path, "w", encoding="utf-8") as fh:
            fh.write(source)
        os.chmod(program_path, 0o644)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        if not cfg["mount"]:
            # Without a PID namespace, adopt orphaned descendants so they are reaped here.
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the parent
        status.send("setup", "%s: %s" % (type(exc).__name__, exc))
        os._exit(70)
    # The supervisor keeps its credentials: a credential change would clear the parent-death
    # signal that ``unshare --kill-child`` set, and the namespace must die with ``unshare``.
    _supervise(status, pid_namespace=cfg["mount"])
    try:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise OSError("could not drop privileges to uid %d" % uid)
        if cfg["nested_userns"]:
            libc.unshare(CLONE_NEWUSER)
        os.chdir(workdir)
        _set_limits(cfg)
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the parent
        status.send("setup", "%s: %s" % (type(exc).__name__, exc))
        os._exit(70)
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    os.environ["PWD"] = workdir
    sys.path[:] = [p for p in sys.path if p] + list(cfg["site_dirs"])
    sys.dont_write_bytecode = True
    sys.argv[:] = [program_path]
    status.send("ready")

    module = type(sys)("__main__")
    module.__file__ = program_path
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    source_lines = source.splitlines()
    try:
        code = compile(source, program_path, "exec")
        exec(code, module.__dict__)
    except SystemExit as exc:
        _flush()
        code = exc.code
        status.send("error", "exit", "SystemExit", "exited with sys.exit(%r) before the end of the program" % (code,))
        if code is None:
            code = 0
        os._exit(code & 0xFF if isinstance(code, int) else 1)
    except MemoryError as exc:
        _flush()
        status.send("error", "memory", "MemoryError", _describe(exc, program_path, source_lines)[1])
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - any failure of the program is a result
        _flush()
        name, reason = _describe(exc, program_path, source_lines)
        status.send("error", "exception", name, reason)
        os._exit(1)
    _flush()
    status.send("done")
    os._exit(0)


if __name__ == "__main__":
    main()
