"""The kernel a solution shares with the host: the seccomp filter, and one CPU's worth per check.

A solution that keeps state in the kernel (a keyring) can pass it to a later check under another
uid; one that starts busy processes in sessions of their own can take the CPU from the check
beside it. These tests run such solutions through the real check path and assert that the
system calls are denied, that nothing is left behind, and that a neighbour's correct, slow
solution keeps its verdict.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time

import pytest

from sandbox import (
    Check,
    SandboxLimits,
    cgroups,
    check_solution,
    check_solutions,
    isolation_report,
    probe,
    run,
    syscall_filter,
)
from tests.sandbox.sandbox_helpers import call_check

pytestmark = pytest.mark.sandbox

LIMITS = SandboxLimits(wall_seconds=10, cpu_seconds=5, memory_mb=512, max_processes=32)


@pytest.fixture(scope="module")
def report() -> dict:
    return isolation_report()


@pytest.fixture(scope="module")
def filtered(report) -> dict:
    if not report["syscall_filter_applied"]:
        pytest.skip(f"no seccomp filter in this mode: {report['syscall_filter']}")
    return report


def _key_users() -> dict[int, str]:
    """uid -> its line of /proc/key-users (every uid that holds a key or a keyring)."""
    out = {}
    with open("/proc/key-users") as fh:
        for line in fh:
            uid, _, rest = line.partition(":")
            out[int(uid)] = rest.strip()
    return out


def test_the_filter_is_in_force_wherever_libseccomp_is(report):
    program, reason = syscall_filter.program()
    if program is None:
        assert not report["syscall_filter_applied"] and "not applied" in report["syscall_filter"]
        pytest.skip(reason)
    assert report["syscall_filter_applied"], report["syscall_filter"]
    assert report["probe"]["keyctl_errno"] == "EPERM"


def test_the_program_denies_every_listed_call():
    """Each call of DENIED that this architecture has is compared against in the program, which returns EPERM and ENOSYS."""
    sc = pytest.importorskip("pyseccomp")
    program, reason = syscall_filter.program()
    if program is None:
        pytest.skip(reason)
    arch = sc.system_arch()
    text_rules = {}
    for name in syscall_filter.DENIED:
        try:
            text_rules[name] = sc.resolve_syscall(arch, name)
        except (OSError, ValueError, RuntimeError):
            continue
    assert len(text_rules) >= 40
    assert program == syscall_filter.program.__wrapped__()[0]
    # The real program, disassembled: every listed number is compared against and leads to EPERM.
    instructions = [int.from_bytes(program[i + 4:i + 8], "little") for i in range(0, len(program), 8)]
    for name, number in text_rules.items():
        assert number in instructions, name
    assert (0x00050000 | errno.EPERM) in instructions and (0x00050000 | errno.ENOSYS) in instructions


#: (name, arguments) of denied calls that are harmless if ever let through: null pointers, invalid descriptors.
LIVE_CALLS = [
    ("add_key", "b'user', b'atlas-channel', b'secret', 6, -4"),  # KEY_SPEC_USER_KEYRING: outlives the check
    ("add_key", "b'user', b'atlas-channel', b'secret', 6, -3"),  # KEY_SPEC_SESSION_KEYRING
    ("keyctl", "0, -4, 1"),  # KEYCTL_GET_KEYRING_ID of the user keyring, creating it
    ("keyctl", "1, b'atlas-session'"),  # KEYCTL_JOIN_SESSION_KEYRING by name: shared with whoever joins it
    ("request_key", "b'user', b'atlas-channel', None, 0"),
    ("ptrace", "0, 0, 0, 0"),  # PTRACE_TRACEME
    ("unshare", "0x10000000"),  # CLONE_NEWUSER
    ("setns", "-1, 0"),
    ("mount", "None, None, None, 0, None"),
    ("umount2", "b'/usr', 2"),
    ("pivot_root", "b'/tmp', b'/tmp'"),
    ("chroot", "b'/tmp'"),
    ("bpf", "0, None, 0"),
    ("perf_event_open", "None, 0, -1, -1, 0"),
    ("userfaultfd", "0"),
    ("io_uring_setup", "1, None"),
    ("process_vm_readv", "1, None, 0, None, 0, 0"),
    ("open_by_handle_at", "-1, None, 0"),
    ("name_to_handle_at", "-1, b'/', None, None, 0"),
    ("kcmp", "1, 1, 0, 0, 0"),
    ("fsopen", "b'tmpfs', 0"),
    ("open_tree", "-1, b'/', 0"),
    ("mount_setattr", "-1, b'/', 0, None, 0"),
    ("fanotify_init", "0, 0"),
    ("init_module", "None, 0, None"),
    ("delete_module", "b'atlas', 0"),
    ("kexec_load", "0, 0, None, 0"),
    ("swapon", "None, 0"),
]


def test_denied_calls_return_eperm_and_leave_no_key(filtered):
    numbers = {name: syscall_filter.syscall_number(name) for name, _ in LIVE_CALLS}
    calls = [(name, numbers[name], args) for name, args in LIVE_CALLS if numbers[name] is not None]
    body = (
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "out = []\n"
        f"for name, nr, args in {[(n, nr, a) for n, nr, a in calls]!r}:\n"
        "    ctypes.set_errno(0)\n"
        "    r = libc.syscall(nr, *eval('(' + args + ',)'))\n"
        "    out.append((name, 'ok' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))))\n"
        "return out\n"
    )
    test = f"def check(candidate):\n    out = candidate()\n    assert len(out) == {len(calls)}\n    assert [o for o in out if o[1] != 'EPERM'] == []\n"
    before = _key_users()
    result = check_solution(call_check(body, test), LIMITS)
    assert len(calls) >= 20
    assert result.passed, result.reason
    # Nothing was stored: no uid of the sandbox's range holds a key now that it did not hold before.
    from sandbox.isolation import UID_RANGE

    after = _key_users()
    assert {u: v for u, v in after.items() if u in UID_RANGE and before.get(u) != v} == {}


def test_a_key_left_by_one_check_is_not_found_by_the_next(filtered):
    """The channel that was used: store under the check's uid, read back in a later check."""
    store = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.syscall(NR_ADD_KEY, b'user', b'atlas-oracle', b'answer:4', 8, -4)\n"
        "assert r < 0 and ctypes.get_errno() == 1, (r, ctypes.get_errno())\n"
    )
    read = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.syscall(NR_REQUEST_KEY, b'user', b'atlas-oracle', None, -4)\n"
        "assert r < 0 and ctypes.get_errno() == 1, (r, ctypes.get_errno())\n"
    )
    nr = {"NR_ADD_KEY": syscall_filter.syscall_number("add_key"), "NR_REQUEST_KEY": syscall_filter.syscall_number("request_key")}
    checks = []
    for program in (store, store, read, read):
        for key, value in nr.items():
            program = program.replace(key, str(value))
        checks.append(call_check(program))
    results = check_solutions(checks, LIMITS, workers=1)
    assert [r.status for r in results] == ["passed"] * 4, [r.reason for r in results]
    with open("/proc/keys") as fh:
        assert "atlas-oracle" not in fh.read()


