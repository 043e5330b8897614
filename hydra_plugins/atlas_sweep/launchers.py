"""The suite's Hydra launchers: skip complete runs, launch the rest, summarise (logic in hydra_plugins/atlas_sweep/planner.py).

Hydra instantiates launchers only from the `hydra_plugins` package, hence this module; it is
imported by Hydra's plugin scan on every start, so it imports nothing heavy at module level.

- `LocalSweepLauncher` (`hydra/launcher=local`): Hydra's basic launcher, jobs one after another here; with
  `jobs` > 1, that many jobs at a time on this machine, each in its own process (submitit's local executor).
- `SlurmSweepLauncher` (`hydra/launcher=slurm`, `slurm_local`): hydra-submitit-launcher's SLURM
  launcher; one job array, with a code snapshot per sweep, preemption-safe requeue, and a launcher
  that blocks until the array ends.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from experiments.validation import ConfigError
from hydra_plugins.atlas_sweep import planner as sweep


class LocalSweepLauncher(BasicLauncher):
    """Hydra's basic launcher with skip + summary: jobs one after another in this process (`jobs` 1), or up to
    `jobs` at a time, each in its own process on this machine with `threads_per_job` intra-op threads.

    Several jobs at a time pay on a machine that one run does not fill: on 2 cores a micro run's small operations
    leave the second core half idle, and two one-thread runs side by side train 1.3-1.5x the tokens per second
    of one two-thread run (docs/performance.md). Parallel jobs run through submitit's local executor (the same
    pickling and job folders as the SLURM launcher), each with its output in `<sweep folder>/submitit/<pid>/`.
    Runs that share a cache (the reference, EWC's Fisher) build it once under its lock.
    """

    def __init__(self, jobs: int = 1, threads_per_job: Optional[int] = None) -> None:
        super().__init__()
        self.jobs, self.threads_per_job = jobs, threads_per_job

    def parallel_settings(self) -> tuple[int, int]:
        """(jobs at a time, intra-op threads per job), checked: `jobs` an integer >= 1, `threads_per_job` null or an
        integer >= 1 (null: this machine's cores divided among the jobs, at least 1)."""
        jobs, threads = self.jobs, self.threads_per_job
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ConfigError(f"hydra.launcher.jobs={jobs!r} is not allowed: an integer >= 1 (runs at a time)")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"hydra.launcher.threads_per_job={threads!r} is not allowed: null (this machine's "
                              "cores divided among the jobs) or an integer >= 1")
        if threads is None:
            threads = max(1, len(os.sched_getaffinity(0)) // jobs)
        return jobs, threads

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        try:
            jobs, threads = self.parallel_settings()
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        plan = sweep.plan_or_exit(self.config, self.hydra_context, job_overrides, initial_job_idx)
        folder = sweep.new_sweep_folder(self.config.hydra.sweep.dir)
        sweep.write_plan(folder, plan)
        sweep.announce(plan, "run")
        if jobs > 1:
            returns = self._launch_parallel(plan, folder, jobs, threads)
            sweep.write_plan(folder, plan)
            sweep.report(plan, folder, "local")
            return returns
        returns: list[JobReturn] = []
        stop: Optional[BaseException] = None
        for run in plan:
            if run.state is not None:  # skipped (complete) or a duplicate of another job
                returns.append(sweep.skipped_return(run))
                continue
            if stop is not None:
                run.state, run.reason = sweep.NOT_RUN, f"the sweep stopped after {type(stop).__name__}: {stop}"
                continue
            try:
                ret = super().launch([run.overrides], run.index)[0]
            except SystemExit as exc:  # the entry point exits on a config error, a busy run or an interruption
                ret = sweep.failed_return(run, sweep.JobExited(exc.code))
            returns.append(ret)
            error = ret._return_value if ret.status == JobStatus.FAILED else None
            run.state, run.reason = sweep.outcome_of(run, error)
            if sweep.stops_the_sweep(error):
                stop = error  # a signal asked this process to stop: do not start the next run
        sweep.write_plan(folder, plan)
        sweep.report(plan, folder, "local")
        return returns

    def _launch_parallel(self, plan: Sequence[Any], folder: Path, jobs: int, threads: int) -> list[JobReturn]:
        """Run the plan's runs to launch, `jobs` at a time, each a submitit local job; fills in their states."""
        # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
        import submitit

        returns = [sweep.skipped_return(run) for run in plan if run.state is not None]
        todo = [run for run in plan if run.state is None]
        executor = submitit.LocalExecutor(folder=str(folder / "submitit" / "%j"))
        # No time limit of its own (submitit's local default is 2 minutes). No `setup` lines either: with them the
        # job starts under a shell, and a signal sent to the job would stop the shell, not the job.
        executor.update_parameters(timeout_min=60 * 24 * 365)
        task = LocalJobTask(self.hydra_context, self.task_function, os.getcwd(), Singleton.get_state(), threads)
        sweep.log(f"running {len(todo)} job(s), {jobs} at a time, {threads} thread(s) each "
                  f"(logs: {folder / 'submitit'})")
        gpus = shared_gpus()
        if gpus:
            sweep.log(f"warning: {jobs} jobs at a time share this machine's {gpus} GPU(s): each job uses the first one "
                      "it sees and holds its own copy of the model there; jobs=1 (one run fills a GPU) or "
                      "hydra/launcher=slurm is the way to use GPUs")
        running: dict[Any, Any] = {}  # submitit job -> planned run
        stop: Optional[str] = None
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, _frame: Any) -> None:  # pass a stop on to the running jobs: they checkpoint
            nonlocal stop
            stop = f"the launcher got {signal.Signals(signum).name}"
            for job in running:
                job._process.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        ended = 0
        try:
            queue = list(todo)
            while queue or running:
                while queue and len(running) < jobs and stop is None:
                    run = queue.pop(0)
                    job = executor.submit(task, run.config, run.index)
                    running[job] = run
                    sweep.log(f"started: {run.run_id} (job {job.job_id})")
                for job in [j for j in running if j.done()]:
                    run = running.pop(job)
                    try:
                        ret = job.result()
                        error = ret._return_value if ret.status == JobStatus.FAILED else None
                    except Exception as exc:  # the job's process ended without a result (killed)
                        ret, error = sweep.failed_return(run, exc), exc
                    returns.append(ret)
                    run.state, run.reason = sweep.outcome_of(run, error)
                    ended += 1
                    sweep.log(f"{ended}/{len(todo)} ended: {run.run_id} {run.state} (job {job.job_id})")
                    if sweep.stops_the_sweep(error) and stop is None:
                        stop = f"{type(error).__name__}: {error}"
                if running:
                    time.sleep(0.5)
                elif stop is not None:
                    break
        except KeyboardInterrupt:
            for job in running:
                job.cancel(check=False)
            sweep.log(f"interrupted; stopped {len(running)} running job(s). Launch the same command again: complete "
                      "runs are skipped and a stopped run resumes from its checkpoint.")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        for run in todo:
            if run.state is None:
                run.state, run.reason = sweep.NOT_RUN, f"the sweep stopped after {stop}"
        return returns


def shared_gpus() -> int:
    """How many CUDA devices this process sees (0 without CUDA); parallel local jobs would share them."""
    # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_submitit_job(hydra_context: Any, task_function: Any, launch_cwd: Optional[str],
                     singleton_state: Optional[dict], sweep_config: DictConfig, job_num: int) -> JobReturn:
    """One sweep job inside a submitit job's process (local or SLURM): back to the launch directory (relative
    paths in the config mean what they meant there) with the launcher's Hydra state, the job's id and number in
    `hydra.job`, then Hydra's `run_job` on the job's composed config; returns its JobReturn."""
    # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
    import submitit

    if launch_cwd:
        os.chdir(launch_cwd)
    if singleton_state is not None:
        Singleton.set_state(singleton_state)
    setup_globals()
    sweep.ensure_run_id_resolver()
    with read_write(sweep_config.hydra.job), open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.id = submitit.JobEnvironment().job_id
        sweep_config.hydra.job.num = job_num
    return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


