"""The report end to end on synthetic records written to disk, broken ones included; its determinism;
the command line; and that analysis imports nothing from the training packages."""

import ast
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from analysis_synth import record, scenario, write

from analysis.cli import main
from analysis.figures import DPI, WIDTH_IN
from analysis.report import check_report, write_report

REPO = Path(__file__).resolve().parents[2]


def _write_runs(root: Path) -> None:
    for rec in scenario():
        if rec["backbone"] == "micro":
            write(root / "multirun" / "2026-01-01" / "10-00-00", rec)
    failed = record("lora", 7, 0.3, status="failed")
    failed["error"] = {"type": "RuntimeError", "message": "CUDA out of memory | while training", "traceback": "..."}
    write(root, failed)
    interrupted = record("atlas", 8, 0.3, status="interrupted")
    interrupted["interrupted"] = {"step": 50, "reason": "SIGUSR2"}
    write(root, interrupted)
    write(root, None, "truncated", text='{"schema_version": 1, "run_id": "x", "stat')
    wrong = record("ewc", 9, 0.3)
    wrong["metrics"]["retained"]["math"]["kl_token_mean"] = "0.1"
    write(root, wrong)
    (root / "fedcba9876543210" / ".hydra").mkdir(parents=True)


REFERENCE = "lora:train.steps=900"  # scenario(): LoRA at steps 100, 300 and 900


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    _write_runs(root)
    out = root / "report"
    rep = write_report([str(root)], out, levels=["gain:0.5", "gain:0.75", "0.33"], reference=REFERENCE)
    return root, out, rep


@pytest.mark.slow
def test_report_writes_every_table_figure_and_index(report):
    root, out, rep = report
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(out)) for p in rep.files)
    for name in ("main", "paired", "ablations", "backbones", "domains", "answers", "costs"):
        assert f"tables/{name}.md" in files and f"tables/{name}.tex" in files
    for stem in ("pareto_micro_mean", "pareto_micro_math", "pareto_micro_commonsense", "pareto_ablation_micro_mean",
                 "answers_micro", "ablation_micro"):
        assert f"figures/{stem}.png" in files and f"figures/{stem}.pdf" in files
    index = (out / "index.md").read_text()
    for f in files:
        if f != "index.md":
            assert f"]({f})" in index, f
    assert (f"python -m analysis report {root} --out {out} --levels gain:0.5 gain:0.75 0.33 "
            f"--reference {REFERENCE}") in index
    assert "- Complete runs used: 27" in index
    assert "(failed: 1, interrupted: 1, malformed: 2, no record: 1)" in index
    assert "RuntimeError: CUDA out of memory \\| while training" in index
    assert "interrupted at step 50: SIGUSR2" in index
    assert "'metrics.retained.math.kl_token_mean' is string" in index
    assert "unparseable JSON" in index and "fedcba9876543210" in index
    assert "| micro | micro | atlas | 9 | 3 | 0,1,2 |" in index
    assert "| micro | micro | 75% of gain | 0.3100 | 0.1000 | 0.3800 |" in index
    assert "Gain levels are shares of the coding gain of the reference point `lora:train.steps=900`" in index
    assert "## Code versions" in index and "| abc | no | 27 |" in index and "code versions (see" not in index


@pytest.mark.slow
def test_report_lists_code_versions_and_warns_when_runs_mix_them(tmp_path):
    records = [r for r in scenario() if r["backbone"] == "micro"]
    for i, rec in enumerate(records):
        if i % 3 == 0:
            rec["provenance"] |= {"git_sha": "0123456789abcdef", "git_dirty": True}
        write(tmp_path / "runs", rec)
    index = (write_report([str(tmp_path / "runs")], tmp_path / "report", reference=REFERENCE).folder
             / "index.md").read_text()
    older = sum(1 for i in range(len(records)) if i % 3 == 0)
    assert f"| abc | no | {len(records) - older} |" in index
    assert f"| 0123456789ab | yes | {older} |" in index
    assert "the runs come from 2 code versions (see Code versions)" in index


