"""`python run.py --plan [-m] OVERRIDES`: what a launch of the same command would do, without running anything.

The jobs are expanded as Hydra's basic sweeper expands them (`command_line.multirun_jobs`) and planned by the
launchers' own `planner.plan_sweep`: every job's config composed and validated, its run directory checked, every
backbone to load found. A bad job is its one-line error and exit code 2, as a launch gives; nothing is written (not
even Hydra's `multirun.yaml`). Each run is listed with its id, directory, state and estimated wall time on this
machine (`experiments.run_estimates`):

- done: its record and every post-hoc scale's are complete (a launch skips it);
- to run: no record; failed / interrupted / killed: a record that says so (a launch runs it again, resuming
  an interrupted or killed run at its last checkpoint); running: another process holds its lock now;
  queued: its SLURM job from an earlier launch is still pending or running; duplicate: the same run as an earlier job.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra_plugins.atlas_sweep import planner as sweep

TO_RUN, DONE = "to run", "done"
LAUNCHED_STATES = (TO_RUN, "failed", "interrupted", "killed")  # a launch runs these


def state_of(run: sweep.PlannedRun) -> tuple[str, str]:
    """(state, reason) of a planned run: the planner's (skipped = done, duplicate, queued), else from its run
    directory: running (its lock is held now), the status its record names, or to run (no record)."""
    # here, not at the top: Hydra imports this module with every plugin at start; the runtime loads only for a plan
    from experiments import records, run_lock
    from suite_schema import layout

    if run.state == sweep.SKIPPED:
        return DONE, run.reason
    if run.state is not None:
        return run.state, run.reason
    if run_lock.is_held(Path(run.run_dir)):
        return sweep.RUNNING, f"held by {run_lock.holder(Path(run.run_dir))}"
    record = records.read_record(Path(run.run_dir))
    status = record.get("status") if record and record.get("run_id") == run.run_id else None
    if status == layout.STATUS_COMPLETE:  # complete, but a post-hoc scale or `rerun_before` asks for more
        return TO_RUN, "its record is complete but a scale's record is missing, or rerun_before asks to run it again"
    if status == layout.STATUS_RUNNING:
        return sweep.KILLED, "its record says running but no process holds it (resumes at its last checkpoint)"
    if status in (layout.STATUS_FAILED, layout.STATUS_INTERRUPTED):
        return status, sweep.outcome_of(run)[1]
    return TO_RUN, ""


def _estimates(plan: Sequence[sweep.PlannedRun]) -> dict[int, Any]:
    """Each run's estimated wall time on this machine (`experiments.run_estimates.Estimate`), by job index."""
    # here, not at the top: Hydra imports this module with every plugin at start; the runtime loads only for a plan
    from omegaconf import OmegaConf
    from experiments.config import validate_config
    from experiments.protocol_plan import estimates, pools, protocol_run

    runs, index = [], {}
    for run in plan:
        typed = validate_config(OmegaConf.masked_copy(run.config, [k for k in run.config if k != "hydra"]))
        runs.append(protocol_run(run.index, run.overrides, "", typed))
        index[run.index] = runs[-1].run_id
    root = Path(str(plan[0].run_dir)).parent if plan else Path(".")
    times = estimates(runs, pools(root))
    return {i: times[run_id] for i, run_id in index.items()}


