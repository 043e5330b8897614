"""Checks built from plain programs, for the sandbox tests.

A hostile program runs either when the solution is called (``call_check``: the program is the
body of the function under test, the most common place for a model's code) or while the
solution module loads (``load_check``: top-level statements of a whole-function answer).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from sandbox import Check

CALL_TEST = "def check(candidate):\n    candidate()\n"
CANARY = Check(solution="def f(x):\n    print('canary')\n    return sum(range(x))\n",
               test="def check(candidate):\n    assert candidate(10) == 45\n", entry_point="f")


def call_check(body: str, test: str = CALL_TEST) -> Check:
    """A check whose solution function ``f()`` runs ``body``; the test calls it once."""
    return Check(solution="def f():\n" + textwrap.indent(body, "    ") + "\n", test=test, entry_point="f")


def load_check(program: str) -> Check:
    """A check whose solution module runs ``program`` at load, then defines ``f`` returning 1."""
    return Check(solution=program + "\n\ndef f():\n    return 1\n", test="def check(candidate):\n    assert candidate() == 1\n",
                 entry_point="f")


def cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
