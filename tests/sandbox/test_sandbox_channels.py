"""Channels between checks: state one check leaves for a later check, or shares with one running beside it.

Each channel is a writer (a solution that stores a secret, and reports whether it could) and a
reader (a later check, or one running at the same time, that looks for it). Through the real check
path, the writer may succeed inside its own sandbox; the reader must find nothing.
"""

from __future__ import annotations

import pytest

from sandbox import SandboxLimits, check_solutions, isolation_report
from tests.sandbox.sandbox_helpers import call_check

pytestmark = pytest.mark.sandbox

LIMITS = SandboxLimits(wall_seconds=15, cpu_seconds=5, memory_mb=512, max_processes=32)
SECRET = "atlas-channel-4a7"
LIBC = "import ctypes, os, socket, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
KEY = 0x41544C53  # SysV IPC key

#: name -> (writer body, reader body, needs a mount namespace). The writer returns True when it stored the secret
#: (in its own sandbox); the reader returns what it found (None: nothing).
SEQUENTIAL = {
    "sysv shared memory": (
        LIBC + f"shm = libc.shmget({KEY}, 4096, 0o1666)\nreturn shm >= 0\n",
        LIBC + f"return libc.shmget({KEY}, 0, 0) if libc.shmget({KEY}, 0, 0) >= 0 else None\n",
        True,
    ),
    "sysv message queue": (
        LIBC + f"return libc.msgget({KEY}, 0o1666) >= 0\n",
        LIBC + f"return libc.msgget({KEY}, 0) if libc.msgget({KEY}, 0) >= 0 else None\n",
        True,
    ),
    "sysv semaphore": (
        LIBC + f"return libc.semget({KEY}, 1, 0o1666) >= 0\n",
        LIBC + f"return libc.semget({KEY}, 0, 0) if libc.semget({KEY}, 0, 0) >= 0 else None\n",
        True,
    ),
    "file in /dev/shm": (
        f"open('/dev/shm/{SECRET}', 'w').write('4')\nreturn True\n",
        "import os\nreturn os.listdir('/dev/shm') or None\n",
        True,
    ),
    "file in /tmp": (
        f"open('/tmp/{SECRET}', 'w').write('4')\nreturn True\n",
        f"import os\nreturn [p for p in os.listdir('/tmp') + os.listdir('/tmp/sandbox') if '{SECRET}' in p] or None\n",
        True,
    ),
    "file in the work directory": (
        f"open('{SECRET}', 'w').write('4')\nreturn True\n",
        f"import os\nreturn [p for p in os.listdir('.') if '{SECRET}' in p] or None\n",
        False,
    ),
    "writable place on the root": (
        ("import os\nfor d in ('/', '/var/tmp', '/run', '/usr/lib', '/run/atlas-sandbox', os.path.dirname(os.__file__)):\n"
        f"    try:\n        open(os.path.join(d, '{SECRET}'), 'w').write('4')\n        return True\n"
        "    except OSError:\n        pass\nreturn False\n"),
        ("import os\nfor d in ('/', '/var/tmp', '/run', '/usr/lib', '/run/atlas-sandbox', os.path.dirname(os.__file__)):\n"
        f"    if os.path.exists(os.path.join(d, '{SECRET}')):\n        return d\nreturn None\n"),
        False,
    ),
    "host name": (
        f"import socket\ntry:\n    socket.sethostname('{SECRET}')\n    return True\nexcept OSError:\n    return False\n",
        f"import socket\nreturn socket.gethostname() if socket.gethostname() == '{SECRET}' else None\n",
        True,
    ),
}

#: name -> (writer body that holds a resource for about 3 s, reader body run 1 s later, needs a mount namespace).
CONCURRENT = {
    "abstract unix socket": (
        ("import socket, time\ns = socket.socket(socket.AF_UNIX)\n"
        f"s.bind('\\0{SECRET}')\ns.listen(1)\ntime.sleep(3)\nreturn True\n"),
        ("import socket, time\ntime.sleep(1)\ns = socket.socket(socket.AF_UNIX)\n"
        f"try:\n    s.connect('\\0{SECRET}')\n    return 'connected'\nexcept OSError:\n    return None\n"),
        True,
    ),
    "loopback port": (
        "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 47311))\ns.listen(1)\ntime.sleep(3)\nreturn True\n",
        ("import socket, time\ntime.sleep(1)\ntry:\n    socket.create_connection(('127.0.0.1', 47311), timeout=1)\n"
        "    return 'connected'\nexcept OSError:\n    return None\n"),
        True,
    ),
    "named pipe in /tmp": (
        f"import os, time\nos.mkfifo('/tmp/{SECRET}')\ntime.sleep(3)\nreturn True\n",
        f"import os, time\ntime.sleep(1)\nreturn '/tmp/{SECRET}' if os.path.exists('/tmp/{SECRET}') else None\n",
        True,
    ),
    "the other check's processes": (
        "import time\ntime.sleep(3)\nreturn True\n",
        ("import os, time\ntime.sleep(1)\n"
        "mine = {os.getpid(), os.getppid()}\n"
        "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine and int(p) > 2]\n"
        "return others or None\n"),
        True,
    ),
}


def _writer_test() -> str:
    return "def check(candidate):\n    assert candidate() in (True, False)\n"


def _reader_test() -> str:
    return "def check(candidate):\n    found = candidate()\n    assert found is None, found\n"


@pytest.fixture(scope="module")
def report() -> dict:
    return isolation_report()


def _writer_then_reader(report: dict, channel: tuple, workers: int) -> None:
    """Run the channel's writer and reader (one after the other with one worker, side by side with two)."""
    writer, reader, needs_namespaces = channel
    if needs_namespaces and not report["mount_namespace"]:
        pytest.skip(f"mode {report['mode']!r} has no namespaces of its own")
    checks = [call_check(writer, _writer_test()), call_check(reader, _reader_test())]
    wrote, read = check_solutions(checks, LIMITS, workers=workers)
    assert wrote.passed, wrote
    assert read.passed, read.reason


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_a_later_check_finds_nothing_left(report, name):
    _writer_then_reader(report, SEQUENTIAL[name], workers=1)


@pytest.mark.parametrize("name", CONCURRENT)
def test_a_check_running_beside_finds_nothing(report, name):
    _writer_then_reader(report, CONCURRENT[name], workers=2)