def plan_text(command: str, plan: Sequence[sweep.PlannedRun], states: dict[int, tuple[str, str]],
              times: dict[int, Any]) -> str:
    """The plan as `[plan]` lines: a head line with the counts, one line per run (job number, state, run id,
    estimated time, run directory, the overrides that differ between jobs) with the reason under it where there is
    one, and the time the runs to launch take."""
    # here, not at the top: Hydra imports this module with every plugin at start; the runtime loads only for a plan
    from experiments.run_estimates import duration

    counts: dict[str, int] = {}
    for state, _ in states.values():
        counts[state] = counts.get(state, 0) + 1
    order = [DONE, TO_RUN, "failed", "interrupted", "killed", sweep.RUNNING, sweep.QUEUED, sweep.DUPLICATE]
    head = ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
    lines = [f"[plan] {command}", f"[plan] {len(plan)} run(s), every job's config valid: {head}; nothing was launched"]
    labels = dict(zip((r.index for r in plan), sweep.short_labels([r.overrides for r in plan])))
    width = max(len(str(r.index)) for r in plan) if plan else 1
    dirs = [os.path.relpath(r.run_dir) if not os.path.isabs(r.run_dir) else r.run_dir for r in plan]
    dir_width = max(map(len, dirs), default=0)
    lines.append(f"[plan]   {'#':>{width}}  {'state':<11} {'run id':<16}  {'time':>12}  {'run dir':<{dir_width}}  job")
    for run, folder in zip(plan, dirs):
        state, reason = states[run.index]
        time = f"~{duration(times[run.index].seconds)}" if state in LAUNCHED_STATES else "-"
        lines.append(f"[plan]   {run.index:>{width}}  {state:<11} {run.run_id:<16}  {time:>12}  {folder:<{dir_width}}  "
                     f"{labels[run.index]}")
        if reason and state != DONE:
            lines.append(f"[plan]   {'':>{width}}  {reason}")
    todo = [r for r in plan if states[r.index][0] in LAUNCHED_STATES]
    if todo:
        total = sum(times[r.index].seconds for r in todo)
        sources = [times[r.index].source for r in todo]
        where = sorted({re.sub(r", median of \d+| \+ up to \d+ refined scales", "", s) for s in sources})
        refined = " (scale refinements at their most evaluations)" if any("refined" in s for s in sources) else ""
        lines.append(f"[plan] a launch runs {len(todo)} of them, about {duration(total)} one after another on this "
                     f"machine{refined}; estimates: {'; '.join(where)}")
    else:
        lines.append("[plan] a launch runs nothing: every run is done, running or queued")
    return "\n".join(lines)


def plan(argv: Sequence[str]) -> list[sweep.PlannedRun]:
    """The launch plan of `python run.py -m ARGV`: `planner.plan_sweep` on the jobs Hydra's basic sweeper would make,
    with the launcher's own checks (its settings, SLURM jobs still queued). Raises the launch's one-line errors."""
    # here, not at the top: Hydra imports this module with every plugin at start; the runtime loads only for a plan
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import get_args_parser
    from hydra.types import HydraContext, RunMode
    from experiments import command_line
    from hydra_plugins.atlas_sweep.launchers import LocalSweepLauncher

    args, _ = get_args_parser().parse_known_args(list(argv))
    overrides = list(args.overrides)
    jobs = command_line.multirun_jobs(overrides, args.config_dir, args.config_name or "config")
    loader = command_line.config_loader(args.config_dir)
    config = loader.load_configuration(args.config_name or "config", overrides, RunMode.MULTIRUN)
    launcher = str(config.hydra.launcher.get("_target_", ""))
    if launcher.endswith("LocalSweepLauncher"):
        LocalSweepLauncher(config.hydra.launcher.get("jobs", 1), config.hydra.launcher.get("threads_per_job")
                           ).parallel_settings()
    sweep.ensure_run_id_resolver()
    runs = sweep.plan_sweep(config, HydraContext(config_loader=loader, callbacks=Callbacks(config)), jobs, 0)
    if launcher.endswith("SlurmSweepLauncher"):
        sweep.mark_still_queued(runs)
    return runs


def main(argv: Sequence[str], out: Optional[Any] = None) -> int:
    """`python run.py --plan ARGV` (ARGV without `--plan`): print the plan; 0, or 2 with the one-line error of a job
    or a backbone that is not available."""
    # here, not at the top: Hydra imports this module with every plugin at start; the runtime loads only for a plan
    from experiments import command_line
    from experiments.job import USER_ERRORS

    out = out or sys.stdout
    argv = [a for a in command_line.normalized(argv) if a not in ("-m", "--multirun")]
    try:
        runs = plan(argv)
        states = {run.index: state_of(run) for run in runs}
        times = _estimates(runs)
    except (*USER_ERRORS, command_line.CommandLineError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    command = "python run.py -m " + " ".join(argv)
    print(plan_text(command.rstrip(), runs, states, times), file=out, flush=True)
    return 0
