"""Print what an ATLAS run's conditioning did (the record's `diagnostics`, see `atlas.diagnostics`).

    python -m atlas.inspect runs/<run_id>            # one table: every site, then the mean over sites
    python -m atlas.inspect runs/<run_id> --json     # the diagnostics as JSON
    python -m atlas.inspect runs/<run_id> --recompute [--data-root DIR] [--cache-dir DIR]
        # measure them again from the run's export with today's code (figures added since the run was made,
        # such as `by_domain_scored`), on the run's own split; the record is not changed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from atlas.method import ATLAS, ATLAS_FILE
from experiments.backbones import load_model
from experiments.evaluation.trained_run import load_run
from experiments.log import quiet_console, stderr_console, timed_phase

COLUMNS = (
    ("gate_retained", "gate R"), ("gate_target", "gate T"), ("auroc_gate", "AUROC gate"), ("auroc_delta", "AUROC delta"),
    ("filter_pass_retained", "pass R"), ("filter_pass_target", "pass T"), ("auroc_filter", "AUROC pass"),
    ("residual_retained", "resid R"), ("residual_target", "resid T"), ("auroc_residual", "AUROC resid"),
    ("rank_mean", "rank"), ("at_cap_share", "at cap"), ("plain_nearest_differs", "plainK diff"),
)


def table(diagnostics: dict) -> str:
    """A fixed-width table: one row per site, then `mean` (R = retained tokens, T = target tokens)."""
    rows = [*diagnostics["sites"].items(), ("mean", diagnostics["mean"])]
    width = max(len(name) for name, _ in rows)
    head = f"{'site':<{width}}  " + "  ".join(f"{label:>11}" for _, label in COLUMNS)
    lines = [head, "-" * len(head)]
    for name, row in rows:
        cells = [f"{row[k]:>11.3f}" if k in row else f"{'-':>11}" for k, _ in COLUMNS]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def recompute(run_dir: Path, data_root: Optional[str] = None, cache_dir: Optional[str] = None) -> dict:
    """The conditioning diagnostics of a finished ATLAS run, measured again from its export (`atlas.diagnostics`,
    the run's split and seed); `ValueError` for a run that is not ATLAS's or has no export. What it does and how long
    each step takes goes to stderr (`[inspect]`, `[atlas]` lines and progress bars); stdout stays the result's."""
    with stderr_console() as log:
        with timed_phase(log.getChild("inspect"), f"loading {run_dir} and its backbone"):
            run = load_run(run_dir, data_root, cache_dir)
            if not (run.export / ATLAS_FILE).is_file():
                raise ValueError(f"{run_dir}: its export holds no atlas (method {run.record.get('method')!r})")
            model = load_model(run.config.backbone)
            method = ATLAS.from_export(model, run.export)
        model.eval()
        return method.diagnostics(model, run.ctx)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atlas.inspect", description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run directory (or its record.json)")
    ap.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    ap.add_argument("--recompute", action="store_true",
                    help="measure the diagnostics again from the run's export instead of reading the record's")
    ap.add_argument("--data-root", default=None, help="with --recompute: the benchmark's data_root, as the run had it")
    ap.add_argument("--cache-dir", default=None,
                    help="with --recompute: the reference cache folder, as the run had it (eval.cache_dir)")
    args = ap.parse_args(argv)
    path = Path(args.run)
    path = path / "record.json" if path.is_dir() else path
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if args.recompute:
        try:
            record = {**record, "diagnostics": recompute(path.parent, args.data_root, args.cache_dir)}
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    diagnostics = record.get("diagnostics")
    if not diagnostics:
        print(f"error: {path} holds no ATLAS diagnostics (method {record.get('method')!r}, "
              f"status {record.get('status')!r})", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(diagnostics, indent=2))
        return 0
    print(f"{record['run_id']}: {record['method']} on {record['backbone']}/{record['benchmark']}, seed {record['seed']}; "
          f"held-out {diagnostics.get('split')} tokens, R = retained, T = target (atlas.diagnostics)")
    print(table(diagnostics))
    for key, where in (("by_domain", "alone"), ("by_domain_scored", "at the scored positions")):
        for name, row in (diagnostics.get(key) or {}).items():
            print(f"{name} {where} (mean over sites): gate R {row['gate_retained']:.3f} vs T {row['gate_target']:.3f}, "
                  f"AUROC gate {row['auroc_gate']:.3f}, pass R {row['filter_pass_retained']:.3f} vs T "
                  f"{row['filter_pass_target']:.3f}, AUROC pass {row['auroc_filter']:.3f}, resid R "
                  f"{row['residual_retained']:.3f} vs T {row['residual_target']:.3f}")
    return 0


if __name__ == "__main__":
    quiet_console()  # `python -m atlas.inspect ... | head`: no traceback when the reader goes
    sys.exit(main())
