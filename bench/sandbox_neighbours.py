"""What a hostile neighbour costs the checks beside it: verdicts and check times with and without one.

    python -m bench.sandbox_neighbours                 # every neighbour below
    python -m bench.sandbox_neighbours --only setsid_forks,process_pool

Each neighbour is a solution that tries to take the CPU (busy processes in sessions of their own,
threads, pools, exec'd programs, daemons that outlive their check, a fork bomb, memory and tmpfs
traffic, a raised priority). It runs in one of two workers of ``check_solutions`` while the other
worker checks, one after another:

- a **slow correct** solution (counting primes, sized to about ``--slow-seconds`` of CPU here)
  under a wall limit of 3x that: its verdict must stay ``passed``;
- the first ``--ordinary`` canonical solutions of the micro benchmark's dev split: the median check time beside the
  neighbour, over the same median with nothing beside them (measured in the same process, first).

Reported per neighbour: the slow solution's verdict and seconds, the ordinary checks' median
milliseconds and its ratio to the quiet median, and the neighbour's own status.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time

import torch

from bench.common import REPO, environment, table, write_json
from experiments.evaluation.code_completion import build_check
from sandbox import Check, SandboxLimits, check_solution, isolation_report

SCRIPT = "sandbox_neighbours"

_SPIN = "while True:\n    pass\n"
_BODY = "import os, sys, time, signal, subprocess, threading, multiprocessing\n"


def _indent(code: str, n: int) -> str:
    return "\n".join((" " * n + line) if line else line for line in code.splitlines()) + "\n"


def _fork_each(body: str, count: int = 8, setsid: bool = True) -> str:
    inner = ("os.setsid()\n" if setsid else "") + body
    return f"for _ in range({count}):\n    if os.fork() == 0:\n{_indent(inner, 8)}"


#: name -> the body of the neighbour's function (it runs when the test calls it), or ("load", program) for a
#: program that runs while the solution module loads.
NEIGHBOURS: dict[str, str | tuple[str, str]] = {
    "setsid_forks": _fork_each(_SPIN) + _SPIN,
    "plain_forks": _fork_each(_SPIN, setsid=False) + _SPIN,
    "threads": "for _ in range(8):\n    threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()\n" + _SPIN,
    "process_pool": "with multiprocessing.Pool(16) as pool:\n    pool.map(sum, [range(10 ** 12)] * 16)\n",
    "exec_programs": "procs = [subprocess.Popen(['yes'], stdout=subprocess.DEVNULL) for _ in range(8)]\n" + _SPIN,
    "all_cores_affinity": "os.sched_setaffinity(0, range(os.cpu_count()))\n" + _fork_each(_SPIN) + _SPIN,
    "fork_to_the_limit": ("while True:\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
                          "    if pid == 0:\n        os.setsid()\n" + _indent(_SPIN, 8) + _SPIN),
    "daemons_outliving_the_check": (_fork_each("if os.fork() == 0:\n" + _indent(_SPIN, 4) + "os._exit(0)\n")
                                   + "time.sleep(0.5)\nreturn 1\n"),
    "at_module_load": ("load", "import os\n" + _fork_each(_SPIN) + "while True:\n    pass\n"),
    "memory_traffic": _fork_each("a = bytearray(64 << 20)\nwhile True:\n    b = bytes(a)\n", count=4) + _SPIN,
    "tmpfs_traffic": _fork_each("while True:\n    with open('/tmp/sandbox/x%d' % os.getpid(), 'wb') as f:\n"
                                "        f.write(b'x' * (4 << 20))\n    os.unlink('/tmp/sandbox/x%d' % os.getpid())\n", count=4)
                     + _SPIN,
    "raised_priority": ("for call in (lambda: os.nice(-19), lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50)),\n"
                        "             lambda: os.setpriority(os.PRIO_PGRP, 0, -20)):\n    try:\n        call()\n    except OSError:\n"
                        "        pass\n" + _fork_each(_SPIN) + _SPIN),
}


def neighbour_check(name: str) -> Check:
    spec = NEIGHBOURS[name]
    if isinstance(spec, tuple):
        return Check(solution=spec[1] + "\n\ndef f():\n    return 1\n", test="def check(candidate):\n    candidate()\n",
                     entry_point="f")
    return Check(solution=_BODY + "\n\ndef f():\n" + _indent(spec, 4), test="def check(candidate):\n    candidate()\n",
                 entry_point="f")


def slow_correct(seconds: float) -> Check:
    """A correct solution that needs about ``seconds`` of one CPU here (counting primes below n)."""

    def count(n: int) -> int:
        return sum(1 for k in range(2, n) if all(k % d for d in range(2, math.isqrt(k) + 1)))

    n = 20000
    while True:
        start = time.process_time()
        expected = count(n)
        if time.process_time() - start >= seconds or n > 10_000_000:
            break
        n = int(n * 1.4)
    solution = "def count_primes(n):\n    return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))\n"
    return Check(solution, f"def check(candidate):\n    assert candidate({n}) == {expected}\n", "count_primes")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated neighbour names (default: all)")
    ap.add_argument("--ordinary", type=int, default=24, help="ordinary checks per neighbour (micro dev canonical solutions)")
    ap.add_argument("--slow-seconds", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = list(NEIGHBOURS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in NEIGHBOURS]
    if unknown:
        raise SystemExit(f"error: --only={','.join(unknown)} is not allowed: names among {', '.join(NEIGHBOURS)}")

    path = REPO / "assets" / "micro" / "data" / "code" / "dev.jsonl"  # dev: a measurement of the sandbox, not a result
    problems = [json.loads(line) for line in path.read_text().splitlines()][: args.ordinary]
    ordinary = [build_check(p, p["canonical_solution"]) for p in problems]
    slow = slow_correct(args.slow_seconds)
    report = isolation_report()
    slow_limits = SandboxLimits(wall_seconds=3 * args.slow_seconds + 1, cpu_seconds=60, memory_mb=512, max_processes=32)
    limits = SandboxLimits(wall_seconds=10, cpu_seconds=10, memory_mb=512, max_processes=32)

    alone = check_solution(slow, slow_limits)
    quiet = [check_solution(c, limits) for c in ordinary]  # one after another, as beside a neighbour below
    assert alone.passed and all(r.passed for r in quiet), "the checks must pass with nothing beside them"
    quiet_ms = statistics.median(r.wall_seconds for r in quiet) * 1e3

    rows, out = [], {}
    for name in names:
        # One worker holds the neighbour; the other checks the slow solution, then the ordinary ones.
        neighbour_limits = SandboxLimits(wall_seconds=slow_limits.wall_seconds + 4, cpu_seconds=60, memory_mb=512, max_processes=32)
        results: dict[str, object] = {}

        def run_neighbour(name: str, limits: SandboxLimits, results: dict) -> None:
            results["neighbour"] = check_solution(neighbour_check(name), limits)

        thread = threading.Thread(target=run_neighbour, args=(name, neighbour_limits, results))
        thread.start()
        time.sleep(0.5)  # the neighbour's processes are up
        victim = check_solution(slow, slow_limits)
        beside = [check_solution(c, limits) for c in ordinary]
        thread.join()
        neighbour = results["neighbour"]
        ms = statistics.median(r.wall_seconds for r in beside) * 1e3
        out[name] = {"slow_status": victim.status, "slow_seconds": victim.wall_seconds, "slow_reason": victim.reason,
                     "ordinary_passed": sum(r.passed for r in beside), "ordinary_median_ms": ms,
                     "ordinary_ratio": ms / quiet_ms, "neighbour_status": neighbour.status}
        rows.append([name, victim.status, f"{victim.wall_seconds:.2f}", f"{sum(r.passed for r in beside)}/{len(beside)}",
                     f"{ms:.0f}", f"{ms / quiet_ms:.2f}", neighbour.status])
        print(table(["neighbour", "slow correct", "s", "ordinary passed", "median ms", "x quiet", "neighbour"], rows[-1:]),
              flush=True)
    print(f"\nquiet: slow correct {alone.wall_seconds:.2f} s; ordinary median {quiet_ms:.0f} ms "
          f"({len(ordinary)} micro dev canonical checks, one after another); sandbox mode {report['mode']!r}, "
          f"cpu bounded per check: {report.get('cpu_bounded_in_total')}")
    print(table(["neighbour", "slow correct", "s", "ordinary passed", "median ms", "x quiet", "neighbour"], rows))
    write_json(args.out, SCRIPT, {
        "sandbox_mode": report["mode"], "cpu_bounded_in_total": report.get("cpu_bounded_in_total"),
        "quiet": {"slow_seconds": alone.wall_seconds, "ordinary_median_ms": quiet_ms, "n_ordinary": len(ordinary)},
        "neighbours": out, "environment": environment(torch.device("cpu")),
    })


if __name__ == "__main__":
    main()
