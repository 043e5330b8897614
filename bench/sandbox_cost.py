"""Cost of checking code in the sandbox, against the floor of one bare interpreter per program.

    python -m bench.sandbox_cost                     # the micro benchmark's 132 canonical solutions
    python -m bench.sandbox_cost --suite humaneval   # HumanEval (needs ../shared/data)

Variants, timed interleaved over whole batches with two workers each:

- `one_process`: `python -I -S -c <prompt + solution + test + check(entry_point)>` per problem,
  in a fresh interpreter with no isolation at all (the floor: what HumanEval's harness does in
  a forked child, minus its guard);
- `sandbox`: `check_solutions` on `build_check(problem, canonical_solution)` -- the test and the
  solution in two sandboxed processes (bubblewrap, namespaces, a cgroup, a leased uid each),
  values crossing as plain data.

Reported: seconds per batch (median of repeats), milliseconds per check, and the ratio
sandbox / one_process measured in the same process (ratios are comparable across machines,
absolute times are not). Every check of both variants must pass.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from bench.common import REPO, environment, interleaved, summary, table, write_json
from experiments.evaluation.code_completion import build_check
from sandbox import check_solutions, isolation_report

SCRIPT = "sandbox_cost"


def problems(suite: str) -> list[dict]:
    """The problems of `suite`: the micro benchmark's test split, or HumanEval from ../shared/data."""
    if suite == "micro":
        path = REPO / "assets" / "micro" / "data" / "code" / "test.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]
    path = REPO.parent / "shared" / "data" / "humaneval" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise SystemExit(f"error: --suite humaneval needs {path}")
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def main(argv: list[str] | None = None) -> None:

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="micro", choices=["micro", "humaneval"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="only the suite's first N problems (default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise SystemExit(f"error: --limit {args.limit}: must be >= 1")

    items = problems(args.suite)[: args.limit]
    programs = [f"{p['prompt']}{p['canonical_solution']}\n{p['test']}\ncheck({p['entry_point']})\n" for p in items]
    checks = [build_check(p, p["canonical_solution"]) for p in items]
    report = isolation_report()

    def one_process() -> None:
        def run(program: str) -> int:
            return subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, timeout=60).returncode

        with ThreadPoolExecutor(args.workers) as pool:
            codes = list(pool.map(run, programs))
        assert codes == [0] * len(codes), f"{codes.count(0)}/{len(codes)} programs passed"

    def sandbox() -> None:
        results = check_solutions(checks, workers=args.workers)
        assert all(r.passed for r in results), [r.reason for r in results if not r.passed][:3]

    times = interleaved({"one_process": one_process, "sandbox": sandbox}, args.repeats, args.warmup, torch.device("cpu"),
                        label=args.suite)
    stats = {name: summary(t) for name, t in times.items()}
    n = len(items)
    ratio = stats["sandbox"]["median_s"] / stats["one_process"]["median_s"]
    rows = [[name, f"{s['median_s']:.2f}", f"{s['median_s'] / n * 1e3:.1f}", f"{s['iqr_rel']:.2f}"] for name, s in stats.items()]
    print(table(["variant", "s per batch", "ms per check", "IQR/median"], rows))
    print(f"sandbox / one_process = {ratio:.2f} ({n} checks, {args.workers} workers, sandbox mode {report['mode']!r})")
    write_json(args.out, SCRIPT, {
        "suite": args.suite, "n_checks": n, "workers": args.workers, "sandbox_mode": report["mode"],
        "files_hidden": report["files_hidden"], "memory_bounded_in_total": report["memory_bounded_in_total"],
        "variants": stats, "ratio_sandbox_over_one_process": ratio, "environment": environment(torch.device("cpu")),
    })


if __name__ == "__main__":
    main()