@pytest.mark.slow
def test_a_run_trained_by_another_run_counts_for_the_code_that_trained_it(tmp_path):
    records = [r for r in scenario() if r["backbone"] == "micro"]
    for i, rec in enumerate(records):
        if i % 4 == 0:  # evaluated by abc, trained by another commit
            rec["train"] = {**(rec.get("train") or {}), "reused_from": {"run_id": f"dev{i}", "split": "dev",
                                                                           "git_sha": "fedcba9876543210", "git_dirty": False}}
        elif i % 4 == 1:  # trained by the commit that evaluated it: nothing more to list
            rec["train"] = {**(rec.get("train") or {}), "reused_from": {"run_id": f"dev{i}", "split": "dev",
                                                                           "git_sha": "abc", "git_dirty": False}}
        write(tmp_path / "runs", rec)
    index = (write_report([str(tmp_path / "runs")], tmp_path / "report", reference=REFERENCE).folder
             / "index.md").read_text()
    trained_elsewhere = sum(1 for i in range(len(records)) if i % 4 == 0)
    assert f"| abc | no | {len(records)} |" in index
    assert f"| fedcba987654 | no | {trained_elsewhere} |" in index
    assert "the runs come from 2 code versions (see Code versions)" in index


@pytest.mark.slow
def test_report_warns_when_runs_were_trained_with_different_thread_counts(tmp_path):
    records = [r for r in scenario() if r["backbone"] == "micro"]
    for i, rec in enumerate(records):
        if i % 4 == 0:
            rec["cost"]["threads"] = 1
        elif i % 4 == 1:
            rec["cost"]["threads"] = 2
        write(tmp_path / "runs", rec)  # the rest carry no thread count (older records): not counted
    index = (write_report([str(tmp_path / "runs")], tmp_path / "report", reference=REFERENCE).folder
             / "index.md").read_text()
    ones, twos = sum(1 for i in range(len(records)) if i % 4 == 0), sum(1 for i in range(len(records)) if i % 4 == 1)
    assert f"different intra-op thread counts (1 thread(s): {ones} runs, 2 thread(s): {twos} runs;" in index

    same = tmp_path / "same"
    for rec in records:
        rec["cost"]["threads"] = 2
        write(same, rec)
    index = (write_report([str(same)], tmp_path / "report_same", reference=REFERENCE).folder / "index.md").read_text()
    assert "thread counts" not in index


@pytest.mark.slow
def test_report_warns_when_runs_were_made_on_different_machines(tmp_path):
    records = [r for r in scenario() if r["backbone"] == "micro"]
    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512", "cuda_device": None}
    epyc = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "cuda_device": None}
    for i, rec in enumerate(records):
        if i % 3:  # every third record is from before the field: not counted
            rec["provenance"]["machine"] = xeon if i % 3 == 1 else epyc
        write(tmp_path / "runs", rec)
    index = (write_report([str(tmp_path / "runs")], tmp_path / "report", reference=REFERENCE).folder
             / "index.md").read_text()
    n1, n2 = sum(1 for i in range(len(records)) if i % 3 == 1), sum(1 for i in range(len(records)) if i % 3 == 2)
    assert (f"made on 2 kinds of machine (AMD EPYC / AVX512: {n2} runs, Intel(R) Xeon(R) Processor / AVX512: {n1} "
            "runs; `provenance.machine`)") in index

    same = tmp_path / "same"
    for rec in records:
        rec["provenance"]["machine"] = epyc
        write(same, rec)
    index = (write_report([str(same)], tmp_path / "report_same", reference=REFERENCE).folder / "index.md").read_text()
    assert "kinds of machine" not in index


def test_report_tables_hold_the_known_values(report):
    _, out, _ = report
    main_md = (out / "tables" / "main.md").read_text()
    # pass@1 >= 0.33: the scenario's runs have no post-hoc scales, so nothing lies between steps 300 and 900 (two
    # trainings) and each seed is charged steps 900's KL: 0.050, 0.052, 0.055. Mean 0.0523, t half-width
    # 4.303 * 0.002517 / sqrt(3) = 0.0063 (joining the two runs' points would have read 0.0401).
    assert "**0.0523 ± 0.0063** |" in main_md
    assert "linearly interpolated to the level along each training run's post-hoc scale curve" in main_md
    assert "| EWC | retained prompts | 3 | 0.0413 ± 0.0038 | not reached (0/3 seeds) | not reached (0/3 seeds) |" in main_md
    assert "Levels on micro (gain of LoRA (train.steps=900) over the base model: pass@1 from 0.100 to 0.380)" in main_md
    assert r"\toprule" in (out / "tables" / "main.tex").read_text()
    points = (out / "data" / "pareto_points.csv").read_text().splitlines()
    assert points[0].startswith("domain,backbone,benchmark,method,sweep_key")
    assert len(points) == 1 + 3 * 9   # 9 sweep points (base, atlas x3, lora x3, ewc, atlas_nogate) x 3 domains


