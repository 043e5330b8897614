"""Re-runnable sweeps: skip complete runs before launching, snapshot the code, summarise the outcome.

(No `from __future__ import annotations` here: Hydra imports every module of `hydra_plugins` outside
`sys.modules` when it scans for plugins, and dataclasses cannot resolve string annotations then.)

Two Hydra launchers (hydra_plugins/atlas_sweep/launchers.py; Hydra loads launchers only from the
`hydra_plugins` package) share this logic:

- `LocalSweepLauncher` (`hydra/launcher=local`, the default): Hydra's basic launcher; the jobs run
  one after another in this process.
- `SlurmSweepLauncher` (`hydra/launcher=slurm`, `slurm_local`): hydra-submitit-launcher's SLURM
  launcher; the jobs run as one SLURM job array and the launcher blocks until the array ends.

Before anything runs, every job's config is composed and validated (a bad value stops the sweep
before any job is queued), and its run directory (`<run_root>/<run_id>`) is looked up: runs whose
record is complete are skipped and nothing is queued for them; failed, interrupted or missing
runs are launched (again). On SLURM, a run whose job from an earlier launch is still queued or
running is not submitted twice. After the jobs end, a summary names every run as done, skipped,
failed, interrupted, busy (another launch held it) or killed (its record still says running), with
the reason read from its run directory; it is printed and written to the sweep folder
`<run_root>/.sweeps/<timestamp>/` (`summary.json`, `summary.txt`), which also holds the code
snapshot (`code/`) the SLURM jobs import from and submitit's logs (`submitit/`).

    python -m hydra_plugins.atlas_sweep.planner summary runs/.sweeps/20260101-120000-1234   # summarise again, now
"""


import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

import experiments
from experiments import exit_codes, records, rerun, run_lock
from experiments.log import console
from experiments.logger import SWEEP_FOLDER_ENV
from experiments.run_id import register_run_id_resolver
from experiments.run_summary import summary_row, table_lines
from experiments.validation import ConfigError, not_allowed
from suite_schema import layout, run_identity

SWEEPS_DIR = ".sweeps"
SUMMARY_JSON = "summary.json"
SUMMARY_TXT = "summary.txt"
PLAN_JSON = "plan.json"
SLURM_MARKER = ".slurm_job.json"  # in a run directory: the SLURM job last submitted for it

DONE, SKIPPED, FAILED, INTERRUPTED = "done", "skipped", "failed", "interrupted"
QUEUED, DUPLICATE, NOT_RUN = "queued", "duplicate", "not run"
BUSY, KILLED, RUNNING = "busy", "killed", "running"  # another launch held it; the record says running
# SLURM states of a job that may still run (squeue).
LIVE_SLURM_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                     "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED"}
# Files larger than this that git does not track are linked into the code snapshot, not copied.
SNAPSHOT_COPY_LIMIT = 10 * 2**20


def log(message: str) -> None:
    """A `[sweep] ...` line on stdout (experiments.log)."""
    console().getChild("sweep").info(message)


def ensure_run_id_resolver() -> None:
    """The `${run_id:}` resolver (`experiments.run_id`); SLURM jobs do not run run.py."""
    register_run_id_resolver()


# ------------------------------------------------------------------------------------------ plan


@dataclass
class PlannedRun:
    """One job of a sweep: its overrides, run id and directory, and what the launcher does with it."""

    index: int
    overrides: list[str]
    run_id: str
    run_dir: str
    config: Optional[DictConfig] = field(default=None, repr=False)  # composed, hydra node included
    state: Optional[str] = None  # before launch: SKIPPED, DUPLICATE or QUEUED, or None (to launch)
    reason: str = ""
    slurm_job_id: Optional[str] = None


def short_labels(overrides: Sequence[Sequence[str]], limit: int = 160) -> list[str]:
    """Per job, the overrides that differ between the jobs (all of them when there is one job)."""
    lists = [list(filter_overrides(o)) for o in overrides]
    common = set.intersection(*(set(o) for o in lists)) if len(lists) > 1 else set()
    out = []
    for o in lists:
        text = " ".join(x for x in o if x not in common) or "(no overrides)"
        out.append(text if len(text) <= limit else text[: limit - 3] + "...")
    return out


