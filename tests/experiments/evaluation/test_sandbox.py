"""The sandbox: results and reasons, and an adversarial batch that must cost only its own problems.

The adversarial programs run as one batch through ``check_programs`` (two workers), each
followed by a canary that must pass, with small limits so the file stays well under a minute.
Protections a machine cannot give (no namespaces, no unprivileged uid) are skipped according
to ``isolation_report()``, whose claims are what these tests check.
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

from experiments.evaluation import sandbox
from experiments.evaluation.sandbox import ExecutionResult, SandboxLimits, check_program, check_programs, isolation_report

FAST = SandboxLimits(wall_seconds=3.0, cpu_seconds=2, memory_mb=256, file_size_mb=4, max_output_bytes=4096, max_processes=16)
CANARY = "assert sum(range(10)) == 45\nprint('canary')\n"


@pytest.fixture(scope="module")
def report() -> dict:
    return isolation_report()


# --------------------------------------------------------------------------------------------
# Ordinary results


def test_passing_program_reports_passed_with_output():
    result = check_program("x = 2 + 2\nassert x == 4\nprint('four', x)\n", FAST)
    assert isinstance(result, ExecutionResult)
    assert (result.passed, result.status, result.reason, result.returncode) == (True, "passed", "", 0)
    assert result.stdout.strip() == "four 4"
    assert 0 < result.wall_seconds < FAST.wall_seconds


def test_failed_assertion_names_the_line():
    result = check_program("def f(x):\n    return x\nassert f(1) == 2\n", FAST)
    assert (result.passed, result.status) == (False, "failed")
    assert result.reason.startswith("AssertionError") and "line 3: assert f(1) == 2" in result.reason
    assert "\n" not in result.reason


@pytest.mark.parametrize(
    "program, expected",
    [
        ("undefined_name + 1\n", "NameError: name 'undefined_name' is not defined"),
        ("def f(:\n    pass\n", "SyntaxError"),
        ("raise ValueError('bad value')\n", "ValueError: bad value"),
        ("def f(n):\n    return f(n + 1)\nf(0)\n", "RecursionError"),
        ("x = input()\n", "EOFError"),
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ],
)
def test_exceptions_fail_with_type_and_message(program, expected):
    result = check_program(program, FAST)
    assert result.status == "failed" and not result.passed
    assert expected in result.reason


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\nassert False\n",
        "import sys\nsys.exit()\nassert False\n",
        "raise SystemExit\n",
        "import os\nos._exit(0)\nassert False\n",
        "import os\nos.closerange(3, 4096)\n",  # closing the status pipe cannot turn into a pass
    ],
)
def test_exiting_early_with_status_zero_is_not_a_pass(program):
    result = check_program(program, FAST)
    assert result.status == "failed" and not result.passed
    assert "before" in result.reason or "Errno" in result.reason


def test_nonzero_exit_code_is_reported():
    result = check_program("import sys\nsys.exit(3)\n", FAST)
    assert result.status == "failed" and result.returncode == 3 and "sys.exit(3)" in result.reason


def test_a_forked_child_reaching_the_end_does_not_count():
    program = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid:\n"
        "    os.waitpid(pid, 0)\n"
        "    raise AssertionError('the original process fails')\n"
    )
    result = check_program(program, FAST)
    assert result.status == "failed" and "the original process fails" in result.reason


def test_segfault_is_killed_with_the_signal_named():
    result = check_program("import ctypes\nctypes.string_at(0)\n", FAST)
    assert result.status == "killed" and "SIGSEGV" in result.reason and result.returncode == -signal.SIGSEGV


def test_environment_is_scrubbed_and_directory_private(monkeypatch):
    monkeypatch.setenv("ATLAS_TEST_SECRET", "do-not-leak")
    program = (
        "import os, sys, tempfile\n"
        "assert 'ATLAS_TEST_SECRET' not in os.environ, 'environment leaked'\n"
        "cwd = os.getcwd()\n"
        "assert os.environ['HOME'] == cwd == os.environ['TMPDIR'] == tempfile.gettempdir(), cwd\n"
        "assert sorted(os.listdir(cwd)) == ['program.py'], os.listdir(cwd)\n"
        "assert sys.flags.isolated == 1 and sys.flags.no_site == 1\n"
        "open('left_behind.txt', 'w').write('x')\n"
        "print(cwd)\n"
    )
    first = check_program(program, FAST)
    assert first.passed, first.reason
    second = check_program(program, FAST)  # the file the first one wrote is not there
    assert second.passed, second.reason
    workdir = first.stdout.strip()
    if isolation_report()["mount_namespace"]:
        assert workdir == "/tmp/sandbox"
    assert not Path(workdir, "left_behind.txt").exists()


def test_stdlib_threads_and_processes_work():
    program = (
        "import json, re, collections, threading\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "def square(x):\n"
        "    return x * x\n"
        "if __name__ == '__main__':\n"
        "    t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "    with ProcessPoolExecutor(2) as pool:\n"
        "        assert list(pool.map(square, range(5))) == [0, 1, 4, 9, 16]\n"
    )
    result = check_program(program, SandboxLimits(wall_seconds=10, max_processes=16))
    assert result.passed, result.reason + result.stderr


def test_site_packages_are_importable():
    pytest.importorskip("numpy")
    result = check_program("import numpy as np\nassert int(np.arange(4).sum()) == 6\n", SandboxLimits(wall_seconds=10))
    assert result.passed, result.reason + result.stderr


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxLimits(max_processes=-1)


def test_launch_is_cheap():
    check_program("pass", FAST)
    start = time.perf_counter()
    for _ in range(10):
        assert check_program("pass", FAST).passed
    per_program = (time.perf_counter() - start) / 10
    assert per_program < 0.5, f"{per_program * 1000:.0f} ms per trivial program"


# --------------------------------------------------------------------------------------------
# Batches


def test_check_programs_keeps_order_and_runs_in_parallel():
    programs = [
        f"import time\nt0 = time.time()\ntime.sleep(0.4)\nprint(t0, time.time())\nassert {i} % 2 == 0\n" for i in range(4)
    ]
    results = check_programs(programs, FAST, workers=2)
    assert [r.passed for r in results] == [True, False, True, False]
    assert all("assert 1 % 2 == 0" in r.reason or "assert 3 % 2 == 0" in r.reason for r in results[1::2])
    spans = sorted(tuple(map(float, r.stdout.split())) for r in results)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), f"no two programs overlapped: {spans}"


def test_check_programs_edge_cases(capsys):
    assert check_programs([], FAST) == []
    with pytest.raises(ValueError, match="workers"):
        check_programs(["pass"], FAST, workers=0)
    results = check_programs(["pass", "assert False"], FAST, workers=4, progress=True)
    assert [r.status for r in results] == ["passed", "failed"]
    assert "sandbox" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The adversarial batch

ADVERSARIAL = {
    "infinite_loop": "while True:\n    pass\n",
    "sleep_forever": "import time\ntime.sleep(3600)\n",
    "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
    "fork_bomb_swallowing_errors": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "allocate_10gb": "x = bytearray(10 * 1024 ** 3)\n",
    "allocate_gradually": "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 6))\n",
    "huge_file": "with open('huge.bin', 'wb') as fh:\n    while True:\n        fh.write(b'x' * 2 ** 20)\n",
    "fill_the_disk": "i = 0\nwhile True:\n    open(f'f{i}.bin', 'wb').write(b'x' * 3 * 2 ** 20)\n    i += 1\n",
    "delete_sentinel": "import os, shutil\nos.remove(SENTINEL)\n",
    "delete_tree": "import shutil\nshutil.rmtree(SENTINEL_DIR)\n",
    "write_world_writable": "import os\nos.remove(WW_SENTINEL)\n",
    "socket_to_host": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2).sendall(b'escaped')\n",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(0.5)\nraise SystemExit(0)\n",
    "kill_parent_group": "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\nimport time\ntime.sleep(0.5)\n",
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(0.5)\nraise SystemExit(0)\n",
    "exit_before_asserts": "import sys\nsys.exit(0)\nassert 1 == 2\n",
    "print_100mb": (
        "import sys\nsys.stdout.buffer.write(b'x' * 100_000_000)\nsys.stdout.flush()\n"
        "sys.stderr.buffer.write(b'y' * 100_000_000)\nassert False, 'after the flood'\n"
    ),
    "daemon_left_behind": "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', 'TOKEN'])\n",
}
#: Adversarial programs that may legitimately pass: they end normally and leave a mess behind.
MAY_PASS = {"daemon_left_behind"}


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    """Run every adversarial program, each followed by a canary, as one batch."""
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
    names, programs = [], []
    for name, program in ADVERSARIAL.items():
        for key, value in replace.items():
            program = program.replace(key, value)
        names += [name, f"canary after {name}"]
        programs += [program, CANARY]
    tracemalloc.start()
    start = time.monotonic()
    try:
        results = check_programs(programs, FAST, workers=2)
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
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if token in _cmdline(p)]
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


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_batch_finishes_quickly_and_every_canary_passes(adversarial):
    results = adversarial["results"]
    assert len(results) == 2 * len(ADVERSARIAL)
    for name, result in results.items():
        if name.startswith("canary"):
            assert result.passed and result.stdout.strip() == "canary", (name, result)
        elif name not in MAY_PASS:
            assert not result.passed, (name, result)
            assert result.reason and "\n" not in result.reason, (name, result)
    # Three programs run into the 3 s limits; two workers; generous for a loaded CI machine.
    assert adversarial["elapsed"] < 30


def test_infinite_loop_times_out(adversarial):
    # In the batch it competes for the CPUs, so either limit may come first.
    result = adversarial["results"]["infinite_loop"]
    assert result.status == "timeout", result
    assert "CPU time limit of 2 s" in result.reason or "wall-clock limit of 3 s" in result.reason
    assert result.wall_seconds < FAST.wall_seconds + 1.5


def test_infinite_loop_alone_hits_the_cpu_limit():
    result = check_program("while True:\n    pass\n", SandboxLimits(wall_seconds=8, cpu_seconds=1))
    assert result.status == "timeout" and "CPU time limit of 1 s exceeded" in result.reason, result
    assert result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_sleeping_program_hits_the_wall_clock(adversarial):
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
    assert result.status == "failed" and "No space left on device" in result.reason, result


def test_files_outside_the_sandbox_survive(adversarial, report):
    if not (report["filesystem_protected"] or report["uid_inside"] != os.geteuid()):
        pytest.skip(f"sandbox mode {report['mode']!r} runs programs as this user without a read-only filesystem")
    assert adversarial["sentinel"].read_text() == "keep me"
    for name in ("delete_sentinel", "delete_tree"):
        assert adversarial["results"][name].status == "failed"


def test_world_writable_directories_are_read_only(adversarial, report):
    if not report["filesystem_protected"]:
        pytest.skip(f"sandbox mode {report['mode']!r} leaves world-writable host directories writable")
    if adversarial["ww_sentinel"] is None:
        pytest.skip("no /var/tmp on this machine")
    assert adversarial["ww_sentinel"].read_text() == "keep me too"
    result = adversarial["results"]["write_world_writable"]
    assert "Read-only file system" in result.reason, result


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
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2).close()\n"
    try:
        assert check_program(program, SandboxLimits(wall_seconds=5, network=True)).passed
        assert not check_program(program, SandboxLimits(wall_seconds=5)).passed
    finally:
        listener.close()


def test_killing_the_parent_costs_only_the_program(adversarial, report):
    if not report["signals_contained"]:
        pytest.skip(f"sandbox mode {report['mode']!r} runs programs as this user without a PID namespace")
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


def test_no_process_outlives_its_program(adversarial):
    assert adversarial["results"]["daemon_left_behind"].status in ("passed", "failed")
    assert not adversarial["leftovers"], adversarial["leftovers"]


# --------------------------------------------------------------------------------------------
# Isolation modes


def test_isolation_report_is_consistent(report):
    assert report["mode"] in ("namespaces", "userns", "setuid", "plain")
    if report["mode"] in ("namespaces", "userns"):
        assert report["network_namespace"] and report["pid_namespace"] and report["mount_namespace"]
        assert report["probe"]["ppid"] == 1 and report["probe"]["interfaces"] == ["lo"]
        assert report["probe"]["cwd"] == "/tmp/sandbox"
    if report["mode"] in ("namespaces", "userns"):
        assert report["probe"]["mounts_left_writable"] == []
    if report["mode"] == "namespaces":
        assert report["uid_inside"] != 0 and report["filesystem_protected"] and report["network_isolated"]
    copy = isolation_report()
    copy["mode"] = "changed"
    assert isolation_report()["mode"] == report["mode"]  # a copy each time


def _userns_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    return subprocess.run([unshare, "--user", "--map-root-user", "--net", "true"], capture_output=True).returncode == 0


@pytest.fixture
def forced_mode(monkeypatch):
    def force(mode: str) -> dict | None:
        monkeypatch.setenv("ATLAS_SANDBOX_MODE", mode)
        sandbox._reset_for_tests()
        return None

    yield force
    monkeypatch.delenv("ATLAS_SANDBOX_MODE", raising=False)
    sandbox._reset_for_tests()


def test_user_namespace_mode(forced_mode, tmp_path):
    if not _userns_available():
        pytest.skip("unprivileged user namespaces are not available here")
    forced_mode("userns")
    report = isolation_report()
    assert report["mode"] == "userns" and report["network_isolated"] and report["filesystem_protected"]
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep")
    programs = [
        CANARY,
        f"import os\nos.remove({str(sentinel)!r})\n",
        f"open({str(Path.home() / 'atlas-sandbox-probe')!r}, 'w')\n",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
        # The mounts belong to the outer user namespace: no capability to make them writable.
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nassert libc.mount(None, b'/', None, ctypes.c_ulong(32 | 4096), None) == 0\n",
        "import sys\nsys.exit(0)\n",
        "while True:\n    pass\n",
    ]
    results = check_programs(programs, FAST, workers=2)
    assert [r.status for r in results] == ["passed", "failed", "failed", "failed", "failed", "failed", "timeout"], results
    assert sentinel.read_text() == "keep"
    assert "Read-only file system" in results[2].reason and "no network" in results[3].reason


def test_plain_mode_runs_benign_programs(forced_mode):
    forced_mode("plain")
    report = isolation_report()
    assert report["mode"] == "plain" and not report["network_namespace"] and not report["mount_namespace"]
    program = "import os\nprint(os.getcwd())\nopen('scratch.txt', 'w').write('x')\n"
    token = f"{3600 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**8:08d}"
    daemon = f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{token}'])\n"
    sleeper = f"import os, time\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{token}'])\ntime.sleep(30)\n"
    programs = [program, "assert False", "import sys\nsys.exit(0)\n", "import time\ntime.sleep(30)\n", daemon, sleeper]
    results = check_programs(programs, FAST, workers=2)
    assert [r.status for r in results] == ["passed", "failed", "failed", "timeout", "passed", "timeout"], results
    workdir = Path(results[0].stdout.strip())
    assert workdir.name.startswith("atlas-sandbox-") and not workdir.exists()
    assert not [p for p in Path("/proc").glob("[0-9]*") if token in _cmdline(p)]


def test_unknown_mode_is_a_sandbox_error(forced_mode):
    forced_mode("chroot")
    result = check_program("pass", FAST)
    assert result.status == "sandbox_error" and "unknown sandbox mode 'chroot'" in result.reason
    with pytest.raises(RuntimeError, match="chroot"):
        isolation_report()


def test_root_never_falls_back_to_plain_by_itself(forced_mode, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("root-only fallback order")
    monkeypatch.delenv("ATLAS_SANDBOX_MODE", raising=False)
    assert "plain" not in sandbox._MODES_ROOT
    monkeypatch.setattr(sandbox, "_MODES_ROOT", ("setuid",))
    monkeypatch.setattr(sandbox, "_interpreter_dirs", lambda: ["/nonexistent-unreachable/python"])
    monkeypatch.setattr(sandbox, "_hidden_ancestors", lambda paths: (("/nonexistent-unreachable", tuple(paths)),))
    sandbox._reset_for_tests()
    result = check_program("pass", FAST)
    assert result.status == "sandbox_error" and "cannot traverse" in result.reason


def test_the_sandbox_module_does_not_import_heavy_libraries():
    code = "import sys\nimport experiments.evaluation.sandbox\nprint(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