class LocalJobTask:
    """One job of `LocalSweepLauncher`'s parallel mode, called in its own process by submitit: Hydra's `run_job`
    on the job's composed config, from the launch directory, with the launcher process's Hydra state."""

    def __init__(self, hydra_context: Any, task_function: Any, launch_cwd: str, singleton_state: dict,
                 threads: int) -> None:
        self.hydra_context, self.task_function = hydra_context, task_function
        self.launch_cwd, self.singleton_state, self.threads = launch_cwd, singleton_state, threads

    def __call__(self, sweep_config: DictConfig, job_num: int) -> JobReturn:
        # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
        import torch

        torch.set_num_threads(self.threads)  # a run's `train.num_threads`, when set, still decides
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # for the processes the run starts
            os.environ[name] = str(self.threads)
        try:
            return run_submitit_job(self.hydra_context, self.task_function, self.launch_cwd, self.singleton_state,
                                    sweep_config, job_num)
        except SystemExit as exc:  # hand the exit back as this job's outcome: without a result submitit's job
            # object waits 15 s for one and then reports the job as lost
            ret = JobReturn(overrides=list(sweep_config.hydra.overrides.task), status=JobStatus.FAILED,
                            working_dir=os.getcwd())
            ret.return_value = sweep.JobExited(exc.code)
            return ret


