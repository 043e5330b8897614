"""One run end to end through `python run.py` on a tiny backbone: record, skip, resume after SIGTERM, failure record."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from experiments import records
from suite_schema.layout import RECORD_NAME
from suite_schema.retained_samples import read_retained_samples
from tests.conftest import REPO, mounted_tmpfs, run_cli, tiny_overrides


def only_run_dir(root):
    dirs = [d for d in root.iterdir() if d.is_dir() and (d / RECORD_NAME).exists() or (d / "checkpoints").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def record_of(root):
    return json.loads((only_run_dir(root) / RECORD_NAME).read_text())


@pytest.fixture
def overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    def make(run_root, **extra):
        return tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, run_root, tmp_path / "cache", **extra)
    return make


@pytest.mark.slow
def test_run_writes_complete_record_then_rerun_skips(overrides, tmp_path):
    args = ["method=lora", *overrides(tmp_path / "runs")]
    first = run_cli(args)
    assert first.returncode == 0, first.stderr[-3000:]
    rec = record_of(tmp_path / "runs")
    assert rec["status"] == "complete" and rec["method"] == "lora" and rec["seed"] == 0
    # The run ends with what it found, on stdout and in run.log.
    shown = f"[result] pass@1 {rec['metrics']['target']['pass@1']:.4f} on {rec['metrics']['target']['n_problems']} problems"
    assert shown in first.stdout and shown in (only_run_dir(tmp_path / "runs") / "run.log").read_text()
    assert "[result]   math  " in first.stdout and "far KL" in first.stdout
    assert rec["train"]["steps"] == 6 and len(rec["train"]["losses"]) == 6
    assert rec["cost"]["trainable_params"] > 0 and rec["cost"]["stored_bytes"] > 0
    m = rec["metrics"]
    assert set(m["retained_near"]) == set(m["retained_far"]) == {"math", "commonsense"}  # micro_v3 has far items
    assert [e["n"] for e in m["retained_far"].values()] == [4, 4]
    near, far = ([e["kl_token_mean"] for e in m[k].values()] for k in ("retained_near", "retained_far"))
    assert m["retained_kl_mean"] == pytest.approx((sum(near) / 2 + sum(far) / 2) / 2, rel=1e-12)
    for entry in (*m["retained_near"].values(), *m["retained_far"].values()):
        items = entry["per_item"]
        assert len(items["kl_sum"]) == entry["n"] and sum(items["n_tokens"]) == entry["n_tokens"]
        assert sum(items["kl_sum"]) / entry["n_tokens"] == pytest.approx(entry["kl_token_mean"], rel=1e-9)
    problems = m["target"]["per_problem"]
    assert len(problems["task_ids"]) == m["target"]["n_problems"]
    assert sum(problems["passed"]) / len(problems["passed"]) == m["target"]["pass@1"]
    assert "pass@1" in m["target"]
    prov = rec["provenance"]
    assert len(prov["git_sha"]) == 40 and isinstance(prov["git_dirty"], bool) and prov["packages"]["torch"]
    assert prov["machine"]["cpu"] and prov["machine"]["cpu_capability"]  # e.g. "AMD EPYC", "AVX512"
    assert not list(only_run_dir(tmp_path / "runs").glob(".*.tmp"))
    # Files get the user's umask (a team shares a run root), not the 0600 of a temporary file.
    mask = os.umask(0)
    os.umask(mask)
    run_dir = only_run_dir(tmp_path / "runs")
    for path in (run_dir / "record.json", *sorted((run_dir / "checkpoints").glob("step_*.pt"))):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path

    second = run_cli(args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{rec['run_id']}: complete record" in second.stdout and "skipped" in second.stdout
    assert "[train]" not in second.stdout and "train lora" not in second.stderr  # no training happened
    assert record_of(tmp_path / "runs") == rec


@pytest.mark.slow
def test_base_method_trains_nothing_and_matches_itself(overrides, tmp_path):
    proc = run_cli(["method=base", *overrides(tmp_path / "runs")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = record_of(tmp_path / "runs")
    assert rec["train"] is None and rec["cost"]["trainable_params"] == 0
    for domain, m in rec["metrics"]["retained_near"].items():
        assert abs(m["kl_token_mean"]) < 1e-6, (domain, m)
    assert rec["metrics"]["retained_near"]["math"]["answer_change_rate"]["rate"] == 0.0


def signalled(args, root, pattern, signum):
    """Launch `python run.py ARGS`, send `signum` as soon as a file matching `pattern` exists under `root`; return
    (returncode, output, the record as it was just before the signal, the process id)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # SIGINT at its default in the run, as in a terminal: a test session started in the background by a shell without
    # job control inherits SIGINT ignored, and Python then raises no KeyboardInterrupt for it.
    proc = subprocess.Popen([sys.executable, "run.py", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 180
    while time.time() < deadline and not list(root.glob(pattern)):
        time.sleep(0.01)
    before = record_of(root)
    proc.send_signal(signum)
    log, _ = proc.communicate(timeout=120)
    return proc.returncode, log, before, proc.pid


@pytest.mark.slow
def test_sigterm_or_ctrl_c_mid_training_then_rerun_resumes_to_the_same_losses(overrides, tmp_path):
    """While it works, the record says `running` with the process (host, pid); SIGTERM or Ctrl-C (SIGINT)
    mid-training leaves `interrupted` naming the phase and a checkpoint that exists, exits 4, and the same command
    resumes to exactly the uninterrupted run's losses."""
    slow = ["train.steps=40", "train.checkpoint_every=3"]
    straight = run_cli(["method=lora", *overrides(tmp_path / "straight"), *slow])
    assert straight.returncode == 0, straight.stderr[-3000:]
    a = record_of(tmp_path / "straight")

    for signum, why in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT (Ctrl-C)")):
        root = tmp_path / signum.name
        args = ["method=lora", *overrides(root), *slow]
        # Stop as soon as the first periodic checkpoint exists: training is then mid-way.
        code, log, running, pid = signalled(args, root, "*/checkpoints/step_00000003.pt", signum)
        assert running["status"] == "running" and running["process"]["pid"] == pid
        assert len(running["provenance"]["git_sha"]) == 40
        assert code == 4 and "the same command resumes the run" in log, log[-3000:]
        rec = record_of(root)
        assert rec["status"] == "interrupted" and rec["phase"] == "train", rec.get("interrupted")
        assert rec["interrupted"]["reason"] == f"{why} during train"
        step = rec["interrupted"]["step"]
        assert 3 <= step < 40 and (only_run_dir(root) / "checkpoints" / f"step_{step:08d}.pt").is_file()

        resumed = run_cli(args)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resumed from checkpoint step_{step:08d}.pt at step {step}" in resumed.stdout
        b = record_of(root)
        assert b["status"] == "complete" and b["train"]["resumed_from"] == step
        assert b["train"]["losses"] == pytest.approx(a["train"]["losses"], rel=1e-6)
        assert b["train"]["final_loss"] == pytest.approx(a["train"]["final_loss"], rel=1e-6)


def metrics_of(run_dir):
    """The metrics of a run and of each of its post-hoc scales (the scale records under `scales/`)."""
    found = {"1": json.loads((run_dir / RECORD_NAME).read_text())["metrics"]}
    for path in sorted(run_dir.glob("scales/*/" + RECORD_NAME)):
        found[path.parent.name] = json.loads(path.read_text())["metrics"]
    return found


def retained_samples_of(run_dir):
    """The stored retained samples of a run and of each of its post-hoc scales."""
    found = {"1": read_retained_samples(run_dir)}
    for path in sorted(run_dir.glob("scales/*/" + RECORD_NAME)):
        found[path.parent.name] = read_retained_samples(path.parent)
    return found


@pytest.mark.slow
def test_a_signal_or_a_kill_during_evaluation_then_the_same_command_gives_the_uninterrupted_result(overrides,
                                                                                                 tmp_path):
    """SIGTERM / SIGINT during evaluation leave `interrupted` (phase evaluate) and exit 4; SIGKILL leaves the
    `running` record of a dead process. Each time the same command finishes the run: it says what the killed
    attempt left, removes partial files, does not train again, and gives exactly the uninterrupted metrics."""
    scales = "eval.scales=[0.5,1]"
    straight = run_cli(["method=lora", *overrides(tmp_path / "straight"), scales])
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = metrics_of(only_run_dir(tmp_path / "straight"))
    assert set(expected) == {"1", "0.5"}
    samples = retained_samples_of(only_run_dir(tmp_path / "straight"))
    assert set(samples) == {"1", "0.5"} and all(samples.values())

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        root = tmp_path / signum.name
        args = ["method=lora", *overrides(root), scales]
        code, log, running, pid = signalled(args, root, "*/export/*", signum)
        rec = record_of(root)
        if signum == signal.SIGKILL:
            assert code == -signal.SIGKILL and rec == running and rec["process"]["pid"] == pid  # nothing ran after
            # a writer killed mid-write leaves its temporary file: one for the record and one for a checkpoint
            (only_run_dir(root) / ".record.json.k1ll3d.tmp").write_text('{"status": "comp')
            (only_run_dir(root) / "checkpoints" / ".ckpt.k1ll3d.tmp").write_bytes(b"\0" * 64)
        else:
            assert code == 4, log[-3000:]
            assert rec["status"] == "interrupted" and rec["phase"] == "evaluate", rec
            why = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM"
            assert rec["interrupted"]["reason"] == f"{why} during evaluate"

        again = run_cli(args)
        assert again.returncode == 0, again.stderr[-3000:]
        run_dir = only_run_dir(root)
        assert "resumed from checkpoint step_00000006.pt at step 6" in again.stdout, again.stdout[-3000:]
        if signum == signal.SIGKILL:
            assert f"the previous attempt (pid {pid} on " in again.stdout, again.stdout[-3000:]
            assert "removed 2 partial file(s)" in again.stdout, again.stdout[-3000:]
        assert not records.partial_files(run_dir)
        assert record_of(root)["status"] == "complete"
        assert metrics_of(run_dir) == expected, signum.name
        assert retained_samples_of(run_dir) == samples, signum.name


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 96 KiB tmpfs: room for the run's config, log and records, not for a 145 KB training checkpoint."""
    yield from mounted_tmpfs(tmp_path / "small", "96k")


@pytest.mark.slow
def test_a_full_disk_leaves_a_failed_record_naming_enospc(overrides, small_tmpfs):
    proc = run_cli(["method=lora", *overrides(small_tmpfs / "runs")])
    assert proc.returncode == 1, proc.stderr[-3000:]
    rec = record_of(small_tmpfs / "runs")
    assert rec["status"] == "failed" and rec["phase"] == "train", (rec.get("error"), proc.stderr[-3000:])
    assert rec["error"]["errno"] == "ENOSPC" and "No space left on device" in rec["error"]["message"], rec["error"]
    assert not records.partial_files(only_run_dir(small_tmpfs / "runs"))  # the checkpoint's partial file is gone


@pytest.mark.slow
def test_a_raising_run_records_failed_with_traceback(overrides, tmp_path):
    args = ["method=lora", "+method.explode_at=2", "method._target_=tests.experiments.exploding_method.ExplodingLoRA",
            *overrides(tmp_path / "runs")]
    proc = run_cli(args)
    assert proc.returncode != 0
    rec = record_of(tmp_path / "runs")
    assert rec["status"] == "failed"
    assert rec["error"]["type"] == "RuntimeError" and rec["error"]["message"] == "boom at step 2"
    assert "Traceback" in rec["error"]["traceback"] and "after_step" in rec["error"]["traceback"]
    # the run's log file holds the lines it printed and the traceback
    log = next((tmp_path / "runs").glob("*/run.log")).read_text()
    assert "[run] " in log and "lora on micro/micro" in log and "[run] failed: RuntimeError: boom at step 2" in log
    assert "Traceback" in log and "[run] failed" not in proc.stdout  # the traceback goes to the file, not twice to the console


@pytest.mark.slow
def test_a_machine_where_no_sandbox_works_stops_the_run_before_training_in_one_line(overrides, tmp_path):
    """Every run scores coding solutions in the sandbox: without one the run stops before it trains (it stopped after
    training before, with a traceback), exit 2, nothing left behind."""
    proc = run_cli(["method=lora", *overrides(tmp_path / "runs")], env={"ATLAS_SANDBOX_MODE": "no-such-mode"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: no sandbox mode works on this machine: mode 'no-such-mode'")
    assert errors[0].endswith("(scripts/install_sandbox.sh installs what the sandbox uses)")
    assert "Traceback" not in proc.stderr and "train" not in proc.stdout.lower()
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.rglob("*") if p.is_file() and ".sweeps" not in p.parts]


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_at_that_step_recorded_failed_in_one_line(overrides, tmp_path):
    args = ["method=lora", "+method.explode_at=3", "method._target_=tests.experiments.exploding_method.NanLossLoRA",
            *overrides(tmp_path / "runs", **{"train.checkpoint_every": "1", "train.keep_checkpoints": "5"})]
    proc = run_cli(args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("failed: loss became nan at step 3 (lr "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rec = record_of(tmp_path / "runs")
    assert rec["status"] == "failed" and rec["phase"] == "train", rec
    assert rec["error"]["type"] == "Diverged" and rec["error"]["message"].startswith("loss became nan at step 3 (lr ")
    run_dir = only_run_dir(tmp_path / "runs")
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == ["step_00000001.pt", "step_00000002.pt"]
    assert not (run_dir / "export").exists()  # nothing after training ran


def tree(root):
    """{path: (mtime_ns, size)} of everything under `root`."""
    return {str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in sorted(root.rglob("*"))}


@pytest.mark.slow
def test_a_launch_writes_only_into_its_own_run_directory(overrides, tmp_path):
    runs = tmp_path / "runs"
    first = run_cli(["method=base", *overrides(runs)])
    assert first.returncode == 0, first.stderr[-3000:]
    seed0 = only_run_dir(runs)
    before = tree(runs)

    # Another run pointed at seed 0's directory, or at any folder: one line, exit 2, nothing written there.
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "draft.tmp").write_text("mine")
    for folder in (seed0, foreign):
        proc = run_cli(["method=base", "seed=1", f"hydra.run.dir={folder}", *overrides(runs)], timeout=120)
        assert proc.returncode == 2, proc.stderr[-3000:]
        [line] = proc.stderr.strip().splitlines()
        held = f"; {seed0} holds the record of run '{seed0.name}'" if folder == seed0 else ""
        expected = (f"error: hydra.run.dir='{folder}' is not allowed: a run writes only into its own directory "
                    f"{runs}/RUN_ID (<run_root>/<run_id>; run_root=... moves it) or one holding its record{held}")
        assert re.fullmatch(re.escape(expected).replace("RUN_ID", f"(?!{seed0.name})[0-9a-f]{{16}}"), line), line
    assert tree(runs) == before and [p.name for p in foreign.iterdir()] == ["draft.tmp"]

    # The complete run launched again is skipped without a write (Hydra's .hydra/ files included).
    again = run_cli(["method=base", *overrides(runs)], timeout=120)
    assert again.returncode == 0 and "skipped (nothing to do)" in again.stdout, again.stderr[-3000:]
    assert tree(runs) == before
