"""The sandbox: results and reasons, limits, batches, isolation modes; and an adversarial batch of
programs that must cost only their own checks.

Everything goes through ``check_solutions``, the path evaluation uses: the test and the solution
in two sandboxed processes. Hostile programs run as the body of the solution's function (or at
module load), with small limits so the file stays well under a minute. Protections a machine
cannot give (no bubblewrap, no cgroup, no unprivileged uid) are skipped according to
``isolation_report()``, whose claims are what these tests check. Attacks on the verdict itself
and on the benchmark's files are in ``test_sandbox_attacks.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

import sandbox
from sandbox import Check, ExecutionResult, SandboxLimits, check_solution, check_solutions, isolation_report
from tests.sandbox.sandbox_helpers import CANARY, call_check, cmdline, load_check

pytestmark = pytest.mark.sandbox

FAST = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, memory_mb=256, file_size_mb=4, max_output_bytes=4096, max_processes=16)


@pytest.fixture(scope="module")
def report() -> dict:
    return isolation_report()


# --------------------------------------------------------------------------------------------
# Ordinary results


def test_passing_check_reports_passed_with_the_solutions_output():
    result = check_solution(call_check("x = 2 + 2\nprint('four', x)\nreturn x", "def check(candidate):\n    assert candidate() == 4\n"), FAST)
    assert isinstance(result, ExecutionResult)
    assert (result.passed, result.status, result.reason) == (True, "passed", "")
    assert result.stdout.strip() == "four 4"
    assert 0 < result.wall_seconds < FAST.wall_seconds


def test_failed_assertion_names_the_test_line_and_the_last_call():
    check = Check("def f(x):\n    return x\n", "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 3\n", "f")
    result = check_solution(check, FAST)
    assert (result.passed, result.status) == (False, "failed")
    assert result.reason == "AssertionError (test line 3: assert candidate(2) == 3); last call: f(2) returned 2"


@pytest.mark.parametrize(
    "body, expected",
    [
        ("return undefined_name + 1", "NameError raised by the solution: name 'undefined_name' is not defined (solution line 2"),
        ("raise ValueError('bad value')", "ValueError raised by the solution: bad value"),
        ("def g(n):\n    return g(n + 1)\nreturn g(0)", "RecursionError raised by the solution"),
        ("return input()", "EOFError raised by the solution"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt raised by the solution"),
        ("class Custom(Exception):\n    pass\nraise Custom('mine')", "Custom raised by the solution: mine"),
    ],
)
def test_exceptions_of_the_solution_fail_with_type_message_and_line(body, expected):
    result = check_solution(call_check(body), FAST)
    assert result.status == "failed" and not result.passed
    assert result.reason.startswith(expected), result.reason


def test_the_test_sees_the_solutions_exception_as_the_builtin_type():
    test = (
        "def check(candidate):\n"
        "    try:\n"
        "        candidate(-1)\n"
        "    except ValueError as exc:\n"
        "        assert str(exc) == 'negative'\n"
        "    else:\n"
        "        raise AssertionError('no ValueError')\n"
        "    assert candidate(2) == 4\n"
    )
    solution = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x * x\n"
    assert check_solution(Check(solution, test, "f"), FAST).passed


def test_a_solution_that_does_not_load_fails_with_the_reason():
    syntax = check_solution(Check("def f(:\n    pass\n", "def check(candidate):\n    candidate()\n", "f"), FAST)
    assert syntax.status == "failed" and syntax.reason.startswith("the solution failed to load: SyntaxError")
    missing = check_solution(Check("def g():\n    return 1\n", "def check(candidate):\n    candidate()\n", "f"), FAST)
    assert missing.status == "failed" and "the solution does not define f" in missing.reason
    top = check_solution(load_check("raise RuntimeError('at import')"), FAST)
    assert top.status == "failed" and "RuntimeError: at import (solution line 1" in top.reason


def test_a_test_that_does_not_load_is_a_sandbox_error():
    result = check_solution(Check("def f():\n    return 1\n", "import no_such_module_anywhere\ndef check(candidate):\n    pass\n", "f"), FAST)
    assert result.status == "sandbox_error" and "the test failed to load: ModuleNotFoundError" in result.reason


def test_a_test_argument_that_cannot_cross_is_a_sandbox_error_not_a_failed_solution():
    result = check_solution(Check("def f(g):\n    return g(1)\n", "def check(candidate):\n    assert candidate(lambda x: x + 1) == 2\n", "f"), FAST)
    assert result.status == "sandbox_error", result
    assert "an argument of f(<function check.<locals>.<lambda>" in result.reason and "cannot cross to the solution" in result.reason


@pytest.mark.parametrize(
    "check",
    [
        call_check("import sys\nsys.exit(0)"),
        call_check("import sys\nsys.exit()"),
        call_check("raise SystemExit"),
        call_check("import os\nos._exit(0)"),
        call_check("import os\nos.closerange(0, 4096)\nreturn 1"),  # closing every pipe cannot turn into a pass
        load_check("import sys\nsys.exit(0)"),
        load_check("import os\nos._exit(0)"),
    ],
    ids=["sys.exit(0)", "sys.exit()", "SystemExit", "os._exit(0)", "closerange", "load sys.exit(0)", "load os._exit(0)"],
)
def test_exiting_early_with_status_zero_is_not_a_pass(check):
    result = check_solution(check, FAST)
    assert result.status == "failed" and not result.passed, result
    assert "exit" in result.reason or "ended" in result.reason or "stopped answering" in result.reason, result.reason


def test_nonzero_exit_code_is_reported():
    result = check_solution(call_check("import sys\nsys.exit(3)"), FAST)
    assert result.status == "failed" and result.returncode == 3 and "sys.exit(3)" in result.reason


def test_segfault_is_killed_with_the_signal_named():
    result = check_solution(call_check("import ctypes\nctypes.string_at(0)"), FAST)
    assert result.status == "killed" and "SIGSEGV" in result.reason and result.returncode == -signal.SIGSEGV


def test_environment_is_scrubbed_and_directory_private(monkeypatch, report):
    monkeypatch.setenv("ATLAS_TEST_SECRET", "do-not-leak")
    body = (
        "import os, sys, tempfile\n"
        "assert 'ATLAS_TEST_SECRET' not in os.environ, 'environment leaked'\n"
        "cwd = os.getcwd()\n"
        "assert os.environ['HOME'] == cwd == os.environ['TMPDIR'] == tempfile.gettempdir(), cwd\n"
        "assert sorted(os.listdir(cwd)) == ['solution.py'], os.listdir(cwd)\n"
        "assert sys.flags.isolated == 1 and sys.flags.no_site == 1\n"
        "open('left_behind.txt', 'w').write('x')\n"
        "print(cwd)\n"
        "return sorted(os.environ)\n"
    )
    test = "def check(candidate):\n    assert candidate() == ['HOME', 'LANG', 'LC_ALL', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', 'PWD', 'TMPDIR']\n"
    first = check_solution(call_check(body, test), FAST)
    assert first.passed, first.reason
    second = check_solution(call_check(body, test), FAST)  # the file the first one wrote is not there
    assert second.passed, second.reason
    workdir = first.stdout.strip()
    if report["mount_namespace"]:
        assert workdir == "/tmp/sandbox"
    assert not Path(workdir, "left_behind.txt").exists()


def test_stdlib_threads_and_processes_work():
    solution = (
        "import threading\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "def square(x):\n"
        "    return x * x\n"
        "def f(n):\n"
        "    t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "    with ProcessPoolExecutor(2) as pool:\n"
        "        return list(pool.map(square, range(n)))\n"
    )
    result = check_solution(Check(solution, "def check(candidate):\n    assert candidate(5) == [0, 1, 4, 9, 16]\n", "f"),
                            SandboxLimits(wall_seconds=10, max_processes=16))
    assert result.passed, result.reason + result.stderr


def test_site_packages_are_importable_on_both_sides():
    pytest.importorskip("numpy")
    solution = "import numpy as np\ndef f():\n    return np.arange(4).sum(), np.float64(2.5), np.arange(3).tolist()\n"
    test = "import numpy as np\ndef check(candidate):\n    assert candidate() == (6, 2.5, [0, 1, 2])\n    assert np.isclose(candidate()[1], 2.5)\n"
    result = check_solution(Check(solution, test, "f"), SandboxLimits(wall_seconds=20))
    assert result.passed, result.reason + result.stderr


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxLimits(max_processes=-1)
    with pytest.raises(ValueError, match="max_message_bytes"):
        SandboxLimits(max_message_bytes=0)


def test_a_check_is_cheap():
    trivial = Check("def f():\n    return 1\n", "def check(candidate):\n    assert candidate() == 1\n", "f")
    check_solution(trivial, FAST)
    start = time.perf_counter()
    for _ in range(10):
        assert check_solution(trivial, FAST).passed
    per_check = (time.perf_counter() - start) / 10
    assert per_check < 0.5, f"{per_check * 1000:.0f} ms per trivial check"


# --------------------------------------------------------------------------------------------
# Batches


def test_check_solutions_keeps_order_and_runs_in_parallel():
    checks = [
        call_check(f"import time\nt0 = time.time()\ntime.sleep(0.4)\nprint(t0, time.time())\nreturn {i} % 2",
                   "def check(candidate):\n    assert candidate() == 0\n")
        for i in range(4)
    ]
    results = check_solutions(checks, FAST, workers=2)
    assert [r.passed for r in results] == [True, False, True, False]
    assert all("f() returned 1" in r.reason for r in results[1::2])
    spans = sorted(tuple(map(float, r.stdout.split())) for r in results)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), f"no two checks overlapped: {spans}"


def test_check_solutions_edge_cases():
    assert check_solutions([], FAST) == []
    with pytest.raises(ValueError, match="workers"):
        check_solutions([CANARY], FAST, workers=0)
    invalid = Check("x", "y", "f", invalid="the completion does not parse with its prompt")
    finished = []
    results = check_solutions([CANARY, call_check("assert False"), invalid], FAST, workers=4, on_result=finished.append)
    assert [r.status for r in results] == ["passed", "failed", "invalid"]
    assert results[2].reason == invalid.invalid and results[2].returncode is None
    assert sorted(map(id, finished)) == sorted(map(id, results))  # each result reported once, as its check finished


# --------------------------------------------------------------------------------------------
# The adversarial batch: limits

ADVERSARIAL = {
    "infinite_loop": call_check("while True:\n    pass"),
    "sleep_forever": call_check("import time\ntime.sleep(3600)"),
    "fork_bomb": call_check("import os\nwhile True:\n    os.fork()"),
    "fork_bomb_swallowing_errors": call_check("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    "allocate_10gb": call_check("x = bytearray(10 * 1024 ** 3)"),
    "allocate_gradually": call_check("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 6))"),
    "huge_file": call_check("with open('huge.bin', 'wb') as fh:\n    while True:\n        fh.write(b'x' * 2 ** 20)"),
    "fill_the_disk": call_check("i = 0\nwhile True:\n    open(f'f{i}.bin', 'wb').write(b'x' * 3 * 2 ** 20)\n    i += 1"),
    "delete_sentinel": call_check("import os\nos.remove(SENTINEL)"),
    "delete_tree": call_check("import shutil\nshutil.rmtree(SENTINEL_DIR)"),
    "write_world_writable": call_check("import os\nos.remove(WW_SENTINEL)"),
    "socket_to_host": call_check("import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2).sendall(b'escaped')"),
    "kill_parent": call_check("import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(0.5)"),
    "kill_parent_group": call_check("import os, signal, time\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\ntime.sleep(0.5)"),
    "kill_everything": call_check("import os, signal, time\nos.kill(-1, signal.SIGKILL)\ntime.sleep(0.5)"),
    "exit_before_asserts": load_check("import sys\nsys.exit(0)"),
    "print_100mb": call_check(
        "import sys\nsys.stdout.buffer.write(b'x' * 100_000_000)\nsys.stdout.flush()\n"
        "sys.stderr.buffer.write(b'y' * 100_000_000)\nassert False, 'after the flood'"
    ),
    "daemon_left_behind": call_check("import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', 'TOKEN'])\nreturn 1",
                                     "def check(candidate):\n    assert candidate() == 1\n"),
}
#: Adversarial checks that may legitimately pass: they answer correctly and leave a mess behind.
MAY_PASS = {"daemon_left_behind"}


def _substitute(check: Check, replace: dict[str, str]) -> Check:
    solution = check.solution
    for key, value in replace.items():
        solution = solution.replace(key, value)
    return Check(solution, check.test, check.entry_point)


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    """Run every adversarial check, each followed by a canary, as one batch."""
    tmp = tmp_path_factory.mktemp("adversarial")
    sentinel = tmp / "sentinel.txt"
    sentinel.write_text("keep me")
    # A world-writable directory without sticky bit outside /tmp: any uid may delete entries.
    ww_dir = ww_sentinel = None
    if Path("/var/tmp").is_dir():
        ww_dir = Path("/var/tmp") / f"atlas-sandbox-test-{uuid.uuid4().hex}"
        ww_dir.mkdir()
        os.chmod(ww_dir, 0o777)
        ww_sentinel = ww_dir / "sentinel.txt"
        ww_sentinel.write_text("keep me too")
        os.chmod(ww_sentinel, 0o666)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    token = f"{3600 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**8:08d}"
    bystander = subprocess.Popen(["sleep", "60"])  # a process of the test's own user
    replace = {
        "SENTINEL_DIR": repr(str(tmp)),
        "WW_SENTINEL": repr(str(ww_sentinel or "/nonexistent")),
        "SENTINEL": repr(str(sentinel)),
        "PORT": str(listener.getsockname()[1]),
        "TOKEN": token,
    }
    names, checks = [], []
    for name, check in ADVERSARIAL.items():
        names += [name, f"canary after {name}"]
        checks += [_substitute(check, replace), CANARY]
    tracemalloc.start()
    start = time.monotonic()
    try:
        results = check_solutions(checks, FAST, workers=2)
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        conn, _ = listener.accept()
        received = conn.recv(100)
        conn.close()
    except BlockingIOError:
        received = None
    listener.close()
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if token in cmdline(p)]
    bystander_alive = bystander.poll() is None
    bystander.kill()
    bystander.wait()
    yield {
        "results": dict(zip(names, results)),
        "elapsed": elapsed,
        "peak_traced_bytes": peak,
        "sentinel": sentinel,
        "ww_sentinel": ww_sentinel,
        "received": received,
        "leftovers": leftovers,
        "bystander_alive": bystander_alive,
    }
    if ww_dir is not None:
        shutil.rmtree(ww_dir, ignore_errors=True)


@pytest.mark.slow
def test_batch_finishes_quickly_and_every_canary_passes(adversarial):
    results = adversarial["results"]
    assert len(results) == 2 * len(ADVERSARIAL)
    for name, result in results.items():
        if name.startswith("canary"):
            assert result.passed and result.stdout.strip() == "canary", (name, result)
        elif name not in MAY_PASS:
            assert not result.passed, (name, result)
            assert result.reason and "\n" not in result.reason, (name, result)
    # Four checks run into the 3 s limits; two workers; generous for a loaded CI machine.
    assert adversarial["elapsed"] < 40


def test_infinite_loop_times_out(adversarial):
    # In the batch it competes for the CPUs, so either limit may come first.
    result = adversarial["results"]["infinite_loop"]
    assert result.status == "timeout", result
    assert "CPU time limit of 2 s" in result.reason or "wall-clock limit of 3 s" in result.reason
    assert result.wall_seconds < FAST.wall_seconds + 1.5


def test_infinite_loop_alone_hits_the_cpu_limit():
    result = check_solution(call_check("while True:\n    pass"), SandboxLimits(wall_seconds=8, cpu_seconds=1))
    assert result.status == "timeout" and "CPU time limit of 1 s exceeded" in result.reason, result
    assert result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_sleeping_solution_hits_the_wall_clock(adversarial):
    result = adversarial["results"]["sleep_forever"]
    assert result.status == "timeout" and "wall-clock limit of 3 s" in result.reason
    assert FAST.wall_seconds <= result.wall_seconds < FAST.wall_seconds + 1.5
    assert result.returncode == -signal.SIGKILL


def test_fork_bombs_are_contained(adversarial, report):
    if not report["processes_limited"]:
        pytest.skip(f"no process limit in sandbox mode {report['mode']!r}: {report['process_limit']}")
    bomb = adversarial["results"]["fork_bomb"]
    assert bomb.status == "failed" and "process limit 16" in bomb.reason, bomb
    swallowing = adversarial["results"]["fork_bomb_swallowing_errors"]
    assert swallowing.status == "timeout", swallowing


def test_huge_allocations_fail_with_memory(adversarial):
    for name in ("allocate_10gb", "allocate_gradually"):
        result = adversarial["results"][name]
        assert result.status == "memory" and "MemoryError" in result.reason and "256 MB" in result.reason, result


def test_huge_file_hits_the_file_size_limit(adversarial):
    result = adversarial["results"]["huge_file"]
    assert "File too large" in result.reason or "SIGXFSZ" in result.reason, result
    assert "file size limit 4 MB" in result.reason or "file size limit of 4 MB" in result.reason


def test_filling_the_disk_stops_at_the_private_tmpfs(adversarial, report):
    if not report["mount_namespace"]:
        pytest.skip("no mount namespace: the work directory is on the host filesystem (per-file limit only)")
    result = adversarial["results"]["fill_the_disk"]
    assert result.status in ("failed", "memory") and ("No space left on device" in result.reason or "memory limit" in result.reason), result


def test_files_outside_the_sandbox_survive(adversarial, report):
    if not (report["filesystem_protected"] or report["uid_inside"] != os.geteuid()):
        pytest.skip(f"sandbox mode {report['mode']!r} runs solutions as this user without a read-only filesystem")
    assert adversarial["sentinel"].read_text() == "keep me"
    for name in ("delete_sentinel", "delete_tree"):
        assert adversarial["results"][name].status == "failed"


def test_world_writable_directories_are_out_of_reach(adversarial, report):
    if not report["filesystem_protected"]:
        pytest.skip(f"sandbox mode {report['mode']!r} leaves world-writable host directories writable")
    if adversarial["ww_sentinel"] is None:
        pytest.skip("no /var/tmp on this machine")
    assert adversarial["ww_sentinel"].read_text() == "keep me too"
    result = adversarial["results"]["write_world_writable"]
    assert "Read-only file system" in result.reason or "No such file or directory" in result.reason, result


def test_no_network(adversarial, report):
    if not report["network_isolated"]:
        pytest.skip(f"no network isolation: {report['network']}")
    result = adversarial["results"]["socket_to_host"]
    assert result.status == "failed" and "no network in the sandbox" in result.reason, result
    assert adversarial["received"] is None


def test_network_flag_keeps_the_host_network(report):
    if not report["network_namespace"]:
        pytest.skip("no network namespace to leave out")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    check = call_check(f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2).close()")
    try:
        assert check_solution(check, SandboxLimits(wall_seconds=5, network=True)).passed
        assert not check_solution(check, SandboxLimits(wall_seconds=5)).passed
    finally:
        listener.close()


def test_killing_the_parent_costs_only_the_check(adversarial, report):
    if not report["signals_contained"]:
        pytest.skip(f"sandbox mode {report['mode']!r} runs solutions as this user without a PID namespace")
    assert adversarial["bystander_alive"], "a process of the test's user was killed"
    for name in ("kill_parent", "kill_parent_group", "kill_everything"):
        assert not adversarial["results"][name].passed


def test_exit_before_the_asserts_is_not_a_pass(adversarial):
    result = adversarial["results"]["exit_before_asserts"]
    assert result.status == "failed" and "sys.exit(0)" in result.reason


def test_output_flood_is_capped(adversarial):
    result = adversarial["results"]["print_100mb"]
    assert result.status == "failed" and "after the flood" in result.reason
    assert result.stdout.startswith("x" * FAST.max_output_bytes) and "more bytes dropped" in result.stdout
    assert len(result.stdout) < FAST.max_output_bytes + 100 and len(result.stderr) < FAST.max_output_bytes + 100
    assert adversarial["peak_traced_bytes"] < 20 * 2**20, adversarial["peak_traced_bytes"]


def test_no_process_outlives_its_check(adversarial):
    assert adversarial["results"]["daemon_left_behind"].status in ("passed", "failed")
    assert not adversarial["leftovers"], adversarial["leftovers"]


# --------------------------------------------------------------------------------------------
# Isolation modes


def test_isolation_report_is_consistent(report):
    assert report["mode"] in sandbox.isolation.MODES and report["separate_test_process"]
    if report["mode"] in ("bwrap", "bwrap-userns"):
        assert report["network_namespace"] and report["pid_namespace"] and report["mount_namespace"]
        assert report["probe"]["ppid"] == 1 and report["probe"]["interfaces"] == ["lo"]
        assert report["probe"]["cwd"] == "/tmp/sandbox" and report["probe"]["mounts_left_writable"] == []
        assert report["files_hidden"] and report["visible_host_paths"] == []
    if report["mode"] == "bwrap":
        assert report["uid_inside"] != 0 and report["filesystem_protected"] and report["network_isolated"]
    assert {"json", "decimal", "ctypes"} <= set(report["imports_checked"])
    copy = isolation_report()
    copy["mode"] = "changed"
    assert isolation_report()["mode"] == report["mode"]  # a copy each time


@pytest.fixture
def forced_mode(monkeypatch):
    def force(mode: str) -> None:
        monkeypatch.setenv("ATLAS_SANDBOX_MODE", mode)
        sandbox.probe.reset()

    yield force
    monkeypatch.delenv("ATLAS_SANDBOX_MODE", raising=False)
    sandbox.probe.reset()


def _userns_bwrap_available() -> bool:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    return subprocess.run([bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
def test_user_namespace_mode(forced_mode, tmp_path):
    if not _userns_bwrap_available():
        pytest.skip("bubblewrap with user namespaces is not available here")
    forced_mode("bwrap-userns")
    report = isolation_report()
    assert report["mode"] == "bwrap-userns" and report["network_isolated"] and report["files_hidden"]
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep")
    checks = [
        CANARY,
        call_check(f"import os\nos.remove({str(sentinel)!r})"),
        call_check(f"open({str(Path.home() / 'atlas-sandbox-probe')!r}, 'w')"),
        call_check("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"),
        # The mounts belong to bubblewrap's namespace: no capability to make them writable.
        call_check("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nassert libc.mount(None, b'/usr', None, ctypes.c_ulong(32 | 4096), None) == 0"),
        call_check("import sys\nsys.exit(0)"),
        call_check("while True:\n    pass"),
    ]
    results = check_solutions(checks, FAST, workers=2)
    assert [r.status for r in results] == ["passed", "failed", "failed", "failed", "failed", "failed", "timeout"], results
    assert sentinel.read_text() == "keep"
    assert "No such file or directory" in results[1].reason and "no network" in results[3].reason


@pytest.mark.slow
def test_plain_mode_runs_benign_checks(forced_mode):
    forced_mode("plain")
    report = isolation_report()
    assert report["mode"] == "plain" and not report["network_namespace"] and not report["files_hidden"]
    token = f"{3600 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**8:08d}"
    checks = [
        call_check("import os\nprint(os.getcwd())\nopen('scratch.txt', 'w').write('x')"),
        call_check("assert False"),
        call_check("import sys\nsys.exit(0)"),
        call_check("import time\ntime.sleep(30)"),
        call_check(f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{token}'])"),
        call_check(f"import os, time\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{token}'])\ntime.sleep(30)"),
    ]
    results = check_solutions(checks, FAST, workers=2)
    assert [r.status for r in results] == ["passed", "failed", "failed", "timeout", "passed", "timeout"], results
    workdir = Path(results[0].stdout.strip())
    assert workdir.name.startswith("atlas-sandbox-") and not workdir.exists()
    assert not [p for p in Path("/proc").glob("[0-9]*") if token in cmdline(p)]


def test_unknown_mode_is_a_sandbox_error(forced_mode):
    forced_mode("chroot")
    result = check_solution(CANARY, FAST)
    assert result.status == "sandbox_error" and "unknown sandbox mode 'chroot'" in result.reason
    with pytest.raises(RuntimeError, match="chroot"):
        isolation_report()


def test_missing_bubblewrap_is_named_and_root_never_falls_back_to_plain(forced_mode, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("root-only fallback order")
    monkeypatch.delenv("ATLAS_SANDBOX_MODE", raising=False)
    assert "plain" not in sandbox.isolation.MODES_ROOT
    real_which = shutil.which
    monkeypatch.setattr(sandbox.isolation.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    monkeypatch.setattr(sandbox.isolation, "interpreter_dirs", lambda: ["/nonexistent-unreachable/python"])
    monkeypatch.setattr(sandbox.isolation, "hidden_ancestors", lambda paths: ["/nonexistent-unreachable"])
    sandbox.probe.reset()
    result = check_solution(CANARY, FAST)
    assert result.status == "sandbox_error"
    assert "bubblewrap (the bwrap program) is not installed" in result.reason and "cannot traverse" in result.reason


def test_the_sandbox_module_does_not_import_heavy_libraries():
    code = "import sys\nimport sandbox\nprint(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
