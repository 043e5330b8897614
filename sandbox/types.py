"""The sandbox's public data types: a check to run, the limits it runs under, and its outcome.

Plain data only (standard library dataclasses), so that code that builds checks or reads results
needs nothing else of the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["STATUSES", "Check", "ExecutionResult", "SandboxLimits"]

#: Every value :attr:`ExecutionResult.status` can take.
STATUSES = {
    "passed": "the test's check function returned (it alone decides; the solution cannot report anything)",
    "failed": "an assertion of the test failed, the solution raised, returned a value that cannot cross, "
    "exited or ended during a call, or failed to load",
    "invalid": "the completion does not form a solution on its own: it does not parse with its prompt, or it adds "
    "top-level statements to it (never run)",
    "timeout": "the wall-clock limit (enforced by the parent; plus the time the check waited for a CPU other work held, "
    "at most the limit again) or the CPU-time limit (RLIMIT_CPU)",
    "memory": "MemoryError under the address-space limit (RLIMIT_AS), or the solution's processes together over "
    "the memory limit of its cgroup",
    "killed": "the solution was ended by a signal: segmentation fault, file-size limit (SIGXFSZ), SIGKILL, ...",
    "sandbox_error": "the sandbox could not start or set up a process, or the benchmark's test failed to load or "
    "passed an argument that cannot cross to the solution",
}


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one check.

    ``wall_seconds`` (both processes together) is enforced by the parent; ``cpu_seconds``
    (RLIMIT_CPU), ``memory_mb`` (RLIMIT_AS), ``file_size_mb`` (RLIMIT_FSIZE; the private tmpfs of
    the work directory holds four times this) and ``max_processes`` (RLIMIT_NPROC) apply to each
    process; the solution's processes together are also held to ``memory_mb`` and
    ``max_processes`` by its cgroup where the machine has one. ``max_output_bytes`` caps what is
    kept of the solution's stdout and of its stderr; ``max_message_bytes`` the size of one reply
    from the solution; ``network=True`` keeps the host's network (no network namespace).
    """

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_output_bytes: int = 65536
    max_processes: int = 64
    max_message_bytes: int = 16 << 20
    network: bool = False

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "file_size_mb", "max_output_bytes", "max_processes",
                     "max_message_bytes"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class Check:
    """One solution and the test that judges it.

    ``solution`` is the source of the solution's module (the prompt's code with the completion;
    untrusted: it runs only in the solution's process). ``test`` is the source of the test
    module: the prompt's helpers and a ``check(candidate)`` function; it runs in the test's
    process with ``candidate`` (and the global name ``entry_point``) standing for the solution's
    function. ``invalid`` (from ``code_completion.build_check``) says why the completion does
    not form a solution; such a check is never run.
    """

    solution: str
    test: str
    entry_point: str
    invalid: str | None = None


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one check.

    ``reason`` is one line ('' when passed). ``returncode`` is the solution process's exit code,
    or minus the signal that ended it (-9 after a wall-clock timeout), None if it never started.
    ``stdout``/``stderr`` are the solution's, at most ``max_output_bytes`` each, with a note of
    what was dropped. ``peak_memory_bytes`` is the solution cgroup's peak (None without one).
    """

    passed: bool
    status: str
    reason: str
    returncode: int | None
    wall_seconds: float
    stdout: str = field(default="", repr=False)
    stderr: str = field(default="", repr=False)
    peak_memory_bytes: int | None = field(default=None, repr=False)