def test_report_states_the_widest_pass_gap_it_interpolated_across(report, tmp_path):
    _, out, _ = report
    # the scenario's runs have no post-hoc scales: every value is a measured point's
    assert "Interpolation on micro: no per-seed value lies between two measured points." in (
        out / "tables" / "main.md").read_text()
    assert "Widest pass@1 gap interpolated across on micro: none" in (out / "index.md").read_text()
    # A LoRA and an ATLAS run at scales, seed 0; levels 0.25 and 0.35. LoRA (pass@1 0.10, 0.20, 0.40 at scales 0.25,
    # 0.5, 1) reads both between 0.20 and 0.40; ATLAS (0.15, 0.30, 0.36) reads 0.25 between 0.15 and 0.30 and 0.35
    # between 0.30 and 0.36, the widest gap LoRA's 0.20, at 0.25 (the first of the two).
    curves = {"lora": [(0.25, 0.10, 0.01), (0.5, 0.20, 0.02), (1.0, 0.40, 0.10)],
              "atlas": [(0.25, 0.15, 0.005), (0.5, 0.30, 0.01), (1.0, 0.36, 0.05)]}
    root = tmp_path / "runs"
    for method, curve in curves.items():
        for alpha, p1, kl in curve:
            rec = record(method, 0, p1, {"math": kl, "commonsense": kl}, steps=600, scale=alpha)
            write(root, rec, f"{method}/{alpha}")
    rep = tmp_path / "report"
    write_report([str(root)], rep, levels=["0.25", "0.35"])
    assert ("Widest pass@1 gap interpolated across on micro: 0.200 (LoRA, pass@1 >= 0.25, seed 0), among 4 per-seed "
            "matched values read between two measured points") in (rep / "index.md").read_text()
    main_md = (rep / "tables" / "main.md").read_text()
    assert ("Interpolation on micro: 4 per-seed values lie between two measured points of a run's scale curve, at "
            "most 0.200 pass@1 apart (LoRA, pass@1 >= 0.25, seed 0)") in main_md
    per_seed = pd.read_csv(rep / "data" / "matched_per_seed.csv").set_index(["method", "level_spec"])["bracket_gap"]
    assert per_seed.to_dict() == pytest.approx({("atlas", 0.25): 0.15, ("atlas", 0.35): 0.06, ("lora", 0.25): 0.2,
                                                ("lora", 0.35): 0.2})
    assert "bracket_gap" not in pd.read_csv(rep / "data" / "answers_per_seed.csv").columns
    # without interpolation the report states no gap
    plain = tmp_path / "plain"
    write_report([str(root)], plain, levels=["0.25", "0.35"], interpolate=False)
    assert "Widest pass@1 gap" not in (plain / "index.md").read_text()
    assert "Interpolation on" not in (plain / "tables" / "main.md").read_text()


@pytest.mark.slow
def test_report_files_are_deterministic_and_checkable(report):
    root, out, rep = report
    for png in sorted((out / "figures").glob("*.png")):
        head = png.read_bytes()
        w, h = struct.unpack(">II", head[16:24])
        assert w == round(WIDTH_IN * DPI) and 0.5 * w < h < 1.6 * w, png.name
        assert b"tIME" not in head and b"Software" not in head
    for pdf in sorted((out / "figures").glob("*.pdf")):
        data = pdf.read_bytes()
        box = re.search(rb"/MediaBox \[\s*0 0 ([0-9.]+) ([0-9.]+)", data)
        assert float(box.group(1)) == pytest.approx(WIDTH_IN * 72, abs=0.5), pdf.name
        assert b"CreationDate" not in data and b"ModDate" not in data
    # A re-run gives the same bytes for every file: the only differences are the two planted here.
    (out / "tables" / "main.md").write_text("edited\n")
    (out / "figures" / "stale.png").write_bytes(b"old")
    diffs = check_report([str(root)], out, levels=["gain:0.5", "gain:0.75", "0.33"], reference=REFERENCE)
    assert diffs == [f"only in {out}: figures/stale.png", "differs: tables/main.md"]