class SlurmSweepLauncher(SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher with skip, code snapshot, no double submission and summary.

    Each job's config is composed at launch (later edits of conf/ do not reach queued jobs) and the
    job imports the code from the sweep's snapshot. On USR2 (time limit near, or preemption) the
    training loop checkpoints at the next step boundary and hands the signal to submitit, which
    calls `checkpoint` (resubmit this same job) and requeues it; the requeued job resumes from the
    checkpoint in the same run directory.
    """

    def __init__(self, snapshot: bool = True, **params: Any) -> None:
        params.pop("submitit_folder", None)  # the sweep folder decides it
        super().__init__(**params)
        self.snapshot = bool(snapshot)
        self.launch_cwd: Optional[str] = None
        self.singleton_state: Optional[dict] = None
        self.requeued = False  # on the compute node: submitit called `checkpoint` (USR2) in this attempt

    # ---- on the submitting machine

    def _executor(self, folder: Path, code: Path) -> Any:
        # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        params = dict(self.params)
        init = {f"slurm_{k}": params.pop(k) for k in ("max_num_timeout",) if k in params}
        executor = submitit.AutoExecutor(folder=str(folder / "submitit" / "%j"), cluster="slurm", **init)
        # The job's Python starts in the code folder, so imports come from it (sys.path[0]); the job then
        # changes back to the launch directory, so relative paths in the config mean what they meant here.
        params["srun_args"] = list(params.get("srun_args") or []) + [f"--chdir={code}"]
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        plan = sweep.plan_or_exit(self.config, self.hydra_context, job_overrides, initial_job_idx)
        sweep.mark_still_queued(plan)
        folder = sweep.new_sweep_folder(self.config.hydra.sweep.dir)
        sweep.write_plan(folder, plan)
        sweep.announce(plan, "submit")
        todo = [run for run in plan if run.state is None]
        if not todo:
            sweep.report(plan, folder, "slurm")
            return [sweep.skipped_return(run) for run in plan]

        if self.snapshot:
            info = sweep.snapshot_code(folder / "code", exclude=[Path(str(self.config.hydra.sweep.dir))])
            code = Path(info["path"]).resolve()
            sweep.log(f"code snapshot {code} (git {info['git_sha'][:10]}, {info['changed_files']} changed and "
                      f"{info['untracked_files']} untracked file(s) on top)")
        else:
            code = sweep.code_root()
        self.launch_cwd = os.getcwd()
        self.singleton_state = Singleton.get_state()
        executor = self._executor(folder, code)
        jobs = executor.map_array(self, [run.config for run in todo], [run.index for run in todo])
        for run, job in zip(todo, jobs):
            run.slurm_job_id = job.job_id
            sweep.write_slurm_marker(run, folder)
        sweep.write_plan(folder, plan)
        sweep.log(f"submitted {len(jobs)} job(s) to SLURM as job {jobs[0].job_id.split('_')[0]} "
                  f"(logs: {folder / 'submitit'}); waiting for them to end (Ctrl-C stops waiting, the jobs keep running)")
        outcomes = self._wait(todo, jobs)
        returns = [sweep.skipped_return(run) for run in plan if run.state is not None]
        for run, job, outcome in zip(todo, jobs, outcomes):
            if isinstance(outcome, JobReturn):
                returns.append(outcome)
                error = outcome._return_value if outcome.status == JobStatus.FAILED else None
                run.state, run.reason = sweep.outcome_of(run, error)
            else:
                run.state, run.reason = sweep.outcome_of(run, outcome)
                returns.append(sweep.failed_return(run, RuntimeError(
                    f"run {run.run_id} ({run.run_dir}) {run.state}: {run.reason}; job log {job.paths.stderr}")))
        sweep.refresh_queued(plan)
        sweep.write_plan(folder, plan)
        sweep.report(plan, folder, "slurm")
        return returns

    @staticmethod
    def _wait(todo: Sequence[Any], jobs: Sequence[Any]) -> list[Any]:
        outcomes: list[Any] = [None] * len(jobs)
        pending = set(range(len(jobs)))
        try:
            while pending:
                for i in sorted(pending):
                    if not jobs[i].done():
                        continue
                    pending.discard(i)
                    try:
                        outcomes[i] = jobs[i].results()[0]
                    except Exception as exc:  # the job ended without a result (killed, cancelled, node failure)
                        outcomes[i] = exc
                    error = outcomes[i] if isinstance(outcomes[i], BaseException) else None
                    state = sweep.outcome_of(todo[i], error)[0]
                    sweep.log(f"{len(jobs) - len(pending)}/{len(jobs)} ended: job {jobs[i].job_id} "
                              f"{todo[i].run_id} {state}")
                if pending:
                    time.sleep(1.0)
        except KeyboardInterrupt:
            left = " ".join(jobs[i].job_id for i in sorted(pending))
            sweep.log(f"stopped waiting; still on the cluster: {left}. Launch the same command again later: "
                      "complete runs are skipped and runs still queued are not submitted twice.")
            raise
        return outcomes

    # ---- on the compute node

    def __call__(self, sweep_config: DictConfig, job_num: int) -> JobReturn:  # type: ignore[override]
        # here, not at the top: Hydra imports every plugin at start; torch and submitit load only when a sweep launches
        from experiments.train import Preempted

        self.requeued = False
        try:
            ret = run_submitit_job(self.hydra_context, self.task_function, self.launch_cwd, self.singleton_state,
                                   sweep_config, job_num)
        except Exception:
            if self.requeued:
                sys.exit(-1)
            raise
        if self.requeued:
            # submitit requeued this job and exits, but an error raised while unwinding replaced its exit:
            # leave no result, or the launcher would take this attempt for the end of the job.
            sweep.log(f"requeued; exiting without a result ({ret._return_value!r} while stopping)")
            sys.exit(-1)
        if ret.status == JobStatus.FAILED and isinstance(ret._return_value, Preempted):
            # Stopped by SIGTERM after a checkpoint (scancel, or a preemption SLURM requeues by itself): leave
            # no result behind, so the launcher waits for a requeued job instead of taking this as the end.
            sweep.log(f"{ret._return_value}; exiting without a result")
            sys.exit(1)
        if ret.status == JobStatus.FAILED:
            # Raise, so that the SLURM job ends FAILED (sacct) and submitit keeps the traceback; the run's
            # record already says failed, with the traceback.
            raise ret._return_value
        return ret

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on USR2: resubmit this same job; it resumes from the run's newest checkpoint."""
        sweep.log("requeueing this job; it resumes from the run's newest checkpoint")
        self.requeued = True  # reset when the requeued job starts (`__call__`)
        return super().checkpoint(*args, **kwargs)
