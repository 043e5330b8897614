"""Launcher configs, cluster profiles, the code snapshot, and the local launcher's skip + summary (no cluster)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from hydra_plugins.atlas_sweep import planner as sweep
from tests.conftest import REPO, run_cli
from tests.slurm.sweep_helpers import records_under, summary_rows, sweep_folder, sweep_lines

PROFILES = sorted((REPO / "slurm" / "profiles" / "hydra" / "launcher").glob("*.yaml"))


def launcher_config(*args: str) -> dict:
    proc = run_cli([*args, "--cfg", "hydra", "-p", "hydra.launcher"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load(proc.stdout)


@pytest.mark.slow
def test_local_stays_the_default_launcher():
    cfg = launcher_config()
    assert cfg["_target_"] == "hydra_plugins.atlas_sweep.launchers.LocalSweepLauncher"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["slurm", "slurm_local"])
def test_slurm_launcher_configs_requeue_on_timeout(name):
    cfg = launcher_config(f"hydra/launcher={name}")
    assert cfg["_target_"] == "hydra_plugins.atlas_sweep.launchers.SlurmSweepLauncher"
    assert cfg["max_num_timeout"] > 0 and cfg["signal_delay_s"] > 0 and cfg["snapshot"] is True
    for key in ("partition", "account", "qos", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min",
                "array_parallelism", "setup"):
        assert key in cfg, key
    if name == "slurm_local":
        assert cfg["partition"] == "debug" and cfg["gpus_per_node"] is None and cfg["cpus_per_task"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_cluster_profiles_compose_onto_the_slurm_launcher(profile):
    cfg = launcher_config("-cd", "slurm/profiles", f"hydra/launcher={profile.stem}")
    assert cfg["_target_"] == "hydra_plugins.atlas_sweep.launchers.SlurmSweepLauncher"
    assert cfg["max_num_timeout"] > 0 and cfg["partition"]


def test_profiles_exist():
    assert len(PROFILES) >= 2, PROFILES


def git(repo, *args):
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_code_snapshot_is_the_commit_with_the_working_tree_on_top(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for rel, text in {"a.py": "a = 1\n", "b.py": "b = 1\n", "gone.py": "x\n", "pkg/c.py": "c = 1\n",
                      ".gitignore": "ignored/\nruns/\n"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    sha = git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("a = 2\n")                       # modified, not staged
    (repo / "pkg" / "d.py").write_text("d = 1\n")
    git(repo, "add", "pkg/d.py")                                 # new, staged
    (repo / "gone.py").unlink()                                  # deleted
    (repo / "new.py").write_text("n = 1\n")                      # untracked
    (repo / "ignored").mkdir()
    (repo / "ignored" / "w.bin").write_text("w")                 # ignored
    (repo / "results" / "old").mkdir(parents=True)
    (repo / "results" / "old" / "x.py").write_text("x")          # untracked, under the run root
    monkeypatch.setattr(sweep, "SNAPSHOT_COPY_LIMIT", 10)
    (repo / "big.dat").write_text("0123456789abcdef")            # untracked and big: linked

    info = sweep.snapshot_code(tmp_path / "code", exclude=[repo / "results"], repo=repo)
    code = tmp_path / "code"
    assert info["git_sha"] == sha == git(code, "rev-parse", "HEAD")
    assert (code / "a.py").read_text() == "a = 2\n" and (code / "b.py").read_text() == "b = 1\n"
    assert (code / "pkg" / "d.py").read_text() == "d = 1\n" and (code / "new.py").read_text() == "n = 1\n"
    assert not (code / "gone.py").exists() and not (code / "ignored").exists() and not (code / "results").exists()
    assert (code / "big.dat").is_symlink() and (code / "big.dat").read_text() == "0123456789abcdef"
    # Provenance read inside the snapshot is the launch's: same commit, dirty.
    assert git(code, "status", "--porcelain", "--untracked-files=no")


@pytest.mark.slow
def test_code_snapshot_of_this_repo_imports_from_itself(tmp_path):
    info = sweep.snapshot_code(tmp_path / "code")
    code = tmp_path / "code"
    assert info["git_sha"] == git(REPO, "rev-parse", "HEAD") == git(code, "rev-parse", "HEAD")
    for rel in ("run.py", "hydra_plugins/atlas_sweep/planner.py", "hydra_plugins/atlas_sweep/launchers.py", "conf/config.yaml"):
        assert (code / rel).is_file(), rel
    # A job's Python starts in the snapshot: the code it imports is the snapshot's.
    probe = "import hydra_plugins.atlas_sweep.planner as s, hydra_plugins.atlas_sweep.launchers as l; print(s.__file__, l.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=code, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert all(p.startswith(str(code)) for p in out.stdout.split()), out.stdout


def runs_started(out: str, jobs: int) -> int:
    """How many runs a local sweep started: their own start lines in this process (jobs 1), or the launcher's
    `started:` lines (jobs > 1, each run's output is in its job log)."""
    if jobs == 1:  # "[run] <id>: lora on tiny/tiny, seed 0 -> <run dir>"
        return len(re.findall(r"^\[run\] [0-9a-f]{16}: .* seed \d+ -> ", out, flags=re.M))
    return len([line for line in sweep_lines(out) if line.startswith("[sweep] started: ")])


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_local_sweep_skips_complete_runs_reruns_failed_ones_and_summarises(overrides, tmp_path, jobs):
    runs = tmp_path / "runs"
    args = ["-m", "method=lora", "method._target_=tests.experiments.exploding_method.ExplodingLoRA",
            "+method.explode_at=2,100", f"hydra.launcher.jobs={jobs}", *overrides(runs)]
    first = run_cli(args)
    assert first.returncode != 0, first.stdout[-3000:]  # a run failed: the sweep says so with its exit code
    rows = summary_rows(first.stdout)
    assert rows["+method.explode_at=2"] == ("failed", rows["+method.explode_at=2"][1])
    assert rows["+method.explode_at=2"][1].startswith("RuntimeError: boom at step 2"), rows
    assert rows["+method.explode_at=100"][0] == "done", rows
    recs = records_under(runs)
    assert sorted(r["status"] for r in recs.values()) == ["complete", "failed"]
    failed = next(r for r in recs.values() if r["status"] == "failed")
    assert "Traceback" in failed["error"]["traceback"] and "after_step" in failed["error"]["traceback"]
    summary = json.loads((sweep_folder(first.stdout) / "summary.json").read_text())
    assert summary["counts"] == {"done": 1, "failed": 1}
    done = next(r for r in recs.values() if r["status"] == "complete")
    if jobs == 2:  # two processes side by side, the machine's cores split between them
        cores = len(os.sched_getaffinity(0))
        threads = max(1, cores // 2)
        assert f"[sweep] running 2 job(s), 2 at a time, {threads} thread(s) each" in first.stdout, sweep_lines(first.stdout)
        assert len({r["process"]["pid"] for r in recs.values()} | {os.getpid()}) == 3
        lines = sweep_lines(first.stdout)
        started = [i for i, line in enumerate(lines) if line.startswith("[sweep] started: ")]
        ended = [i for i, line in enumerate(lines) if " ended: " in line]
        assert len(started) == 2 and len(ended) == 2 and max(started) < min(ended), lines  # both ran at once
        assert done["cost"]["threads"] == threads
    else:
        assert done["cost"]["threads"] == 1  # run_cli's OMP_NUM_THREADS=1, in the launcher's own process

    again = run_cli(args)
    assert again.returncode != 0
    assert "[sweep] 2 run(s): 1 to run, 1 complete (skipped, nothing run for them)" in again.stdout, sweep_lines(again.stdout)
    rows = summary_rows(again.stdout)
    assert rows["+method.explode_at=100"][0] == "skipped" and rows["+method.explode_at=2"][0] == "failed"
    assert runs_started(again.stdout, jobs) == 1  # only the failed run ran again

    # The summary can be made again later from the run directories.
    proc = subprocess.run([sys.executable, "-m", "hydra_plugins.atlas_sweep.planner", "summary", str(sweep_folder(again.stdout))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "1 skipped, 1 failed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_invalid_config_in_a_sweep_launches_nothing(overrides, tmp_path):
    proc = run_cli(["-m", "method=lora", "train.lr=1e-3,-1", *overrides(tmp_path / "runs")], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "1 of 2 sweep jobs have an invalid config; nothing was launched" in proc.stderr, proc.stderr[-3000:]
    assert "#1 train.lr=-1: train.lr=-1.0 is not allowed" in proc.stderr and "[run]" not in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_overrides_that_do_not_change_the_science_run_once(overrides, tmp_path):
    proc = run_cli(["-m", "method=base", "train.log_every=5,10", *overrides(tmp_path / "runs")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 duplicate(s) of another job (not run twice)" in proc.stdout, sweep_lines(proc.stdout)
    assert proc.stdout.count(": complete; record ") == 1  # one run's "[run] <id>: complete; record ..." line


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["hydra.launcher.jobs=0", "hydra.launcher.jobs=two", "hydra.launcher.threads_per_job=0"])
def test_bad_parallel_settings_are_refused_before_any_run(overrides, tmp_path, setting):
    proc = run_cli(["-m", "method=lora", "seed=0,1", setting, *overrides(tmp_path / "runs")], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    key, value = setting.split("=")
    shown = value if value.isdigit() else repr(value)
    assert f"error: {key}={shown} is not allowed" in proc.stderr, proc.stderr[-3000:]
    assert "[run]" not in proc.stdout and "[sweep] running" not in proc.stdout
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*/record.json"))


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_local_sweep_stopped_by_sigterm_checkpoints_its_runs_and_resumes(jobs, overrides, tmp_path):
    # SIGTERM to the launcher (a shutdown, a `kill`) reaches the running jobs: each checkpoints at its next step
    # boundary and records itself interrupted, and no further run starts; the same command later resumes and
    # completes them all.
    runs = tmp_path / "runs"
    args = ["-m", "method=lora", "method._target_=tests.slurm.slow_method.SlowLoRA", "+method.step_sleep_s=0.1",
            "seed=0,1", f"hydra.launcher.jobs={jobs}",
            *overrides(runs, **{"train.steps": "60", "train.checkpoint_every": "5"})]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:  # `jobs` runs training: each has saved a checkpoint
            if [any(d.glob("step_*.pt")) for d in runs.glob("*/checkpoints")] == [True] * jobs:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the sweep ended before its runs were training"
        assert [r["status"] for r in records_under(runs).values()] == ["running"] * jobs
        proc.send_signal(signal.SIGTERM)  # 60 steps of at least 0.1 s each: the runs are mid-training
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-3000:]
    recs = records_under(runs)
    assert [r["status"] for r in recs.values()] == ["interrupted"] * jobs, out[-3000:]
    steps = {rid: r["interrupted"]["step"] for rid, r in recs.items()}
    assert all(isinstance(s, int) and 5 <= s < 60 for s in steps.values()), steps
    rows = summary_rows(out)
    assert sorted(state for state, _ in rows.values()) == sorted(["interrupted"] * jobs + ["not run"] * (2 - jobs)), rows
    assert "has not produced any output" not in out  # each stopped job handed its outcome back to the launcher

    again = run_cli(args, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:]
    recs = records_under(runs)
    assert [r["status"] for r in recs.values()] == ["complete", "complete"]
    assert {rid: r["train"]["resumed_from"] for rid, r in recs.items() if rid in steps} == steps


@pytest.mark.parametrize("gpus", [0, 2])
def test_parallel_jobs_on_a_gpu_machine_are_warned_that_they_share_its_gpus(gpus, tmp_path, monkeypatch, capsys):
    from hydra_plugins.atlas_sweep import launchers

    monkeypatch.setattr(launchers, "shared_gpus", lambda: gpus)
    launcher = launchers.LocalSweepLauncher(jobs=2)
    launcher.hydra_context, launcher.task_function = None, None
    assert launcher._launch_parallel([], tmp_path, 2, 1) == []  # nothing to run: only the start lines
    out = capsys.readouterr().out
    assert "running 0 job(s), 2 at a time" in out
    assert ("share this machine's 2 GPU(s)" in out) == (gpus > 0), out


def run_id_of(*overrides):
    from hydra import compose, initialize_config_dir

    from experiments.job import run_id_for

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return run_id_for(compose("config", overrides=list(overrides)))


@pytest.mark.slow
def test_a_sweep_moves_an_unreadable_record_aside_and_runs_the_run_again(overrides, tmp_path):
    runs = tmp_path / "runs"
    args = ["method=base", *overrides(runs)]
    bad = runs / run_id_of(*args, "seed=0") / "record.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("[1, 2]")
    proc = run_cli(["-m", "seed=0,1", *args])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sweep] 2 run(s): 2 to run" in proc.stdout, sweep_lines(proc.stdout)
    assert f"{bad} is no record of this run (it holds a JSON array, not an object); moved aside to " \
           "record.json.unreadable-" in proc.stdout
    assert {state for state, _ in summary_rows(proc.stdout).values()} == {"done"}
    assert [p.read_text() for p in bad.parent.glob("record.json.unreadable-*")] == ["[1, 2]"]
    assert json.loads(bad.read_text())["status"] == "complete"


def test_jobs_of_different_runs_never_share_a_directory_and_write_only_into_their_own(tmp_path):
    from experiments.validation import ConfigError

    root = tmp_path / "runs"
    seen = {}
    sweep.check_job_dir(seen, 0, "0123456789abcdef", str(root), "0123456789abcdef", root)
    sweep.check_job_dir(seen, 1, "0123456789abcdef", str(root), "0123456789abcdef", root)  # a duplicate: run once
    with pytest.raises(ConfigError, match=r"hydra.sweep.subdir='0123456789abcdef' is not allowed: one directory "
                                          r"per run; jobs #0 and #2 are different runs \(0123456789abcdef, "
                                          r"fedcba9876543210\)"):
        sweep.check_job_dir(seen, 2, "fedcba9876543210", str(root), "0123456789abcdef", root)
    with pytest.raises(ConfigError, match=r"hydra.sweep.subdir='same' is not allowed: a run writes only into its own"):
        sweep.check_job_dir({}, 0, "fedcba9876543210", str(root), "same", root)
    with pytest.raises(ConfigError, match=rf"hydra.sweep.dir='{tmp_path / 'other'}' is not allowed"):
        sweep.check_job_dir({}, 0, "fedcba9876543210", str(tmp_path / "other"), "fedcba9876543210", root)


@pytest.mark.slow
def test_distinct_runs_given_one_directory_are_refused_before_any_run(overrides, tmp_path):
    proc = run_cli(["-m", "method=base", "seed=0,1", "hydra.sweep.subdir=same", *overrides(tmp_path / "runs")],
                   timeout=120)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 of 2 sweep jobs have an invalid config; nothing was launched" in proc.stderr
    assert "#1 seed=1: hydra.sweep.subdir='same' is not allowed: one directory per run; jobs #0 and #1 are " \
           "different runs" in proc.stderr, proc.stderr[-3000:]
    assert "[run]" not in proc.stdout and not (tmp_path / "runs" / "same").exists()


def planned(run_dir, run_id="0123456789abcdef"):
    return sweep.PlannedRun(0, ["seed=0"], run_id, str(run_dir))


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_the_summary_says_what_the_record_says(tmp_path):
    from submitit.core.utils import UncompletedJobError

    from experiments import run_lock

    run = planned(tmp_path / "0123456789abcdef")
    running = {"run_id": run.run_id, "status": "running", "process": {"pid": 77, "host": "node3"},
               "started": "2026-01-01T00:00:00+00:00"}
    write_json(tmp_path / run.run_id / "record.json", running)
    # A job killed outright (SIGKILL, out of memory): its record still says running, submitit's error is the job's
    # last stderr line.
    state, reason = sweep.outcome_of(run, UncompletedJobError("Job 12 (task: 0) with path ...\nwarnings.warn("))
    assert state == "killed" and "its record says running (pid 77 on node3, started 2026-01-01" in reason, reason
    assert "UncompletedJobError" in reason and "warnings.warn" not in reason
    state, reason = sweep.outcome_of(run)  # a summary made again later, while it may still be running
    assert state == "running" and "still running, or killed" in reason
    # Another launch holds the run (the job exited with code 3): named from the lock file.
    with run_lock.hold(tmp_path / run.run_id):
        state, reason = sweep.outcome_of(run, sweep.JobExited(3))
    assert state == "busy" and reason.startswith(f"another launch holds it: pid {os.getpid()} on "), reason
    run.state, run.reason = state, reason
    assert f"[sweep]               {reason} (" in sweep.format_summary(sweep.summarise([run], None, "local"))
    # A record written by other code may hold anything where the summary looks.
    write_json(tmp_path / run.run_id / "record.json", {"run_id": run.run_id, "status": "failed", "error": "boom"})
    assert sweep.outcome_of(run) == ("failed", "error: ")
    for bad in (b"[1]", b"\xff\xfe", b'{"run_id": '):
        (tmp_path / run.run_id / "record.json").write_bytes(bad)
        assert sweep.outcome_of(run)[0] == "failed"


def test_a_slurm_marker_of_another_shape_is_no_marker(tmp_path):
    run = planned(tmp_path / "0123456789abcdef")
    for bad in (b"[1]", b"\xff\xfe", b'"12"', b"{"):
        (tmp_path / run.run_id).mkdir(exist_ok=True)
        (tmp_path / run.run_id / sweep.SLURM_MARKER).write_bytes(bad)
        sweep.mark_still_queued([run])  # planning goes on: the run is launched as if no job were known
        assert run.state is None and run.slurm_job_id is None
