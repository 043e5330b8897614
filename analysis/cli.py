"""Command line: `python -m analysis collect ...` and `python -m analysis report ...` (see docs/analysis.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from analysis import bootstrap as BT
from analysis import matched as MT
from analysis.samples import DEFAULT_SAMPLES

EXAMPLES = """examples:
  python -m analysis collect runs multirun/2026-12-01 --out results.parquet
  python -m analysis collect runs --wandb my-team/atlas --out results.csv
  python -m analysis report runs --out report
  python -m analysis report runs --out report --levels 0.3 0.4 gain:0.9 --no-interpolate
  python -m analysis report runs --out report --reference lora:train.steps=600   # the point gain levels share
  python -m analysis report runs --out report --check      # re-run and compare with the committed report
  python -m analysis tune runs_dev --reference lora:train.steps=600 --points 2 --out conf/point --prefix micro_main
  python -m analysis tune runs_dev --min-dev-seeds 1 --allow-edge ewc     # a smoke test: one dev seed, EWC at its edge
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description="Tables and figures from result records.",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("collect", help="gather records into one table (parquet or CSV)")
    c.add_argument("dirs", nargs="*", metavar="DIR", help="run directories or record files (searched recursively)")
    c.add_argument("--wandb", action="append", default=[], metavar="ENTITY/PROJECT",
                   help="also read the runs of this W&B project (repeatable)")
    c.add_argument("--out", metavar="FILE", help="write the table here (.parquet/.pq or .csv)")
    c.add_argument("--skipped", metavar="FILE", help="write the skipped runs and reasons here (CSV)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")

    r = sub.add_parser("report", help="write every table, figure and data file plus index.md into a folder")
    r.add_argument("dirs", nargs="*", metavar="DIR", help="run directories or record files (searched recursively)")
    r.add_argument("--out", default="report", metavar="FOLDER", help="report folder (default: report)")
    r.add_argument("--levels", nargs="+", default=list(MT.DEFAULT_LEVELS), metavar="LEVEL",
                   help="coding requirement levels: a pass@1 value (0.3) or a share of the coding gain over the "
                        "base model of the --reference point (gain:0.75); default: %(default)s")
    r.add_argument("--reference", default=MT.DEFAULT_REFERENCE, metavar="METHOD[:KNOB=VALUE,...]",
                   help="the sweep point (scale 1) whose coding gain over the base model gain: levels are shares of, "
                        "e.g. lora:train.steps=600 (default: %(default)s; must match exactly one point)")
    r.add_argument("--primary", type=int, default=None, metavar="I",
                   help="index of the level used by single-level tables and figures (default: the middle one)")
    r.add_argument("--interpolate", action=argparse.BooleanOptionalAction, default=True,
                   help="per seed, KL where each training run's post-hoc scale curve reaches the level, linearly "
                        "between the curve's points, the least over the method's runs (default); --no-interpolate: "
                        "the least KL among the points that reach the level")
    r.add_argument("--wandb", action="append", default=[], metavar="ENTITY/PROJECT",
                   help="also read the runs of this W&B project (repeatable)")
    r.add_argument("--variants", nargs="+", default=[], metavar="KNOB",
                   help="option study: a method's records whose KNOB differs from the method's default "
                        "(conf/method/<name>.yaml) form a method of their own, METHOD[KNOB=VALUE,...], with its own "
                        "fronts, rows and paired difference (e.g. --variants filter_members filter_basis); a record "
                        "without a knob added later counts as made at its earlier value (LATER_KEYS)")
    r.add_argument("--resamples", type=int, default=BT.DEFAULT_RESAMPLES, metavar="N",
                   help="resamples of the bootstrap over code problems and retained items, for records carrying "
                        f"per-problem and per-item results (default: %(default)s; at least {BT.MIN_RESAMPLES})")
    r.add_argument("--split-incomparable", action="store_true",
                   help="runs of one backbone and benchmark that differ in split, benchmark version, backbone weights "
                        "or evaluation sizes form groups of their own, labelled by what differs (refused otherwise)")
    r.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="N",
                   help="changed retained items per set and domain, and code completions, shown per method in "
                        "index.html (default: %(default)s)")
    r.add_argument("--check", action="store_true",
                   help="do not write: re-run into a temporary folder and compare with FOLDER byte by byte")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    t = sub.add_parser("tune", help="choose each method's sweep points from dev-split records (equal budget)")
    t.add_argument("dirs", nargs="+", metavar="DIR", help="folders of the tuning preset's dev records")
    t.add_argument("--reference", default=MT.DEFAULT_REFERENCE, metavar="METHOD[:KNOB=VALUE,...]",
                   help="the point whose dev gain over the base model the levels are shares of (default: %(default)s)")
    t.add_argument("--points", type=int, default=2, metavar="N", help="points per method (default: %(default)s)")
    t.add_argument("--low", type=float, default=0.5, help="low level, share of the reference gain (default 0.5)")
    t.add_argument("--high", type=float, default=0.9, help="high level, share of the reference gain (default 0.9)")
    t.add_argument("--out", metavar="FOLDER", help="write the chosen points as conf/point files here")
    t.add_argument("--prefix", default="micro_main", help="point file names: PREFIX_<method>_<i>.yaml")
    t.add_argument("--extension-prefix", metavar="PREFIX",
                   help="on a refusal at a grid's edge, write the extension round's points to --out as "
                        "PREFIX_<method>_<i>.yaml")
    t.add_argument("--close-se", type=float, default=1.0, metavar="Z",
                   help="a point within Z standard errors of a level is a close call (default: %(default)s)")
    t.add_argument("--allow-edge", nargs="+", default=[], metavar="METHOD",
                   help="let these methods' picks at the edge of their grid through (refused otherwise); their point "
                        "files say so")
    t.add_argument("--min-dev-seeds", type=int, default=2, metavar="N",
                   help="dev seeds every candidate needs (default: %(default)s; 1 for a smoke test)")
    t.add_argument("--candidates", metavar="FOLDER",
                   help="write the dev candidates table PREFIX_candidates.csv here (default: the --out folder)")
    return p