def test_another_architectures_entry_point_kills_the_process(filtered):
    """x32 numbering (bit 30 set) is outside the filter's table: the process is killed, not let through."""
    keyctl = syscall_filter.syscall_number("keyctl")
    body = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"libc.syscall(0x40000000 | {keyctl}, 0, -3, 0)\n"
        "return 'survived'\n"
    )
    result = check_solution(call_check(body, "def check(candidate):\n    assert candidate() == 'survived'\n"), LIMITS)
    assert not result.passed and result.status in ("killed", "failed"), result
    assert "SIGSYS" in result.reason or "stopped" in result.reason or "exited" in result.reason, result.reason


def test_processes_and_pools_still_start_under_the_filter(filtered):
    """clone3 is ENOSYS, so the C library falls back to clone: subprocess and multiprocessing work."""
    body = (
        "import multiprocessing, subprocess, sys\n"
        "out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip()\n"
        "with multiprocessing.Pool(2) as pool:\n"
        "    squares = pool.map(abs, [-1, -2, -3])\n"
        "return [out, squares]\n"
    )
    result = check_solution(call_check(body, "def check(candidate):\n    assert candidate() == ['42', [1, 2, 3]]\n"),
                            SandboxLimits(wall_seconds=30, cpu_seconds=20))
    assert result.passed, result


# --------------------------------------------------------------------------------------------
# CPU: one CPU's worth per check, and a wall clock that counts only what the check was given

