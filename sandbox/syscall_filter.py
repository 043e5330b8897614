"""The seccomp filter every sandboxed process runs under: kernel facilities a solution has no use for, denied.

A solution shares the host's kernel. Namespaces hide files, processes and the network, but some
kernel state is global or per-uid and outlives a check: a solution that stores a value in a
kernel keyring can read it back in a later check, under another uid, and leave it on the host
after the evaluation. The filter returns ``EPERM`` for the system calls in :data:`DENIED` (each
with why a solution never needs it), ``ENOSYS`` for ``clone3`` (its flags sit in memory, out of a
filter's reach; the C library then falls back to ``clone``, whose flags are checked), and kills a
process that calls the kernel through another architecture's entry point (32-bit ``int 0x80``,
the x32 ABI), where the numbers differ and a filter for the native ones would not match.

The BPF program is built by libseccomp, the C library behind every container runtime's filter
(through ``pyseccomp``, its bindings on PyPI, API-compatible with libseccomp's own Python module),
and applied by bubblewrap (``--seccomp``) in the bubblewrap modes, by the bootstrap itself
(``prctl(PR_SET_SECCOMP)``) in the others. Where libseccomp is missing, :func:`program` says why
and every report names the filter as not applied.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

#: System calls denied with EPERM, and why a checked solution has no use for each.
DENIED: dict[str, str] = {
    "add_key": "kernel keyrings persist per uid across checks: a channel between checks",
    "keyctl": "kernel keyrings (read, link, search another check's keys)",
    "request_key": "kernel keyrings (and upcalls to host helpers)",
    "ptrace": "attaching to or reading another process",
    "process_vm_readv": "reading another process's memory",
    "process_vm_writev": "writing another process's memory",
    "kcmp": "comparing kernel objects of other processes (an information leak)",
    "pidfd_getfd": "taking a file descriptor out of another process",
    "mount": "changing the filesystem view the sandbox built",
    "umount2": "uncovering what the sandbox's mounts hide",
    "pivot_root": "changing the root filesystem",
    "chroot": "changing the root directory",
    "move_mount": "the new mount API (changing the filesystem view)",
    "open_tree": "the new mount API",
    "fsopen": "the new mount API",
    "fsconfig": "the new mount API",
    "fsmount": "the new mount API",
    "fspick": "the new mount API",
    "mount_setattr": "the new mount API (making a read-only mount writable)",
    "unshare": "new namespaces (a user namespace gives capabilities inside it)",
    "setns": "entering other namespaces",
    "bpf": "loading programs into the kernel",
    "perf_event_open": "performance counters (side channels on other processes)",
    "userfaultfd": "pausing the kernel mid-copy (an exploitation primitive)",
    "io_uring_setup": "io_uring runs operations the filter cannot see",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "kexec_load": "replacing the running kernel",
    "kexec_file_load": "replacing the running kernel",
    "init_module": "loading kernel modules",
    "finit_module": "loading kernel modules",
    "delete_module": "unloading kernel modules",
    "reboot": "rebooting the host",
    "swapon": "changing the host's swap",
    "swapoff": "changing the host's swap",
    "acct": "process accounting to a file",
    "quotactl": "disk quotas of the host",
    "open_by_handle_at": "opening files by handle, past the mount namespace (a known container escape)",
    "name_to_handle_at": "file handles (pairs with open_by_handle_at)",
    "lookup_dcookie": "kernel profiling paths",
    "fanotify_init": "watching the host filesystem's events",
    "syslog": "reading the kernel log",
    "vhangup": "hanging up terminals",
    "iopl": "raw I/O port access",
    "ioperm": "raw I/O port access",
    "settimeofday": "setting the host's clock",
    "clock_settime": "setting the host's clock",
    "clock_adjtime": "adjusting the host's clock",
    "adjtimex": "adjusting the host's clock",
    "sethostname": "naming the host",
    "setdomainname": "naming the host",
}
#: Namespace flags of clone(2): creating a namespace is denied as with unshare.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}


def _bindings():
    """``pyseccomp``: ImportError, or OSError where libseccomp.so.2 is missing."""
    import pyseccomp  # here, not at the top: it loads libseccomp.so.2, which a machine may lack (reported, not fatal)

    return pyseccomp


@functools.cache
def program() -> tuple[bytes | None, str]:
    """The filter as a BPF program (``struct sock_filter`` array, native byte order), or None and why not."""
    try:
        sc = _bindings()
    except (ImportError, OSError) as exc:
        return None, f"libseccomp's Python bindings are not available ({type(exc).__name__}: {exc}); pip install pyseccomp; apt-get install libseccomp2"
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        # Another architecture's entry point (int 0x80, x32): kill, since its numbers are not the ones denied here.
        filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        deny = sc.ERRNO(errno.EPERM)
        for name in DENIED:
            try:
                filt.add_rule(deny, name)
            except (OSError, ValueError, RuntimeError):  # a call this architecture does not have
                pass
        for flag in CLONE_NAMESPACE_FLAGS.values():
            filt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as fh:
            filt.export_bpf(fh)
            fh.seek(0)
            data = fh.read()
    except (OSError, ValueError, RuntimeError) as exc:
        return None, f"libseccomp could not build the filter ({type(exc).__name__}: {exc})"
    if not data or len(data) % 8:
        return None, f"libseccomp exported a malformed program ({len(data)} bytes)"
    return data, ""


def syscall_number(name: str) -> int | None:
    """The number of system call ``name`` on this machine's architecture (None without libseccomp)."""
    try:
        sc = _bindings()
        return int(sc.resolve_syscall(sc.system_arch(), name))
    except (ImportError, OSError, ValueError, RuntimeError):
        return None


def program_fd(data: bytes) -> int:
    """A readable file descriptor holding ``data`` from its start (bubblewrap's ``--seccomp FD``)."""
    read_end, write_end = os.pipe()
    try:
        if len(data) > 65536:  # a pipe's buffer: larger programs would block this write
            raise ValueError(f"seccomp program of {len(data)} bytes does not fit a pipe")
        os.write(write_end, data)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


def describe(data: bytes | None, reason: str) -> str:
    """One line for the isolation report."""
    if data is None:
        return f"not applied: {reason}"
    return (f"applied to every sandboxed process ({len(data) // 8} BPF instructions): EPERM for "
            f"{len(DENIED)} system calls (keyrings, ptrace, mount, namespaces, bpf, perf, io_uring, modules, ...), "
            "ENOSYS for clone3, other architectures' entry points killed")
