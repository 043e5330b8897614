"""Log finished runs to W&B from their records, so W&B holds every run, those run before or without `logger=wandb`
too; and log an analysis report folder as a `report` artifact.

    python -m experiments.wandb_sync runs [runs_dev/abc...] [--project P] [--entity E] [--mode offline|online]
                                     [--group G] [--dir D] [--report REPORT_DIR] [--force]

Each complete record under the paths (`suite_schema.layout.find_records`; a post-hoc scale's record goes with its run)
becomes the W&B run whose id is the run id (resumed where it exists): config = the record's config, summary = its
metrics and costs flattened as the live logger writes them, group = `--group`, else the run's `logger.group` or
experiment preset (its `.hydra/` files), job type = the method, and its files as the artifact `record-<run id>`. A
run whose W&B folder says it was logged complete with the same files, project and mode is skipped (`--force` logs it
again); W&B dedupes an artifact logged again with the same contents. One line per run on stdout.
Offline W&B folders go to `<run_dir>/wandb/offline-run-*` (with `--dir D`: `D/<run_id>/wandb/`; the report's: `./wandb/`
or `D/wandb/`); `wandb sync` them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from experiments import records, wandb_artifacts
from experiments.logger import run_name
from suite_schema import layout, registry

MODES = ("offline", "online")


def defaults() -> Any:
    """The W&B settings of conf/logger/wandb.yaml (project, entity, mode, tags)."""
    cfg = OmegaConf.load(registry.CONF / "logger" / "wandb.yaml")
    return SimpleNamespace(project=cfg.project, entity=cfg.entity, mode=cfg.mode, tags=list(cfg.tags))


def group_of(run_dir: Path) -> Optional[str]:
    """The group a run was launched under, from its Hydra files: its `logger.group` (.hydra/config.yaml), else the
    experiment preset it was composed with (`hydra.runtime.choices.experiment`, .hydra/hydra.yaml); else None."""
    for name, key in (("config.yaml", "logger.group"), ("hydra.yaml", "hydra.runtime.choices.experiment")):
        try:
            value = OmegaConf.select(OmegaConf.load(Path(run_dir) / ".hydra" / name), key)
        except Exception:  # no such file, or not YAML: the run says nothing of its group
            continue
        if value:
            return str(value)
    return None


def run_dirs(paths: Sequence[str]) -> tuple[list[Path], list[str]]:
    """The run directories holding a record under each path (a run root, a run directory or a record file), sorted,
    each once; and one error line for each path that is missing or holds no record. A post-hoc scale's folder is
    no run directory of its own."""
    found: set[Path] = set()
    errors = []
    for path in paths:
        try:
            recs = layout.find_records([path])[0]
        except FileNotFoundError as exc:
            errors.append(str(exc))
            continue
        dirs = {r.parent for r in recs if r.parent.parent.name != layout.SCALES_DIR}
        if not dirs:
            errors.append(f"{path}: no run record ({layout.RECORD_NAME}) under it")
        found |= dirs
    return sorted(found, key=str), errors


def log_finished(run_dir: Path, settings: Any, group: Optional[str] = None, wandb_dir: Optional[Path] = None,
                 force: bool = False) -> str:
    """Log the complete run in `run_dir` to W&B (`settings`: project, entity, mode, tags) as the module says; return
    its one progress line. A run that is not complete is not logged (the line says why). `group`: None = `group_of`;
    `wandb_dir`: where its W&B folder goes (`<wandb_dir>/<run id>/wandb/`), None = the run directory."""
    run_dir = Path(run_dir)
    record = records.read_record(run_dir)
    problem = layout.validate(record) if record is not None else f"no readable {layout.RECORD_NAME}"
    if problem:
        return f"{run_dir}: {problem}; not logged"
    run_id, method = record["run_id"], record["method"]
    if record["status"] != layout.STATUS_COMPLETE:
        return f"{run_id} {method}: status {record['status']}; not logged (only complete runs are)"
    where = Path(wandb_dir) / run_id if wandb_dir is not None else run_dir
    head = f"{run_id} {method} seed {record.get('seed')}"
    marker = wandb_artifacts.logged_before(where / "wandb", run_dir, settings)
    if marker is not None and not force:
        return f"{head}: already logged ({marker}); skipped"
    group = group or group_of(run_dir)
    import wandb  # here, not at the top: a second to import

    where.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode, id=run_id, resume="allow",
                     name=run_name(method, record.get("backbone", "?"), record.get("seed"), run_id), dir=str(where),
                     config=record["config"], group=group, job_type=method, tags=list(settings.tags) or None,
                     settings=wandb.Settings(silent=True, console="off"))
    try:
        run.summary.update(wandb_artifacts.summary_of(record, wandb_artifacts.scale_records(run_dir, run_id)))
        art = wandb_artifacts.log_run_files(run, run_dir, record)
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    wandb_artifacts.mark_logged(where / "wandb", run_dir, settings)
    return (f"{head}: logged (group {group or '-'}, job type {method}, artifact {art.name}: "
            f"{', '.join(sorted(art.manifest.entries))}) -> {run.settings.sync_dir}")


def log_report(report_dir: Path, settings: Any, group: Optional[str] = None,
               wandb_dir: Optional[Path] = None) -> str:
    """Log the analysis report folder `report_dir` as the `report` artifact `report-<parent>-<folder name>` (its
    last two path parts, e.g. `report-dev_defaults-report`) from the W&B run of the same id (job type `report`); its
    W&B folder goes into `wandb_dir`, else the current directory (`./wandb/`, W&B's own default), never into a report
    folder that may be committed. Returns the progress line."""
    # here, not at the top: wandb takes a second to import; --help and errors stay fast
    import wandb

    report_dir = Path(report_dir).resolve()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(report_dir.parts[-2:])).strip("-.") or "report"
    where = Path(wandb_dir) if wandb_dir is not None else Path.cwd()
    where.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode, id=f"report-{slug}",
                     resume="allow", name=f"report-{slug}", dir=str(where), group=group, job_type="report",
                     tags=list(settings.tags) or None, settings=wandb.Settings(silent=True, console="off"))
    art = wandb.Artifact(f"report-{slug}", type=wandb_artifacts.REPORT_TYPE, metadata={"folder": str(report_dir)})
    art.add_dir(str(report_dir))
    run.log_artifact(art)
    run.finish()
    return (f"report {report_dir}: logged (group {group or '-'}, artifact {art.name}: {len(art.manifest.entries)} "
            f"files) -> {run.settings.sync_dir}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point: log the runs (and the report) the arguments name; 2 (nothing logged) when a path holds no record,
    a report folder is missing or a setting is not allowed."""
    base = defaults()
    p = argparse.ArgumentParser(prog="python -m experiments.wandb_sync",
                                description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("paths", nargs="*", help="run roots, run directories or record files")
    p.add_argument("--project", default=base.project, help=f"W&B project (default {base.project})")
    p.add_argument("--entity", default=base.entity, help="W&B entity (default: yours)")
    p.add_argument("--mode", default=base.mode, help=f"{' or '.join(MODES)} (default {base.mode})")
    p.add_argument("--group", default=None, help="W&B group of every run (default: each run's own, or none)")
    p.add_argument("--dir", type=Path, default=None, help="W&B folders under DIR/<run_id>/ (default: the run dirs)")
    p.add_argument("--report", type=Path, default=None, metavar="REPORT_DIR", help="log this report folder too")
    p.add_argument("--force", action="store_true", help="log runs already logged with the same files again")
    args = p.parse_args(argv)
    errors = []
    if not args.paths and args.report is None:
        errors.append("give at least one run root, run directory or record file, or --report REPORT_DIR")
    if args.mode not in MODES:
        errors.append(f"--mode={args.mode!r} is not allowed: one of {list(MODES)}")
    if not args.project:
        errors.append(f"--project={args.project!r} is not allowed: a W&B project name")
    if args.report is not None and not (args.report.is_dir() and any(args.report.iterdir())):
        errors.append(f"--report={str(args.report)!r} is not allowed: a report folder holding files")
    dirs, missing = run_dirs(args.paths)
    errors += missing
    if errors:
        for line in errors:
            print(f"error: {line}", file=sys.stderr)
        return 2
    settings = SimpleNamespace(project=args.project, entity=args.entity, mode=args.mode, tags=base.tags)
    for run_dir in dirs:
        print(log_finished(run_dir, settings, args.group, args.dir, args.force), flush=True)
    if args.report is not None:
        print(log_report(args.report, settings, args.group, args.dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