def main(argv: Optional[Sequence[str]] = None, api=None) -> int:
    """Entry point; `api` replaces `wandb.Api()` (tests)."""
    args = _parser().parse_args(argv)
    if not args.dirs and not getattr(args, "wandb", None):
        print("error: give at least one run directory or --wandb ENTITY/PROJECT", file=sys.stderr)
        return 2
    try:
        if args.command == "collect":
            return _collect(args, api)
        if args.command == "tune":
            return _tune(args)
        return _report(args, api)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _print_skipped(skipped) -> None:
    for s in skipped:
        who = " ".join(x for x in (s.method or "", f"seed {s.seed}" if s.seed is not None else "") if x)
        print(f"  [{s.kind}] {s.source}" + (f" ({who})" if who else "") + f": {s.reason}")


def _collect(args, api) -> int:
    # here, not at the top: pandas and matplotlib load only for the subcommand that runs (`--help` stays fast)
    from analysis.collect import collect, write_table

    col = collect(args.dirs, args.wandb, api=api, progress=not args.no_progress)
    df = col.table
    print(f"{len(df)} complete runs from {col.n_sources} sources; {len(col.skipped)} skipped")
    if len(df):
        counts = df.groupby(["backbone", "benchmark", "method"]).size()
        for (bb, bench, method), n in counts.items():
            print(f"  {bb}/{bench} {method}: {n} runs")
    if col.skipped:
        print("skipped:")
        _print_skipped(col.skipped)
    if args.out:
        path = write_table(df, args.out)
        print(f"table: {path}")
    if args.skipped:
        Path(args.skipped).parent.mkdir(parents=True, exist_ok=True)
        col.skipped_frame().to_csv(args.skipped, index=False, lineterminator="\n")
        print(f"skipped runs: {args.skipped}")
    return 0


