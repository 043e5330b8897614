"""Re-check a finished run's stored code completions with the current sandbox; no model needed.

    python -m experiments.evaluation.rescore runs/<run_id> [more run dirs] [--workers 2] [--data-root DIR] [--json out.json]

For each run directory, reads ``record.json`` and ``code_samples.json`` (every completion with
the verdict it got, written by the evaluation), rebuilds the run's benchmark problems from the
record's config, checks every greedy completion again under the record's sandbox limits, and
prints pass@1 as recorded and as re-checked, then each completion whose verdict changed (old and
new status, new reason). Use it after a change of the harness: a difference is either a fix or a
regression, and each one is listed. Run from the checkout the run was made in (benchmark paths in
the config are relative to it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from experiments import records
from experiments.config import BenchmarkConfig
from experiments.data.benchmark import build_benchmark
from experiments.evaluation.code_completion import build_check
from experiments.evaluation.config import as_eval_config
from experiments.progress import progress_bar
from sandbox import check_solutions
from suite_schema import layout


def rescore(run_dir: Path, workers: int = 2, progress: bool = False, data_root: str | None = None) -> dict:
    """Pass@1 of ``run_dir`` as recorded and as re-checked now, and every changed verdict.

    ``data_root`` is the benchmark's ``data_root`` (not part of a record: it does not change
    what a run computes); None reads the datasets from where the benchmark config says.
    """

    run_dir = Path(run_dir)
    record = records.read_record(run_dir)
    if record is None or record.get("status") != layout.STATUS_COMPLETE:
        raise ValueError(f"{run_dir}: no complete record.json")
    samples_path = run_dir / layout.CODE_SAMPLES_NAME
    if not samples_path.is_file():
        raise ValueError(f"{run_dir}: no {layout.CODE_SAMPLES_NAME} (runs evaluated before completions were stored)")
    samples = [s for s in json.loads(samples_path.read_text()) if s["kind"] == "greedy"]
    config = record["config"]
    bench_cfg = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), config["benchmark"])
    bench_cfg.data_root = data_root
    problems = {p["task_id"]: p for p in build_benchmark(bench_cfg).target_eval}
    missing = sorted({s["task_id"] for s in samples} - set(problems))
    if missing:
        raise ValueError(f"{run_dir}: {len(missing)} task ids are not in the benchmark as configured now, e.g. {missing[0]}")
    limits = as_eval_config(config["eval"]).sandbox_limits()
    checks = [build_check(problems[s["task_id"]], s["completion"]) for s in samples]
    with progress_bar(total=len(checks), desc="sandbox", unit="check", disable=not progress) as bar:
        results = check_solutions(checks, limits, workers=workers, on_result=lambda _: bar.update(1))
    changed = [
        {"task_id": s["task_id"], "index": s["index"], "old": s["status"], "new": r.status, "old_reason": s["reason"],
         "new_reason": r.reason}
        for s, r in zip(samples, results)
        if (s["status"] == "passed") != r.passed or s["status"] != r.status
    ]
    return {
        "run_id": record["run_id"],
        "method": record.get("method"),
        "seed": record.get("seed"),
        "recorded_pass@1": record["metrics"]["target"]["pass@1"],
        "stored_pass@1": sum(s["status"] == "passed" for s in samples) / max(len(samples), 1),
        "rechecked_pass@1": sum(r.passed for r in results) / max(len(results), 1),
        "n": len(samples),
        "changed": changed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.evaluation.rescore", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-root", default=None, help="the benchmark's data_root, as the run had it (benchmark.data_root)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    out = []
    for run_dir in args.run_dirs:
        try:
            res = rescore(run_dir, args.workers, progress=True, data_root=args.data_root)  # bar on stderr
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        out.append(res)
        flips = sum((c["old"] == "passed") != (c["new"] == "passed") for c in res["changed"])
        print(f"{res['run_id']} {res['method']} seed {res['seed']}: pass@1 recorded {res['recorded_pass@1']:.4f}, "
              f"re-checked {res['rechecked_pass@1']:.4f} (n={res['n']}); {flips} verdicts flipped, "
              f"{len(res['changed']) - flips} statuses renamed")
        for c in res["changed"]:
            print(f"  {c['task_id']}: {c['old']} -> {c['new']}: {c['new_reason'] or c['old_reason']}")
    if args.json:
        records.atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