def test_report_without_complete_runs_writes_nothing(tmp_path):
    failed = record("lora", 0, 0.3, status="failed")
    failed["error"] = {"type": "ValueError", "message": "bad config"}
    write(tmp_path / "runs", failed)
    write(tmp_path / "runs", None, "broken", text="not json")
    # An earlier report in the folder is left as it was.
    old = tmp_path / "out" / "figures" / "old.png"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier report's figure")
    with pytest.raises(ValueError, match=r"^no complete record in .*: all 2 left out \(failed: 1, malformed: 1;"):
        write_report([str(tmp_path / "runs")], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["figures", "old.png"]


def test_report_in_an_earlier_report_folder_removes_its_stale_files(tmp_path):
    for rec in scenario():
        if rec["backbone"] == "micro" and rec["method"] in ("atlas", "base"):
            write(tmp_path / "runs", rec)
    # A folder that is not a report keeps its files; in a report folder, files of the report's own kinds
    # that a re-run did not write are removed.
    foreign = tmp_path / "out" / "figures" / "mine.png"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"not from a report")
    write_report([str(tmp_path / "runs")], tmp_path / "out", levels=["0.3"])
    assert foreign.exists()
    write_report([str(tmp_path / "runs")], tmp_path / "out", levels=["0.3"])
    assert not foreign.exists()


@pytest.mark.slow
def test_cli_report_and_check(tmp_path, capsys, monkeypatch):
    for seed in range(2):
        write(tmp_path / "runs", record("atlas", seed, 0.3 + seed / 100, {"math": 0.01 + seed / 100}))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "rep"
    args = ["report", "runs", "--out", "rep", "--levels", "0.3", "--no-interpolate"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "records" not in captured.err and "\r" not in captured.err  # no bar off a terminal (stderr captured)
    assert "2 complete runs" in captured.out
    assert "python -m analysis report runs --out rep --levels 0.3 --no-interpolate\n" in (out / "index.md").read_text()
    assert (out / "figures" / "pareto_micro_math.png").is_file()
    (out / "data" / "runs.csv").write_text("edited\n")
    assert main(args + ["--check", "--no-progress"]) == 1
    assert "differs: data/runs.csv" in capsys.readouterr().out
    assert main(["report", "runs", "--levels", "2"]) == 2
    assert "outside [0, 1]" in capsys.readouterr().err
    assert main(["report", "runs", "--levels", "gain:-0.5"]) == 2
    assert "outside [0, inf)" in capsys.readouterr().err
    # gain levels need the reference point: named in one line, before any table is written
    assert main(["report", "runs", "--out", "rep2", "--no-progress"]) == 2
    assert "reference 'lora': no complete lora runs on micro/micro" in capsys.readouterr().err
    assert main(["report", "runs", "--out", "rep2", "--reference", "lora:steps"]) == 2
    assert "'steps' is not KNOB=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_module_entry_point_imports_nothing_from_the_training_packages(tmp_path):
    banned = ("atlas", "baselines", "experiments")
    for path in sorted((REPO / "analysis").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in banned, f"{path.name} imports {name}"
    # At run time too: `python -m analysis` with a bad level exits with status 2 after importing every module.
    write(tmp_path / "runs", record("atlas", 0, 0.3))
    code = ("import json, runpy, sys; import analysis.report, analysis.figures\n"
            "sys.argv = ['analysis', 'report', 'runs', '--levels', 'abc']\n"
            "try:\n    runpy.run_module('analysis', run_name='__main__')\nexcept SystemExit as exc:\n    rc = exc.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r "
            "or m.split('.')[0] in ('torch', 'transformers', 'peft'))))\nsys.exit(rc)" % (banned,))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "level 'abc'" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.strip()) == []