#: A correct solution that needs about two seconds of one CPU on this machine class.
SLOW_CORRECT = Check(
    solution=(
        "def count_primes(n):\n"
        "    return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))\n"
    ),
    test="def check(candidate):\n    assert candidate(N) == EXPECTED\n",
    entry_point="count_primes",
)

#: A neighbour that starts busy processes, each in a session (and scheduler autogroup) of its own.
SPINNER = call_check(
    "import os, time\n"
    "for _ in range(8):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        while True:\n"
    "            pass\n"
    "t = time.monotonic()\n"
    "while time.monotonic() - t < 60:\n"
    "    pass\n"
)


def _slow_correct(seconds: float) -> Check:
    """SLOW_CORRECT sized to take about ``seconds`` of CPU here."""
    import math

    def count(n):
        return sum(1 for k in range(2, n) if all(k % d for d in range(2, math.isqrt(k) + 1)))

    n, t = 20000, 0.0
    while True:
        start = time.process_time()
        expected = count(n)
        t = time.process_time() - start
        if t >= seconds / 2.5 or n > 10_000_000:  # the sandbox's own start-up adds a little on top
            break
        n = int(n * 1.6)
    return Check(SLOW_CORRECT.solution, SLOW_CORRECT.test.replace("N", str(n)).replace("EXPECTED", str(expected)),
                 SLOW_CORRECT.entry_point)


def _beside_spinner() -> tuple:
    limits = SandboxLimits(wall_seconds=6, cpu_seconds=30, memory_mb=512, max_processes=32)
    victim = _slow_correct(2.0)
    alone = check_solution(victim, limits)
    assert alone.passed, alone
    spinner, beside = check_solutions([SPINNER, victim], limits, workers=2)
    assert spinner.status == "timeout", spinner
    return alone, beside, spinner


@pytest.fixture()
def cpu_groups(report):
    support, reason = cgroups.detect()
    if support is None or not support.cpu:
        pytest.skip(f"no cpu cgroup controller here: {reason or support.describe()}")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the neighbour and the check cannot run side by side")
    return support


def test_a_spinning_neighbour_does_not_change_a_slow_correct_verdict(cpu_groups):
    alone, beside, spinner = _beside_spinner()
    assert beside.passed, (beside, alone.wall_seconds)
    # A busy check's timeout says it ran: seconds of CPU, not the near-zero of a sleeping one.
    ran = re.search(r"its processes ran ([\d.]+) s of CPU", spinner.reason)
    assert ran and float(ran.group(1)) > 1.0, spinner.reason


@pytest.mark.slow
def test_the_cpu_quota_alone_keeps_the_verdict(cpu_groups, monkeypatch):
    """Without the wall-clock extension: the spinner's cgroup alone leaves the victim its CPU."""
    monkeypatch.setattr(run._CheckClock, "extend", lambda self: False)
    alone, beside, _ = _beside_spinner()
    assert beside.passed, (beside, alone.wall_seconds)


@pytest.mark.slow
def test_the_wall_clock_alone_keeps_the_verdict(cpu_groups, monkeypatch):
    """Without a cpu controller: the time the victim waited for a CPU is added to its limit."""
    plan = probe.detected_plan()
    no_cpu = dataclasses.replace(plan.cgroups, parents=plan.cgroups.parents[: 2 if plan.cgroups.version == 1 else 1], cpu=False)
    monkeypatch.setattr(probe, "_plan", dataclasses.replace(plan, cgroups=no_cpu))
    alone, beside, _ = _beside_spinner()
    assert beside.passed, (beside, alone.wall_seconds)


def test_a_hanging_check_still_ends_at_its_wall_limit():
    """Sleeping is not waiting for a CPU: no extension."""
    start = time.monotonic()
    result = check_solution(call_check("import time\ntime.sleep(60)\n"), SandboxLimits(wall_seconds=2, cpu_seconds=5))
    assert result.status == "timeout" and "plus" not in result.reason, result
    assert time.monotonic() - start < 4
    # The reason says what the clock measured at the deadline: 2 s gone, almost none of it on a CPU.
    measured = re.search(r"at ([\d.]+) s: its processes ran ([\d.]+) s of CPU, longest wait for a CPU ([\d.]+) s",
                         result.reason)
    assert measured, result.reason
    elapsed, ran, _ = map(float, measured.groups())
    assert elapsed >= 2 and ran < 1, result.reason
