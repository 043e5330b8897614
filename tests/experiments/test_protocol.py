"""A preset in chunks (`python -m experiments.protocol`): the runs it expands to are the sweep's, records mark them
complete or pending, estimates come from measured records, a chunk fits its budget, `--commit` commits only record
files and refuses a run root git would not take, and a chunk runs end to end on the tiny backbone."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments import exit_codes, protocol, protocol_git
from experiments.config import validate_config
from experiments.job import run_id_for
from experiments.protocol_plan import (COMPLETE, NEW, SCALES_MISSING, Protocol, ProtocolRun, estimates, expand,
                                       plan_text, pools, select_chunk)
from experiments.run_estimates import (EVAL_ONLY, EVALUATION_S, FULL, LORA_STEP_S, STARTUP_S, Estimate, Pool,
                                       default_seconds, estimate, kind_of, measured)
from experiments.validation import ConfigError
from suite_schema import layout
from tests.conftest import REPO, sweep_jobs, tiny_overrides

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def micro_main(tmp_path_factory):
    """micro_main expanded once for the module (composing its 57 jobs is most of this file's time)."""
    root = tmp_path_factory.mktemp("protocol") / "runs"
    return expand("micro_main", [f"run_root={root}"])


def write_record(run_dir: Path, run_id: str, status: str = "complete", config: dict | None = None,
                 seconds: float = 100.0, train: dict | None = None, train_seconds: float | None = None) -> None:
    """A hand-written record: `status`, `config`, a wall time of `seconds` from T0, `train` and cost fields."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "status": status, "config": config or {},
              "provenance": {"start_time": T0.isoformat(), "end_time": (T0 + timedelta(seconds=seconds)).isoformat()},
              "train": train or {"resumed_from": None}, "cost": {"train_seconds": train_seconds}}
    (run_dir / layout.RECORD_NAME).write_text(json.dumps(record))


def write_scales(run: ProtocolRun, scales) -> None:
    for alpha in scales:
        write_record(layout.scale_dir(run.run_dir, alpha), layout.scale_run_id(run.run_id, alpha))


def config_of(method: str, steps: int, backbone: str = "micro", **knobs) -> dict:
    return {"method": {"name": method, **knobs}, "backbone": {"name": backbone}, "train": {"steps": steps}}


def test_expansion_is_the_sweeps_jobs_with_the_run_ids_run_py_gives(micro_main):
    root = micro_main.run_root
    jobs = sweep_jobs(["experiment=micro_main", f"run_root={root}"])  # Hydra's basic sweeper, as `run.py -m` expands
    assert len(micro_main.runs) == len(jobs) == 57
    assert [list(r.overrides) for r in micro_main.runs] == jobs
    assert len({r.run_id for r in micro_main.runs}) == 57
    assert micro_main.runs[0].label == "+point=micro_base seed=0"
    # `python run.py <a job's overrides>` composes the job alone and names its directory by this run id
    picked = [micro_main.runs[i] for i in (0, 28, 40)]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for run in picked:
            assert run.run_id == run_id_for(validate_config(compose("config", overrides=list(run.overrides))))
            assert run.run_dir == root / run.run_id
    base, lora = micro_main.runs[0], micro_main.runs[28]
    assert (base.method, base.trains, base.evaluations) == ("base", False, 1)
    assert (lora.method, lora.trains, lora.evaluations, lora.kind[2:]) == ("lora", True, 5, ("micro", 600))
    assert not any(r.reuses for r in micro_main.runs)  # no reuse_training_from


def test_records_mark_runs_complete_or_pending(micro_main, tmp_path):
    runs = micro_main.runs
    base, trained, failed, other = runs[0], runs[3], runs[4], runs[5]
    assert {r.state() for r in runs} == {NEW}
    write_record(base.run_dir, base.run_id)
    write_record(trained.run_dir, trained.run_id)
    write_scales(trained, trained.scales[:-1])
    write_record(failed.run_dir, failed.run_id, status="failed")
    write_record(other.run_dir, "0" * 16)  # another run's record in its folder
    assert (base.state(), trained.state(), failed.state(), other.state()) == (COMPLETE, SCALES_MISSING, "failed", NEW)
    write_scales(trained, trained.scales[-1:])
    assert trained.state() == SCALES_MISSING  # every fixed scale, but the refinement the preset asks for never ran
    record = json.loads((trained.run_dir / layout.RECORD_NAME).read_text())
    record["scale_refinement"] = {**trained.refinement, "added": [], "stopped": "max_gap", "widest_gap": 0.04}
    (trained.run_dir / layout.RECORD_NAME).write_text(json.dumps(record))
    assert trained.state() == COMPLETE
    states = {r.run_id: r.state() for r in runs}
    assert sum(s == COMPLETE for s in states.values()) == 2
    times = estimates(runs, [])
    text = plan_text(micro_main, states, times, select_chunk([r for r in runs if states[r.run_id] != COMPLETE],
                                                             times, 3600), 3600)
    assert text.splitlines()[0].startswith(f"protocol micro_main (run_root={micro_main.run_root}): 57 run(s), "
                                           "2 complete, 55 pending (1 failed, 54 new); about ")
    for path in sorted(micro_main.run_root.rglob(layout.RECORD_NAME)):
        path.unlink()


def test_a_chunk_fits_its_budget_and_takes_at_least_one_run():
    runs = [ProtocolRun(i, (f"seed={i}",), f"seed={i}", f"{i:016x}", Path(f"r/{i:016x}"), ("lora", (None,) * 3,
                        "micro", 600), True, (), None, False) for i in range(5)]
    times = {r.run_id: Estimate(s, "test") for r, s in zip(runs, (1000, 1500, 900, 100, 100))}
    assert select_chunk(runs, times, 2600) == runs[:2]  # 2500 s; the third would make 3400
    assert select_chunk(runs, times, 2500) == runs[:2]  # exactly the budget still fits
    assert select_chunk(runs, times, 999) == runs[:1]  # longer than the budget: it still runs, alone
    assert select_chunk(runs, times, 10_000) == runs
    assert select_chunk(runs[3:], times, 150) == runs[3:4]
    assert select_chunk([], times, 3600) == []


def test_estimates_come_from_measured_records_then_committed_then_the_default(tmp_path):
    lora, lwf = config_of("lora", 600), config_of("lwf", 600, distill_on="target")
    made = [("a", lora, 200, None, 140), ("b", lora, 220, None, 150), ("c", lora, 400, None, 150),
            ("d", lora, 60, {"reused_from": {"run_id": "x"}}, 150),  # evaluated another run's training
            ("e", lora, 30, {"resumed_from": 400}, 150),  # its times cover its last attempt only
            ("f", config_of("lora", 150), 90, None, 40)]
    for name, config, seconds, train, trained in made:
        write_record(tmp_path / name, name, config=config, seconds=seconds, train=train, train_seconds=trained)
    write_record(tmp_path / "g", "g", status="failed", config=lora, seconds=5)
    assert Pool("empty", []).median(kind_of(lora), FULL) is None
    here = pools(tmp_path)[0]
    assert here.median(kind_of(lora), FULL) == (220.0, 3)  # a, b, c; not the reused, resumed or failed ones
    assert here.median(kind_of(lora), EVAL_ONLY) == (65.0, 4)  # 60, 70, 250 (less the training) and d's 60
    assert here.median(kind_of(config_of("lora", 150)), FULL) == (90.0, 1)
    assert measured({"status": "complete", "config": lora, "provenance": {"start_time": "x"}}) is None

    committed = Pool("committed", [{"run_id": "h", "status": "complete", "config": lwf, "train": {},
                                    "provenance": {"start_time": T0.isoformat(),
                                                   "end_time": (T0 + timedelta(seconds=500)).isoformat()}}])
    got = estimate(kind_of(lora), True, 5, False, [here, committed])
    assert (got.seconds, got.source) == (STARTUP_S + 220, f"measured in {tmp_path}, median of 3")
    got = estimate(kind_of(lora), True, 5, True, [here, committed])
    assert (got.seconds, got.source) == (STARTUP_S + 65, f"measured in {tmp_path}, median of 4 (evaluation only)")
    got = estimate(kind_of(lwf), True, 5, False, [here, committed])
    assert (got.seconds, got.source) == (STARTUP_S + 500, "committed, median of 1")
    # LwF under its earlier definition (no distill_on: retained prompts) is another kind: the default, 2.5x LoRA's step
    old_lwf = config_of("lwf", 600)
    got = estimate(kind_of(old_lwf), True, 5, False, [here, committed])
    assert got.source == "micro default"
    assert got.seconds == pytest.approx(STARTUP_S + 600 * LORA_STEP_S * 2.5 + 5 * EVALUATION_S)
    assert default_seconds("base", 600, False, 1, FULL) == EVALUATION_S
    assert default_seconds("lora", 600, True, 5, EVAL_ONLY) == 5 * EVALUATION_S
    got = estimate(kind_of(config_of("lora", 600, backbone="qwen3-8b")), True, 5, False, [here])
    assert got.source == "micro default (no record of qwen3-8b)"


def test_plan_text_names_counts_time_left_and_the_chunk(tmp_path):
    runs = [ProtocolRun(i, (f"seed={i}",), f"seed={i}", f"{i:016x}", tmp_path / f"{i:016x}",
                        ("lora", (None,) * 3, "micro", 600), True, (), None, False) for i in range(4)]
    times = {r.run_id: Estimate(s, f"src{i}") for i, (r, s) in enumerate(zip(runs, (600, 1200, 3000, 60)))}
    states = {runs[0].run_id: COMPLETE, runs[1].run_id: "failed", runs[2].run_id: NEW, runs[3].run_id: NEW}
    proto = Protocol("micro_main", ("run_root=x",), tmp_path, runs)
    chunk = select_chunk(runs[1:], times, 3600)
    assert chunk == runs[1:2]
    text = plan_text(proto, states, times, chunk, 3600, number=3)
    assert text.splitlines() == [
        f"protocol micro_main (run_root={tmp_path}): 4 run(s), 1 complete, 3 pending (1 failed, 2 new); "
        "about 1 h 11 min left",
        "next chunk, #3 (budget 1 h 00 min): 1 run(s), about 20 min 00 s",
        f"  1. {runs[1].run_id}  seed=1  [failed]  ~20 min 00 s (src1)",
        "after it: 2 run(s), about 51 min 00 s"]
    done = plan_text(proto, {r.run_id: COMPLETE for r in runs}, times, [], 3600)
    assert done.splitlines()[-1] == "nothing left to run: every run has a complete record"


def fake_runs(tmp_path, n):
    return [ProtocolRun(i, (f"seed={i}",), f"seed={i}", f"{i:016x}", tmp_path / f"{i:016x}",
                        ("lora", (None,) * 3, "micro", 600), True, (), None, False) for i in range(n)]


def test_run_chunk_stops_starting_runs_once_the_budget_would_pass(tmp_path):
    runs = fake_runs(tmp_path, 4)
    times = {r.run_id: Estimate(100, "test") for r in runs}
    now = [0.0]

    def start(run, log):  # each run takes 150 s and records itself complete
        now[0] += 150
        write_record(run.run_dir, run.run_id)
        return exit_codes.DONE

    lines = []
    outcomes = protocol.run_chunk(runs, times, 400, tmp_path / "logs", start=start, clock=lambda: now[0],
                                  say=lines.append, cpu=lambda: 2 * now[0])  # two busy threads
    # 150 s spent + 100 s estimate fit 400 s; 300 s + 100 s still do; 450 s + 100 s do not
    assert [o.state for o in outcomes] == [COMPLETE, COMPLETE, COMPLETE]
    assert [o.cpu_seconds for o in outcomes] == [300, 300, 300]
    assert lines[1] == f"[1/4] {runs[0].run_id} complete in 2 min 30 s (estimate 1 min 40 s, CPU 5 min 00 s); " \
                       "chunk 2 min 30 s, about 5 min 00 s to go"
    assert lines[-1].startswith(f"[4/4] not started: 7 min 30 s spent, {runs[3].run_id} would take")

    def interrupted(run, log):
        write_record(run.run_dir, run.run_id, status="interrupted")
        return exit_codes.INTERRUPTED

    fresh = fake_runs(tmp_path / "b", 3)
    outcomes = protocol.run_chunk(fresh, times, 10_000, tmp_path / "logs", start=interrupted, say=lines.append)
    assert [o.state for o in outcomes] == [protocol.INTERRUPTED]  # an interrupted run ends the chunk
    busy = protocol.run_chunk(fake_runs(tmp_path / "c", 1), times, 10, tmp_path / "logs",
                              start=lambda run, log: exit_codes.RUN_BUSY, say=lines.append)
    assert [o.state for o in busy] == [protocol.BUSY]


def test_bad_command_lines_are_refused_before_anything_runs(capsys, tmp_path):
    cases = [(["nope"], "error: experiment='nope' is not allowed: one of the presets in conf/experiment: "),
             (["micro_main", "--hours", "0"], "error: --hours='0' is not allowed: a number of hours > 0"),
             (["micro_main", "--hours", "nan"], "error: --hours='nan' is not allowed"),
             (["micro_main", "hydra.launcher.jobs=2"], "error: hydra.launcher.jobs='2' is not allowed: "),
             (["micro_main", "method=nope"], "error: method=nope is not allowed: one of "),
             (["micro_main", f"run_root={REPO / 'runs'}", "--commit"],
              f"error: run_root='{REPO / 'runs'}' is not allowed: a folder git does not ignore"),
             (["micro_main", f"run_root={tmp_path}", "--commit"],
              f"error: run_root='{tmp_path}' is not allowed: a folder inside the repository")]
    for argv, message in cases:
        assert protocol.main(argv) == exit_codes.BAD_CONFIG, argv
        err = capsys.readouterr().err
        assert err.startswith(message), (argv, err)
    assert not tmp_path.joinpath(protocol.CHUNKS_NAME).exists()  # nothing was written for a refused command


def git(repo, *args):
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_commit_adds_only_record_files_and_refuses_an_ignored_run_root(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "suite@example.org")
    git(repo, "config", "user.name", "suite")
    (repo / ".gitignore").write_text("/runs/\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", ".gitignore", "staged.txt")
    with pytest.raises(ConfigError, match=r"run_root='.*runs' is not allowed: a folder git does not ignore"):
        protocol_git.check_committable(repo / "runs", repo=repo)
    with pytest.raises(ConfigError, match="a folder inside the repository"):
        protocol_git.check_committable(tmp_path / "elsewhere", repo=repo)
    root = repo / "results" / "main"
    top = protocol_git.check_committable(root, repo=repo)  # not made yet: fine
    assert top == repo.resolve()
    run_dir = root / ("a" * 16)
    write_record(run_dir, "a" * 16)
    write_record(layout.scale_dir(run_dir, 0.5), layout.scale_run_id("a" * 16, 0.5))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step_6.pt").write_bytes(b"\0" * 64)
    (run_dir / "run.log").write_text("log\n")
    (root / layout.TEST_READS_NAME).write_text("{}\n")
    (root / protocol.CHUNKS_NAME).write_text("{}\n")
    files = protocol_git.record_files([run_dir, root / ("b" * 16)], root, [root / protocol.CHUNKS_NAME])
    sha = protocol_git.commit(top, files, "protocol micro_main, chunk 1: 1 runs (1 complete); complete, all 1 runs")
    assert sha and git(repo, "log", "-1", "--format=%s").strip().startswith("protocol micro_main, chunk 1")
    committed = sorted(git(repo, "show", "--name-only", "--format=", "HEAD").split())
    assert committed == ["results/main/aaaaaaaaaaaaaaaa/record.json",
                         "results/main/aaaaaaaaaaaaaaaa/scales/0.5/record.json",
                         f"results/main/{protocol.CHUNKS_NAME}", f"results/main/{layout.TEST_READS_NAME}"]
    assert git(repo, "diff", "--cached", "--name-only").split() == [".gitignore", "staged.txt"]  # left staged, not committed
    assert protocol_git.commit(top, files, "again") is None  # nothing changed


def test_a_chunk_runs_end_to_end_and_the_same_command_goes_on(tiny_backbone_dir, tiny_benchmark_dir, tmp_path,
                                                              capsys, monkeypatch):
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("OMP_NUM_THREADS", "1"),
                        ("WANDB_SILENT", "true")):
        monkeypatch.setenv(name, value)
    root = tmp_path / "runs"
    # two base runs (evaluation only) on the tiny backbone; a budget of 3.6 s fits one estimate of 24 s: one a chunk
    argv = ["micro_main", "+point=micro_base", "seed=0,1",
            *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, root, tmp_path / "cache"), "--hours", "0.001"]
    assert protocol.main(argv) == exit_codes.DONE
    out = capsys.readouterr().out
    assert "2 run(s), 0 complete, 2 pending (2 new)" in out
    assert "next chunk, #1 (budget 4 s): 1 run(s), about 24 s" in out
    assert "(micro default)" in out
    first = [line for line in out.splitlines() if line.startswith("[1/1] ") and " complete in " in line]
    assert len(first) == 1, out
    # left: the other run, now estimated from the first one's record
    assert re.search(r"^left: 1 of 2 run\(s\), about \d+ s$", out, re.M), out
    command = next(line for line in out.splitlines() if line.startswith("next chunk: "))
    assert command.startswith("next chunk: python -m experiments.protocol micro_main +point=micro_base seed=0,1 ")
    assert command.endswith(" --hours 0.001")
    done = [p.parent.name for p in root.glob(f"*/{layout.RECORD_NAME}")]
    assert len(done) == 1 and first[0].split()[1] == done[0]

    assert protocol.main(argv) == exit_codes.DONE  # the next chunk: the other run, estimated from the first
    out = capsys.readouterr().out
    assert "2 run(s), 1 complete, 1 pending (1 new)" in out
    assert f"(measured in {root}, median of 1)" in out
    assert "the protocol is complete: all 2 runs have a complete record" in out
    chunks = [json.loads(line) for line in (root / protocol.CHUNKS_NAME).read_text().splitlines()]
    assert [c["chunk"] for c in chunks] == [1, 2] and [c["left_runs"] for c in chunks] == [1, 0]
    assert all(run["state"] == COMPLETE for c in chunks for run in c["runs"])
    # the run's CPU time, its subprocesses' included, is measured: a real run spends some
    assert all(run["cpu_s"] > 0 for c in chunks for run in c["runs"])
    assert all(abs(c["cpu_s"] - sum(run["cpu_s"] for run in c["runs"])) <= 0.1 * len(c["runs"]) for c in chunks)
    logs = sorted((root / protocol.LOG_DIR).rglob("*.log"))
    assert len(logs) == 2
    assert protocol.main(["plan", *argv]) == exit_codes.DONE
    assert "nothing left to run" in capsys.readouterr().out


def test_refined_scales_count_in_completeness_and_estimates(micro_main, tmp_path):
    from experiments.run_estimates import EVALUATION_S, STARTUP_S, Pool, estimate

    lora = micro_main.runs[28]
    assert (lora.refinement["max_gap"], lora.refinement["max_evals"]) == (0.05, 12)  # the fronts presets refine
    assert micro_main.runs[0].refinement is None  # the base trains nothing: no scales to refine
    kind = lora.kind
    plain = Pool("p", [])
    plain.times[kind]["full"].append(100.0)
    assert estimate(kind, True, 5, False, [plain]).seconds == STARTUP_S + 100.0
    with_refinement = estimate(kind, True, 5, False, [plain], 12)
    assert with_refinement.seconds == STARTUP_S + 100.0 + 12 * EVALUATION_S
    assert "up to 12 refined scales" in with_refinement.source
    plain.refined[kind] = True  # measured runs that refined already include it
    assert estimate(kind, True, 5, False, [plain], 12).seconds == STARTUP_S + 100.0
