"""Sweeps through the real local SLURM cluster (slurm/local_cluster.sh): run, skip, re-submit, requeue on
USR2 and resume, failure records. Run with `python -m pytest -m slurm` once the cluster is up."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, run_cli
from tests.slurm.sweep_helpers import (
    format_sacct,
    records_under,
    sacct,
    submitted_job,
    summary_rows,
    sweep_folder,
    sweep_lines,
)

pytestmark = pytest.mark.slurm
SLURM = "hydra/launcher=slurm_local"


def test_sweep_runs_through_slurm_then_skips_complete_runs_and_resubmits_a_missing_one(cluster, overrides,
                                                                                      tmp_path):
    runs = tmp_path / "runs"
    args = ["-m", "method=lora,base", "seed=0,1", SLURM, *overrides(runs)]
    first = run_cli(args, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[sweep] 4 run(s): 4 to submit" in first.stdout, sweep_lines(first.stdout)
    array = submitted_job(first.stdout)
    rows = sacct(array, min_rows=4)
    print(format_sacct(rows))
    assert sorted(r["JobID"] for r in rows) == [f"{array}_{i}" for i in range(4)], rows
    assert all(r["State"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in rows), rows
    recs = records_under(runs)
    assert len(recs) == 4 and all(r["status"] == "complete" for r in recs.values())
    assert sorted((r["method"], r["seed"]) for r in recs.values()) == [("base", 0), ("base", 1), ("lora", 0),
                                                                        ("lora", 1)]
    assert all(r["provenance"]["slurm_job_id"] for r in recs.values())
    labels = summary_rows(first.stdout)
    assert {k: v[0] for k, v in labels.items()} == {f"method={m} seed={s}": "done" for m in ("lora", "base")
                                                     for s in (0, 1)}
    # Each job ran from the sweep's code snapshot.
    folder = sweep_folder(first.stdout)
    assert (folder / "code" / "run.py").is_file()
    log = next((folder / "submitit").glob(f"{array}_0/*_log.out")).read_text()
    assert "[run] " in log and "complete; record" in log

    again = run_cli(args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[sweep] nothing to submit: every run already has a complete record" in again.stdout, sweep_lines(again.stdout)
    assert "[sweep] submitted" not in again.stdout and "[run]" not in again.stdout
    assert {v[0] for v in summary_rows(again.stdout).values()} == {"skipped"}
    assert records_under(runs) == recs

    lora1 = next(r for r in recs.values() if r["method"] == "lora" and r["seed"] == 1)
    (runs / lora1["run_id"] / "record.json").unlink()
    third = run_cli(args, timeout=600)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "[sweep] 4 run(s): 1 to submit, 3 complete (skipped, nothing submitted for them)" in third.stdout
    assert "[sweep] submitted 1 job(s) to SLURM" in third.stdout
    rows = sacct(submitted_job(third.stdout))
    print(format_sacct(rows))
    assert len(rows) == 1 and rows[0]["State"] == "COMPLETED", rows
    states = {k: v[0] for k, v in summary_rows(third.stdout).items()}
    assert states == {"method=lora seed=0": "skipped", "method=lora seed=1": "done", "method=base seed=0": "skipped",
                      "method=base seed=1": "skipped"}
    redone = records_under(runs)[lora1["run_id"]]
    assert redone["status"] == "complete" and redone["train"]["losses"] == lora1["train"]["losses"]


def test_usr2_requeues_the_job_which_resumes_to_the_uninterrupted_result_and_w_and_b_run(cluster, overrides,
                                                                                        tmp_path):
    slow = {"train.steps": "40", "train.checkpoint_every": "3"}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    # The uninterrupted reference runs here, at the same time as the SLURM job.
    straight = subprocess.Popen([sys.executable, "run.py", "method=lora", *overrides(tmp_path / "straight", **slow)],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "run.py", "-m", "method=lora", "logger=wandb", SLURM,
                             *overrides(runs, **slow)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not list(runs.glob("*/checkpoints/step_00000003.pt")):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.02)
        marker = next(runs.glob("*/.slurm_job.json"))
        job_id = json.loads(marker.read_text())["job_id"]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
        # While the job waits to start again, its record says interrupted (not failed).
        record = marker.parent / "record.json"
        seen = None
        while time.time() < deadline and proc.poll() is None:
            if record.exists():
                seen = json.loads(record.read_text())["status"]
                if seen in ("interrupted", "complete"):
                    break
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=300)
        ref_out, _ = straight.communicate(timeout=300)
    finally:
        for p in (proc, straight):
            if p.poll() is None:
                p.kill()
    assert seen == "interrupted", seen
    assert proc.returncode == 0, out[-3000:]
    assert straight.returncode == 0, ref_out[-3000:]
    log = next((sweep_folder(out) / "submitit").glob(f"{job_id}/*_log.out")).read_text()
    m = re.search(r"\[train\] SIGUSR2: checkpoint saved at step (\d+)", log)
    assert m, log[-3000:]
    step = int(m.group(1))
    assert 3 <= step < 40
    assert f"[train] resumed from checkpoint step_{step:08d}.pt at step {step}" in log, log[-3000:]
    assert "Requeued job" in log
    rows = sacct(job_id, duplicates=True)
    print(format_sacct(rows))
    assert [r["State"] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    resumed = next(iter(records_under(runs).values()))
    reference = next(iter(records_under(tmp_path / "straight").values()))
    assert resumed["run_id"] == reference["run_id"]
    assert resumed["status"] == "complete" and resumed["train"]["resumed_from"] == step
    assert resumed["train"]["losses"] == pytest.approx(reference["train"]["losses"], rel=1e-6)
    assert resumed["train"]["final_loss"] == pytest.approx(reference["train"]["final_loss"], rel=1e-6)
    assert resumed["metrics"]["retained_kl_mean"] == pytest.approx(reference["metrics"]["retained_kl_mean"], rel=1e-5)
    # Both attempts logged to the same (offline) W&B run: its id is the run id.
    attempts = sorted((runs / resumed["run_id"] / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(p.name.endswith(f"-{resumed['run_id']}") for p in attempts), attempts
    assert [state for state, _ in summary_rows(out).values()] == ["done"]


def test_a_raising_job_is_recorded_failed_named_by_the_summary_and_resubmitted(cluster, overrides, tmp_path):
    runs = tmp_path / "runs"
    args = ["-m", "method=lora", "method._target_=tests.experiments.exploding_method.ExplodingLoRA",
            "+method.explode_at=2,100", SLURM, *overrides(runs)]
    first = run_cli(args, timeout=600)
    assert first.returncode != 0, first.stdout[-3000:]  # the sweep reports the failure in its exit code
    rows = summary_rows(first.stdout)
    assert rows["+method.explode_at=2"][0] == "failed", rows
    assert rows["+method.explode_at=2"][1].startswith("RuntimeError: boom at step 2"), rows
    assert rows["+method.explode_at=100"][0] == "done", rows
    recs = records_under(runs)
    failed = next(r for r in recs.values() if r["status"] == "failed")
    assert failed["error"]["type"] == "RuntimeError" and failed["error"]["message"] == "boom at step 2"
    assert "Traceback" in failed["error"]["traceback"] and "after_step" in failed["error"]["traceback"]
    array = submitted_job(first.stdout)
    acct = sacct(array, min_rows=2)
    print(format_sacct(acct))
    assert sorted(r["State"] for r in acct) == ["COMPLETED", "FAILED"], acct

    again = run_cli(args, timeout=600)
    assert again.returncode != 0
    assert "[sweep] 2 run(s): 1 to submit, 1 complete (skipped, nothing submitted for them)" in again.stdout, \
        sweep_lines(again.stdout)
    rows = summary_rows(again.stdout)
    assert rows["+method.explode_at=2"][0] == "failed" and rows["+method.explode_at=100"][0] == "skipped"
    acct = sacct(submitted_job(again.stdout))
    print(format_sacct(acct))
    assert [r["State"] for r in acct] == ["FAILED"], acct


def _time_limit_attempt(overrides, runs):
    """One sweep of a job with a 1-minute limit; returns (job id, sweep output, its submitit log)."""
    steps = 360
    args = ["-m", "method=lora", "method._target_=tests.slurm.slow_method.SlowLoRA", "+method.step_sleep_s=0.1",
            SLURM, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=25",
            *overrides(runs, **{"train.steps": str(steps), "train.checkpoint_every": "50"})]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        job_id = None
        while time.time() < deadline and proc.poll() is None:
            markers = list(runs.glob("*/.slurm_job.json"))
            if markers and job_id is None:
                job_id = json.loads(markers[0].read_text())["job_id"]
            if job_id and any(r["State"] == "REQUEUED" for r in sacct(job_id, duplicates=True, wait_final_s=0)):
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=True, timeout=30)
                break
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    rows = sacct(job_id, duplicates=True)
    print(format_sacct(rows))
    assert [r["State"] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    return job_id, out, next((sweep_folder(out) / "submitit").glob(f"{job_id}/*_log.out")).read_text()


def test_a_job_at_its_time_limit_gets_usr2_from_slurm_is_requeued_and_resumes(cluster, overrides, tmp_path):
    # A 1-minute limit with --signal=USR2@25: SLURM checks time limits every 30 s and signals a job with
    # at most 25+30 s left, i.e. 5-35 s after it starts, while its 36 s of training (360 steps of 0.1 s)
    # still go on. Once requeued, the job gets a longer limit so that it ends without a second signal.
    # A signal in the first seconds can come before training has begun (the job is still loading): submitit
    # requeues it with nothing to checkpoint, which tests nothing here, so that case is tried once more.
    steps = 360
    runs = tmp_path / "runs"
    job_id, out, log = _time_limit_attempt(overrides, runs)
    if "[train] SIGUSR2" not in log and "Requeued job" in log:
        runs = tmp_path / "again"
        job_id, out, log = _time_limit_attempt(overrides, runs)
    m = re.search(r"\[train\] SIGUSR2: checkpoint saved at step (\d+)", log)
    assert m and "Job has timed out" in log and "Requeued job" in log, log[-3000:]
    step = int(m.group(1))
    assert f"[train] resumed from checkpoint step_{step:08d}.pt at step {step}" in log, log[-3000:]
    rec = next(iter(records_under(runs).values()))
    assert rec["status"] == "complete" and len(rec["train"]["losses"]) == steps and rec["train"]["resumed_from"] == step
