"""Run model-generated solutions against their tests in a sandbox and report whether each passed.

Each check runs as two sandboxed processes: the benchmark's test, which alone decides the verdict,
and the solution, which only answers calls with plain data. The solution's process has no view of
the repository, the benchmark files, the home directory or caches (bubblewrap builds a root that
holds only the interpreter and its packages), no network, its own uid and PID namespace, and its
memory and process count bounded in total by a cgroup. A solution that hangs, forks without end,
allocates 10 GB, fills the disk, reads the tests, patches the interpreter or tries to forge the
verdict costs only its own result. A seccomp filter denies the kernel facilities a solution has no
use for (keyrings, ptrace, mounts, namespaces, bpf, ...), and the cgroup gives all of a solution's
processes one CPU's worth, so neither a later check nor the one beside it can be reached. ``docs/sandbox.md`` describes the design, the isolation modes,
where each limit comes from, and what the sandbox does not defend against.

Public API: :class:`Check`, :class:`SandboxLimits`, :class:`ExecutionResult`, :data:`STATUSES`,
:func:`check_solution`, :func:`check_solutions`, :func:`isolation_report`.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Sequence

from sandbox import probe
from sandbox.probe import SandboxUnavailable
from sandbox.run import run_pair
from sandbox.types import STATUSES, Check, ExecutionResult, SandboxLimits

__all__ = [
    "STATUSES",
    "Check",
    "ExecutionResult",
    "SandboxLimits",
    "SandboxUnavailable",
    "check_solution",
    "check_solutions",
    "isolation_report",
]


def isolation_report() -> dict:
    """What isolation is in force on this machine, as observed by a probe solution inside it.

    Keys include ``mode`` ('bwrap': root with bubblewrap -- a new root filesystem, PID,
    network, IPC and UTS namespaces plus a leased unprivileged uid; 'bwrap-userns': the same in
    a user namespace; 'setuid': root without bubblewrap, uid only; 'plain': resource limits
    only), ``files_hidden`` (the solution sees neither the repository, nor the benchmark data,
    nor the home directory or caches; ``visible_host_paths`` lists what it does see),
    ``network_isolated``, ``pid_namespace``, ``filesystem_protected``, ``processes_limited``,
    ``memory_bounded_in_total`` (a cgroup holds all of the solution's processes),
    ``cpu_bounded_in_total`` (they share one CPU's worth), ``syscall_filter_applied`` (the
    seccomp filter is in force, as the probe observed) and ``syscall_filter`` (what it denies, or
    why it is not applied), ``hidden_paths`` (host paths covered inside),
    ``imports_checked``, ``fallbacks`` (why better modes were not used) and ``probe`` (the raw
    observations). Raises SandboxUnavailable (a RuntimeError) when no mode works, for instance
    when the interpreter's imports would fail inside. Set ``ATLAS_SANDBOX_MODE`` to force one mode.
    """
    return probe.current_report()


def check_solution(check: Check, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run one :class:`Check` (its test and its solution, each in its own sandbox); see ``STATUSES``."""
    if check.invalid is not None:
        return ExecutionResult(False, "invalid", check.invalid, None, 0.0)
    try:
        plan = probe.detected_plan()
    except RuntimeError as exc:
        return ExecutionResult(False, "sandbox_error", str(exc), None, 0.0)
    return run_pair(plan, check, limits)


def check_solutions(
    checks: Sequence[Check],
    limits: SandboxLimits = SandboxLimits(),
    workers: int = 2,
    on_result: Callable[[ExecutionResult], None] | None = None,
) -> list[ExecutionResult]:
    """:func:`check_solution` over many checks with at most ``workers`` running at once.

    Results come back in the order of ``checks``. ``on_result`` (a progress bar's update, for
    instance) is called with each result as its check finishes, in the order they finish, in the
    calling thread.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not checks:
        return []
    results: list[ExecutionResult | None] = [None] * len(checks)
    with contextlib.suppress(RuntimeError):  # each result then reports the sandbox_error
        probe.detected_plan()  # detect once, before the threads start
    with ThreadPoolExecutor(max_workers=min(workers, len(checks))) as pool:
        futures = {pool.submit(check_solution, check, limits): i for i, check in enumerate(checks)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_result is not None:
                on_result(result)
    return [r for r in results if r is not None]