def _report(args, api) -> int:
    # here, not at the top: pandas and matplotlib load only for the subcommand that runs (`--help` stays fast)
    from analysis.report import check_report, default_command, write_report

    levels = [lv.spec for lv in MT.parse_levels(args.levels)]
    reference = MT.parse_reference(args.reference).spec
    command = default_command(args.dirs, args.out, levels, args.primary, args.interpolate, args.wandb, reference,
                              args.variants, args.resamples, args.split_incomparable, args.samples)
    kwargs = dict(levels=levels, primary=args.primary, interpolate=args.interpolate, wandb_paths=args.wandb,
                  api=api, command=command, progress=not args.no_progress, reference=reference,
                  variants=args.variants, resamples=args.resamples, split_incomparable=args.split_incomparable,
                  samples=args.samples)
    if args.check:
        diffs = check_report(args.dirs, args.out, **kwargs)
        if diffs:
            print(f"{args.out} differs from a re-run:")
            for d in diffs:
                print(f"  {d}")
            return 1
        print(f"{args.out} matches a re-run byte for byte")
        return 0
    rep = write_report(args.dirs, args.out, **kwargs)
    col = rep.collection
    print(f"{len(col.table)} complete runs; {len(col.skipped)} skipped; {len(rep.files)} files in {rep.folder}")
    if col.skipped:
        _print_skipped(col.skipped)
    for line in rep.absent:
        print(line)
    if rep.ledger is None:
        print("no test-read ledger in or above the record folders")
    else:
        print(f"test reads: {len(rep.ledger.reads)} in {', '.join(rep.ledger.paths)}")
        for problem in rep.ledger.problems:
            print(f"  {problem}")
    print(f"index: {rep.folder / 'index.md'} (one page: {rep.folder / 'index.html'})")
    return 0


def _tune(args) -> int:
    # here, not at the top: pandas and matplotlib load only for the subcommand that runs (`--help` stays fast)
    from analysis.collect import collect, threads_text
    from analysis.tune import earlier_definitions, tune

    if not args.close_se > 0:
        print(f"error: --close-se {args.close_se}: a number of standard errors > 0", file=sys.stderr)
        return 2
    if args.extension_prefix is not None and (not args.out or args.extension_prefix == args.prefix):
        print(f"error: --extension-prefix {args.extension_prefix}: needs --out and a prefix other than --prefix "
              f"({args.prefix})", file=sys.stderr)
        return 2
    earlier = earlier_definitions(collect(args.dirs).table) if args.dirs else []
    if earlier:
        print(f"not tuned: records made under an earlier definition of their method ({', '.join(earlier)}); "
              "train those methods again on dev")
    tuned = tune(args.dirs, MT.parse_reference(args.reference).spec, args.points, args.low, args.high,
                 Path(args.out) if args.out else None, args.prefix, args.close_se, args.allow_edge,
                 args.min_dev_seeds, Path(args.candidates) if args.candidates else None, args.extension_prefix)
    frame, written, firm, threads = tuned.choices, tuned.written, tuned.stability, tuned.threads
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if tuned.edges:
        print("\nPicks at the edge of their grid:")
        for e in tuned.edges:
            why = "let through by --allow-edge" if e.refused else "accepted: the knob's bound"
            print(f"  {e.method}: {e.text()} ({why})")
    idle = sorted(set(args.allow_edge) - {e.method for e in tuned.edges if e.refused})
    if idle:
        print(f"  --allow-edge {' '.join(idle)}: no pick of these is at a refused edge")
    print(f"\nHow firm each choice is: points within {args.close_se:g} standard error(s) of a level (binomial over "
          "problems, the level's own error included) counted as reaching it, then as missing it:")
    for row in firm.itertuples():
        if row.close:
            print(f"  {row.method}: close: the other reading chooses {row.alternative}; close points: "
                  f"{row.close_points}")
        else:
            print(f"  {row.method}: firm" + (f" (close points that do not change it: {row.close_points})"
                                              if row.close_points else ""))
    if len(threads) > 1:
        print(f"\nwarning: the dev records were trained with different intra-op thread counts ({threads_text(threads)}; "
              "`cost.threads`): the same config rounds differently at each, which can move a choice near a level "
              "(docs/slurm.md). Re-make them with one count.")
    elif threads:
        print(f"\nDev records trained with {threads_text(threads)}: re-make them that way to reproduce these choices.")
    for path in written:
        print(f"wrote {path}")
    if tuned.candidates_path is not None:
        print(f"wrote {tuned.candidates_path} (every dev candidate per method: knobs, seeds, pass@1 and KL)")
    return 0