def plan_sweep(config: DictConfig, hydra_context: Any, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> list[PlannedRun]:
    """Compose and validate every job's config and find its run directory; mark complete runs skipped.

    Raises ConfigError naming each job whose config is invalid (nothing has been launched then).
    """
    # here, not at the top: Hydra imports this module at start; the runtime (torch) loads only when a sweep is planned
    from experiments.config import validate_config
    from experiments.job import USER_ERRORS
    from experiments.methods import required_refinement, required_scales

    ensure_run_id_resolver()
    plan, errors = [], []
    seen: dict[str, tuple[int, str]] = {}  # run directory (symlinks resolved) -> (job index, run id) of its first job
    for offset, overrides in enumerate(job_overrides):
        index = initial_job_idx + offset
        cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = index
            cfg.hydra.job.num = index
        science = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        try:
            typed = validate_config(science)
        except USER_ERRORS as exc:
            errors.append((offset, index, exc))
            continue
        run_id = run_identity.run_id_of(OmegaConf.to_container(typed, resolve=True))
        previous = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(cfg)
        try:
            sweep_dir = str(OmegaConf.select(cfg, "hydra.sweep.dir"))
            subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
        finally:
            HydraConfig.instance().cfg = previous
        # The job's output directory, fixed now: the job neither needs the run_id resolver nor can drift.
        with read_write(cfg.hydra.sweep), open_dict(cfg.hydra.sweep):
            cfg.hydra.sweep.dir = sweep_dir
            cfg.hydra.sweep.subdir = subdir
        run_dir = Path(sweep_dir) / subdir
        run = PlannedRun(index, list(overrides), run_id, str(run_dir), cfg)
        scales, refinement = required_scales(typed), required_refinement(typed)
        try:
            check_job_dir(seen, index, run_id, sweep_dir, subdir, typed.run_root)
        except USER_ERRORS as exc:
            errors.append((offset, index, exc))
            continue
        first = next((p for p in plan if os.path.realpath(p.run_dir) == os.path.realpath(run_dir)), None)
        if first is not None:
            # Overrides that do not change the science (logger, progress, ...) give the same run: run it once.
            run.state, run.reason = DUPLICATE, f"same run (id and directory) as job #{first.index}"
        elif records.is_complete(run_dir, run_id, scales, refinement) and not rerun.requested(typed.rerun_before,
                                                                                              run_dir):
            run.state, run.reason = SKIPPED, "complete record before launch"
        plan.append(run)
    if errors:
        labels = short_labels(job_overrides)
        lines = [f"  #{index} {labels[offset]}: {exc}" for offset, index, exc in errors]
        raise ConfigError(f"{len(errors)} of {len(job_overrides)} sweep jobs have an invalid config; nothing was "
                          "launched:\n" + "\n".join(lines))
    check_backbones(plan)
    return plan


def check_job_dir(seen: dict[str, tuple[int, str]], index: int, run_id: str, sweep_dir: str, subdir: str,
                  run_root: Any) -> None:
    """Raise the one-line ConfigError of job `index` when its directory `<sweep_dir>/<subdir>` is one an earlier job
    of another run id got (`seen`: directory, symlinks resolved -> (job index, run id) of its first job; filled in
    here) or not the run's own (`experiments.run_dir.check_run_dir`)."""
    # here, not at the top: Hydra imports this module at start; the runtime (torch) loads only when a sweep is planned
    from experiments.run_dir import check_run_dir

    run_dir = Path(sweep_dir) / subdir
    first, first_id = seen.setdefault(os.path.realpath(run_dir), (index, run_id))
    if first_id != run_id:
        raise not_allowed("hydra.sweep.subdir", subdir, f"one directory per run; jobs #{first} and #{index} are "
                          f"different runs ({first_id}, {run_id}) but both get {run_dir}")
    moved_root = os.path.realpath(sweep_dir) != os.path.realpath(str(run_root))
    key, value = ("hydra.sweep.dir", sweep_dir) if moved_root else ("hydra.sweep.subdir", subdir)
    check_run_dir(run_dir, run_root, run_id, key, value)


def check_backbones(plan: Sequence[PlannedRun]) -> None:
    """Once per backbone among the jobs to launch: its weights can be read or fetched (`require_available`);
    raises its one-line BackboneError (nothing launched) otherwise."""
    # here, not at the top: Hydra imports this module at start; the runtime (torch) loads only when a sweep is planned
    from experiments.backbones import require_available
    from experiments.config import validate_config

    seen = set()
    for run in plan:
        if run.state is not None:  # skipped or duplicate: nothing to load
            continue
        bb = validate_config(OmegaConf.masked_copy(run.config, [k for k in run.config if k != "hydra"])).backbone
        if (bb.path, bb.revision) not in seen:
            seen.add((bb.path, bb.revision))
            require_available(bb)


def plan_or_exit(config: DictConfig, hydra_context: Any, job_overrides: Sequence[Sequence[str]],
                 initial_job_idx: int) -> list[PlannedRun]:
    """plan_sweep, ending the process with the one-line errors and exit code 2 of run.py on a bad config."""
    # here, not at the top: Hydra imports this module at start; the runtime (torch) loads only when a sweep is planned
    from experiments.job import USER_ERRORS

    try:
        return plan_sweep(config, hydra_context, job_overrides, initial_job_idx)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def new_sweep_folder(sweep_dir: str | Path) -> Path:
    """A fresh folder `<sweep_dir>/.sweeps/<timestamp>-<pid>` for this launch; its name goes to the jobs in the
    environment (`experiments.logger.SWEEP_FOLDER_ENV`: their W&B group when no preset names one)."""
    root = Path(sweep_dir) / SWEEPS_DIR
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = root / f"{stamp}-{os.getpid()}"
    n = 1
    while folder.exists():
        n += 1
        folder = root / f"{stamp}-{os.getpid()}-{n}"
    folder.mkdir(parents=True)
    os.environ[SWEEP_FOLDER_ENV] = folder.name
    return folder


def write_plan(folder: Path, plan: Sequence[PlannedRun]) -> None:
    rows = [{k: v for k, v in asdict(run).items() if k != "config"} for run in plan]
    records.atomic_write_json(folder / PLAN_JSON, rows)


def announce(plan: Sequence[PlannedRun], what: str) -> None:
    """Say what the launch will do: `what` is "run" (in this process) or "submit" (to SLURM)."""
    done = {"run": "run", "submit": "submitted"}.get(what, what)
    todo = [r for r in plan if r.state is None]
    skipped = [r for r in plan if r.state == SKIPPED]
    others = [r for r in plan if r.state in (QUEUED, DUPLICATE)]
    parts = [f"{len(todo)} to {what}"]
    if skipped:
        parts.append(f"{len(skipped)} complete (skipped, nothing {done} for them)")
    queued = sum(r.state == QUEUED for r in others)
    if queued:
        parts.append(f"{queued} still queued or running from an earlier launch (not {done} again)")
    if len(others) > queued:
        parts.append(f"{len(others) - queued} duplicate(s) of another job (not {done} twice)")
    log(f"{len(plan)} run(s): " + ", ".join(parts))
    labels = dict(zip((r.index for r in plan), short_labels([r.overrides for r in plan])))
    for run in others:
        log(f"  {run.state:<9} {run.run_id}  {labels[run.index]}: {run.reason}")
    if not todo:
        log(f"nothing to {what}: every run already has a complete record"
            + (" or is still queued" if queued else ""))


# --------------------------------------------------------------------------------------- summary


def _first_line(text: Any, limit: int = 300) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _error_line(text: Any, limit: int = 300) -> str:
    """The most telling line of an error text: the last `error:`/exception line, else the last line."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:") or (":" in line and line.split(":", 1)[0].endswith(("Error", "Exception"))):
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return _first_line(lines[-1] if lines else "", limit)


def outcome_of(run: PlannedRun, launch_error: Optional[BaseException] = None) -> tuple[str, str]:
    """(state, reason) of a launched run, from its run directory's record and the launcher's error: `busy` when the
    job found another launch holding the run (exit code 3), `killed` when the job ended without a result and the
    record still says `running`, `running` when the record says so and no job of this launch ended (a summary made
    again later)."""
    record = records.read_record(Path(run.run_dir))
    if record is not None and record.get("run_id") != run.run_id:
        record = None
    status = (record or {}).get("status")
    if status == layout.STATUS_COMPLETE:
        return DONE, ""
    if isinstance(launch_error, JobExited) and launch_error.code == exit_codes.RUN_BUSY:
        return BUSY, f"another launch holds it: {run_lock.holder(Path(run.run_dir))}"
    if status == layout.STATUS_FAILED:
        err = records.part(record, "error")
        return FAILED, f"{err.get('type', 'error')}: {_first_line(err.get('message', ''))}"
    if status == layout.STATUS_INTERRUPTED:
        return INTERRUPTED, _first_line(records.part(record, "interrupted").get("reason", "interrupted"))
    if status == layout.STATUS_RUNNING:
        proc = records.part(record, "process")
        said = (f"its record says running (pid {proc.get('pid', '?')} on {proc.get('host', '?')}, started "
                f"{record.get('started', '?')})")
        if launch_error is not None:
            return KILLED, f"{said}, and the job ended without a result ({type(launch_error).__name__})"
        return RUNNING, f"{said}: still running, or killed (the same command resumes it)"
    if launch_error is not None:
        return FAILED, f"no record; {type(launch_error).__name__}: {_error_line(launch_error)}"
    return FAILED, "no record written (killed, or stopped before its run directory was made; see the job log)"


def summarise(plan: Sequence[PlannedRun], folder: Optional[Path], launcher: str) -> dict:
    counts: dict[str, int] = {}
    for run in plan:
        counts[run.state or NOT_RUN] = counts.get(run.state or NOT_RUN, 0) + 1
    summary = {
        "launcher": launcher,
        "sweep_folder": None if folder is None else str(folder),
        "finished": datetime.now().astimezone().isoformat(),
        "counts": counts,
        "runs": [{"index": r.index, "state": r.state or NOT_RUN, "run_id": r.run_id, "run_dir": r.run_dir,
                  "label": label, "overrides": list(filter_overrides(r.overrides)), "reason": r.reason,
                  "slurm_job_id": r.slurm_job_id, "result": _result(r)}
                 for r, label in zip(plan, short_labels([r.overrides for r in plan]))],
    }
    return summary


def _short(label: str, limit: int = 40) -> str:
    return label if len(label) <= limit else label[: limit - 3] + "..."


def _result(run: PlannedRun) -> dict:
    """The numbers of a run whose record is complete (`experiments.run_summary.summary_row`), else {}."""
    record = records.read_record(Path(run.run_dir))
    return summary_row(record if record and record.get("run_id") == run.run_id else None)


def format_summary(summary: dict) -> str:
    order = [DONE, SKIPPED, QUEUED, DUPLICATE, FAILED, KILLED, INTERRUPTED, BUSY, RUNNING, NOT_RUN]
    counts = summary["counts"]
    head = ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
    lines = [f"[sweep] summary: {len(summary['runs'])} run(s): {head}"]
    for row in summary["runs"]:
        job = f" [slurm {row['slurm_job_id']}]" if row.get("slurm_job_id") else ""
        line = f"[sweep]   {row['state']:<11} {row['run_id']}  {row['label']}{job}"
        if row["state"] not in (DONE, SKIPPED) and row["reason"]:
            line += f"\n[sweep]               {row['reason']} ({row['run_dir']})"
        lines.append(line)
    table = table_lines([(_short(row["label"]), row.get("result") or {}) for row in summary["runs"]])
    if table:
        lines.append("[sweep] results (pass@1; retained KL in nats/token, headline and per domain; answers changed or "
                     "choices flipped; seconds):")
        lines += [f"[sweep]   {line}" for line in table]
    if summary.get("sweep_folder"):
        lines.append(f"[sweep] summary written to {Path(summary['sweep_folder']) / SUMMARY_TXT}")
    return "\n".join(lines)


def report(plan: Sequence[PlannedRun], folder: Optional[Path], launcher: str) -> dict:
    summary = summarise(plan, folder, launcher)
    text = format_summary(summary)
    if folder is not None:
        records.atomic_write_json(folder / SUMMARY_JSON, summary)
        (folder / SUMMARY_TXT).write_text(text + "\n", encoding="utf-8")
    print(text, flush=True)
    return summary


def skipped_return(run: PlannedRun) -> JobReturn:
    ret = JobReturn(overrides=run.overrides, status=JobStatus.COMPLETED, working_dir=os.getcwd())
    ret.return_value = records.read_record(Path(run.run_dir))
    return ret


class JobExited(RuntimeError):
    """A sweep job whose entry point exited (`sys.exit`) instead of returning; `code` is its exit code
    (`experiments.exit_codes`); the job printed why (on the console, or in its log for a parallel job)."""

    def __init__(self, code: Any) -> None:
        super().__init__(code)  # the code alone in `args`, so the error pickles back from a job's process
        self.code = code

    def __str__(self) -> str:
        return f"the job exited with code {self.code} (its output says why)"

    @property
    def interrupted(self) -> bool:
        """The run was stopped by a signal (and recorded itself interrupted): a sweep stops launching runs."""
        return self.code == exit_codes.INTERRUPTED


def stops_the_sweep(error: Optional[BaseException]) -> bool:
    """Whether a job's outcome means a signal asked the sweep to stop: the run raised `Preempted` (a checkpoint
    was saved) or its entry point exited with the interrupted code."""
    # here, not at the top: Hydra imports this module at start; the runtime (torch) loads only when a sweep is planned
    from experiments.train import Preempted

    return isinstance(error, Preempted) or (isinstance(error, JobExited) and error.interrupted)


def failed_return(run: PlannedRun, error: BaseException) -> JobReturn:
    ret = JobReturn(overrides=run.overrides, status=JobStatus.FAILED, working_dir=os.getcwd())
    ret.return_value = error
    return ret


# --------------------------------------------------------------------------------- code snapshot


def code_root() -> Path:
    """The folder holding the suite's code (run.py, conf/, the packages)."""
    return Path(experiments.__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {out.stderr.strip()}")
    return out.stdout


def snapshot_code(dest: Path, exclude: Sequence[Path] = (), repo: Optional[Path] = None) -> dict:
    """Copy the code as it is now (committed, modified and untracked-but-not-ignored files) to `dest`.

    `dest` becomes a git checkout of the current commit with the working tree's changes on top,
    so a run's provenance (git sha, dirty flag) read inside the snapshot is that of the launch.
    Untracked files over SNAPSHOT_COPY_LIMIT are linked rather than copied (data, not code); paths
    under `exclude` (the run root) are left out. `repo`: the checkout to copy (default: this code's).
    """
    try:
        repo = Path(_git(repo or code_root(), "rev-parse", "--show-toplevel").strip())
        sha = _git(repo, "rev-parse", "HEAD").strip()
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(f"the code snapshot needs a git checkout ({exc}); set hydra.launcher.snapshot=false "
                           "to run the jobs from the live tree") from exc
    excluded = [Path(p).resolve() for p in exclude]

    def keep(rel: str) -> bool:
        path = (repo / rel).resolve()
        return not any(path == e or e in path.parents for e in excluded)

    _git(repo, "clone", "--quiet", "--shared", "--no-checkout", str(repo), str(dest))
    _git(dest, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", sha)
    # Working tree against the commit: modified, added (staged) and deleted tracked files.
    entries = _git(repo, "diff", "--no-renames", "--name-status", "-z", sha).split("\0")
    changed = 0
    for status, rel in zip(entries[0::2], entries[1::2]):
        if not rel or not keep(rel):
            continue
        changed += 1
        src, dst = repo / rel, dest / rel
        if status.startswith("D") or not src.exists():
            dst.unlink(missing_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    untracked = 0
    for rel in _git(repo, "ls-files", "-z", "--others", "--exclude-standard").split("\0"):
        if not rel or rel.endswith("/") or not keep(rel):
            continue
        src, dst = repo / rel, dest / rel
        if not src.is_file():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.stat().st_size > SNAPSHOT_COPY_LIMIT:
            dst.symlink_to(src)
        else:
            shutil.copy2(src, dst)
        untracked += 1
    return {"path": str(dest), "repo": str(repo), "git_sha": sha, "changed_files": changed,
            "untracked_files": untracked}


# ------------------------------------------------------------------------------------------ SLURM


def live_slurm_jobs(job_ids: Sequence[str]) -> dict[str, str]:
    """{job id: state} of those of `job_ids` that SLURM still holds as pending/running (squeue)."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    live = {}
    for line in out.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid in job_ids and state in LIVE_SLURM_STATES:
            live[jid] = state
    return live



def mark_still_queued(plan: Sequence[PlannedRun]) -> None:
    """Mark runs whose SLURM job from an earlier launch is still pending or running (not submitted twice)."""
    markers = {}
    for run in plan:
        if run.state is not None:
            continue
        try:
            marker = json.loads((Path(run.run_dir) / SLURM_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none, or not UTF-8 JSON
            continue
        if isinstance(marker, dict) and marker.get("job_id"):
            markers[run.index] = str(marker["job_id"])
    live = live_slurm_jobs(sorted(set(markers.values())))
    for run in plan:
        jid = markers.get(run.index)
        if jid in live:
            run.state, run.slurm_job_id = QUEUED, jid
            run.reason = f"SLURM job {jid} from an earlier launch is {live[jid]}"


def refresh_queued(plan: Sequence[PlannedRun]) -> None:
    """Before the summary: a run left to a job of an earlier launch is done once its record is complete."""
    queued = [run for run in plan if run.state == QUEUED]
    live = live_slurm_jobs([run.slurm_job_id for run in queued if run.slurm_job_id])
    for run in queued:
        if run.slurm_job_id in live:
            run.reason = f"SLURM job {run.slurm_job_id} from an earlier launch is {live[run.slurm_job_id]}"
            continue
        run.state, run.reason = outcome_of(run)
        if run.state == DONE:
            run.reason = f"by SLURM job {run.slurm_job_id} of an earlier launch"


def write_slurm_marker(run: PlannedRun, folder: Path) -> None:
    Path(run.run_dir).mkdir(parents=True, exist_ok=True)
    records.atomic_write_json(Path(run.run_dir) / SLURM_MARKER, {"job_id": run.slurm_job_id, "sweep_folder": str(folder)})


# ------------------------------------------------------------------------------------------- CLI


def summarise_folder(folder: Path) -> dict:
    """Summarise a sweep folder again from its plan and the run directories as they are now."""
    rows = json.loads((folder / PLAN_JSON).read_text(encoding="utf-8"))
    plan = []
    for row in rows:
        run = PlannedRun(**{k: row.get(k) for k in ("index", "overrides", "run_id", "run_dir", "state", "reason",
                                                      "slurm_job_id")})
        if run.state not in (SKIPPED, DUPLICATE):
            run.state, run.reason = outcome_of(run)
            if run.state == FAILED and not (Path(run.run_dir) / layout.RECORD_NAME).exists():
                live = live_slurm_jobs([run.slurm_job_id] if run.slurm_job_id else [])
                if run.slurm_job_id in live:
                    run.state, run.reason = QUEUED, f"SLURM job {run.slurm_job_id} is {live[run.slurm_job_id]}"
        plan.append(run)
    summary = summarise(plan, None, "summary")
    print(format_summary(summary), flush=True)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hydra_plugins.atlas_sweep.planner", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="summarise a sweep folder again from the run directories")
    p.add_argument("folder", type=Path, help="a sweep folder, <run_root>/.sweeps/<timestamp>")
    args = parser.parse_args(argv)
    if not (args.folder / PLAN_JSON).is_file():
        print(f"error: {args.folder} is not a sweep folder (no {PLAN_JSON})", file=sys.stderr)
        return 2
    summary = summarise_folder(args.folder)
    return 1 if summary["counts"].get(FAILED) or summary["counts"].get(KILLED) else 0


if __name__ == "__main__":
    sys.exit(main())
