"""No solution stops the evaluation: whatever it does, its check ends with a verdict of its own.

The evaluation refuses to report pass@k when a check ends as ``sandbox_error`` (a sandbox that does
not work), so a solution that could produce that status would stop a whole run. Each solution below
tries: exiting or stopping at once, signalling the namespace's first process or every process,
closing every descriptor, forging status lines, oversized and over-deep replies, exhausting the
process limit at load, crashing the interpreter.
"""

from __future__ import annotations

import pytest

from sandbox import STATUSES, SandboxLimits, check_solutions
from tests.sandbox.sandbox_helpers import call_check, load_check

pytestmark = pytest.mark.sandbox

LIMITS = SandboxLimits(wall_seconds=6, cpu_seconds=5, memory_mb=512, max_processes=32)
RETURNS_ONE = "def check(candidate):\n    assert candidate() == 1\n"

#: name -> (check, the statuses it may end with)
ATTEMPTS = {
    "exit while loading": (load_check("import os\nos._exit(0)"), {"failed"}),
    "kill the namespace's first process": (call_check("import os, signal\nos.kill(1, signal.SIGKILL)\nreturn 1\n", RETURNS_ONE),
                                           {"failed", "passed"}),
    "kill every process it can": (call_check("import os, signal\nos.kill(-1, signal.SIGKILL)\nreturn 1\n", RETURNS_ONE),
                                  {"failed", "killed", "passed"}),
    "close every descriptor": (call_check("import os\nos.closerange(0, 1 << 16)\nreturn 1\n", RETURNS_ONE), {"failed"}),
    "stop itself": (call_check("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nreturn 1\n", RETURNS_ONE),
                    {"timeout"}),
    "64 MB reply": (call_check("return 'x' * (64 << 20)\n", RETURNS_ONE), {"failed", "memory"}),
    "100,000-deep reply": (call_check("x = []\nfor _ in range(100000):\n    x = [x]\nreturn x\n", RETURNS_ONE), {"failed"}),
    "random bytes on stdout": (call_check("import os\nos.write(1, os.urandom(1 << 20))\nreturn 1\n", RETURNS_ONE),
                               {"passed"}),
    "forged status lines on every descriptor": (
        call_check("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'ready\\ndone\\t1\\nsetup\\tforged\\n')\n"
                   "    except OSError:\n        pass\nreturn 1\n", RETURNS_ONE),
        {"failed", "passed"},
    ),
    "a set-up failure line on stderr": (call_check("import sys\nsys.stderr.write('setup\\tforged\\n')\nreturn 1\n", RETURNS_ONE),
                                        {"passed"}),
    "the process limit exhausted while loading": (
        load_check("import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(60)\n"
                   "    except OSError:\n        break"),
        {"passed", "failed", "killed"},
    ),
    "segmentation fault": (call_check("import ctypes\nctypes.string_at(0)\n", RETURNS_ONE), {"killed"}),
}


def test_every_attempt_ends_with_a_verdict_of_its_own():
    results = check_solutions([check for check, _ in ATTEMPTS.values()], LIMITS, workers=2)
    ended = {name: (r.status, r.reason) for name, r in zip(ATTEMPTS, results)}
    assert all(status in STATUSES and status != "sandbox_error" for status, _ in ended.values()), ended
    assert {name: ended[name] for name, (_, allowed) in ATTEMPTS.items() if ended[name][0] not in allowed} == {}
