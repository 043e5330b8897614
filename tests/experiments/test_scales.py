"""`eval.scales`: one training run evaluated at several post-hoc scales toward the base (WiSE-FT),
one record per scale; scale 0 is the base model; adding scales later evaluates only the new ones."""

import json

import pytest

from suite_schema.layout import CODE_SAMPLES_NAME, RECORD_NAME, RETAINED_SAMPLES_NAME
from suite_schema.retained_samples import read_retained_samples
from tests.conftest import run_cli, tiny_overrides


@pytest.fixture
def args(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    def make(*extra):
        return ["method=lora", *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs",
                                               tmp_path / "cache"), *extra]
    return make


def _records(root):
    return {r["run_id"]: r for r in (json.loads(p.read_text()) for p in sorted(root.rglob(RECORD_NAME)))}


def check_retained_samples(record_dir, record):
    """`retained_samples.json` next to a record: one entry per near and far item of each domain, holding the item's
    question and gold, as many marked changed as the record's rates count; the record does not hold them."""
    from omegaconf import OmegaConf

    from experiments.config import BenchmarkConfig
    from experiments.data.benchmark import build_benchmark
    from experiments.evaluation.answers import extract_math_answer

    assert (record_dir / CODE_SAMPLES_NAME).is_file() and (record_dir / RETAINED_SAMPLES_NAME).is_file()
    assert "retained_samples" not in record["metrics"]
    samples = read_retained_samples(record_dir)
    bench_cfg = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), record["config"]["benchmark"])
    bench_cfg.data_root = None  # not in a record; the tiny benchmark's paths are absolute
    bench = build_benchmark(bench_cfg)
    seen = []
    for set_name, key, split in (("near", "retained_near", "evaluation"), ("far", "retained_far", "far")):
        for name, entry in record["metrics"][key].items():
            dom = bench.retained[name]
            mine = [e for e in samples if (e["set"], e["domain"]) == (set_name, name)]
            items = getattr(dom, split)
            assert len(mine) == entry["n"] == len(items) > 0
            assert [e["prompt"] for e in mine] == [item["question"] for item in items]
            if dom.kind == "math":
                assert [e["gold"] for e in mine] == [extract_math_answer(item["answer"]) for item in items]
                rate = entry["answer_change_rate"]
            else:
                assert [e["gold"] for e in mine] == [item["answer_index"] for item in items]
                rate = entry["choice_flip_rate"]
            assert sum(e["changed"] for e in mine) == round(rate["rate"] * rate["n"])
            seen += mine
    assert seen == samples  # near before far, nothing else
    return samples


@pytest.mark.slow
def test_scales_write_one_record_each_and_scale_zero_is_the_base(args, tmp_path):
    first = run_cli(args("eval.scales=[0,0.5,1]"))
    assert first.returncode == 0, first.stderr[-3000:]
    recs = _records(tmp_path / "runs")
    main = next(r for r in recs.values() if "@" not in r["run_id"])
    run_id = main["run_id"]
    assert set(recs) == {run_id, f"{run_id}@0", f"{run_id}@0.5"}
    assert main["scale"] == 1.0
    at0, at05 = recs[f"{run_id}@0"], recs[f"{run_id}@0.5"]
    assert (at0["scale"], at05["scale"]) == (0.0, 0.5) and at0["train_run_id"] == run_id
    assert all(r["status"] == "complete" and r["method"] == "lora" for r in recs.values())
    # Same training, same costs of training; only the evaluation differs.
    assert at0["train"] == main["train"] and at0["cost"]["train_seconds"] == main["cost"]["train_seconds"]
    # Scale 0 is exactly the base: no retained drift, no rewritten answers.
    for domain, m in at0["metrics"]["retained_near"].items():
        assert abs(m["kl_token_mean"]) < 1e-6, (domain, m)
    assert at0["metrics"]["retained_kl_mean"] < 1e-6 < at05["metrics"]["retained_kl_mean"]
    assert main["metrics"]["retained_kl_mean"] > 1e-6
    assert (tmp_path / "runs" / run_id / "scales" / "0" / RECORD_NAME).exists()
    run_dir = tmp_path / "runs" / run_id
    stored = {alpha: check_retained_samples(run_dir / sub, recs[rid]) for alpha, sub, rid in (
        (1.0, ".", run_id), (0.0, "scales/0", f"{run_id}@0"), (0.5, "scales/0.5", f"{run_id}@0.5"))}
    # Scale 0 is the base: its greedy texts are the base's own.
    assert all(e["adapted_text"] == e["base_text"] for e in stored[0.0] if e["kind"] == "math")

    # More scales later: only the new one is evaluated, training resumes at its last step (no steps).
    second = run_cli(args("eval.scales=[0,0.25,0.5,1]"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "scale 0 already evaluated" in second.stdout and "scale 0.5 already evaluated" in second.stdout
    assert "evaluating at post-hoc scale 0.25" in second.stdout
    assert "resumed from checkpoint" in second.stdout
    recs2 = _records(tmp_path / "runs")
    assert set(recs2) == {run_id, f"{run_id}@0", f"{run_id}@0.25", f"{run_id}@0.5"}
    assert recs2[f"{run_id}@0"] == at0  # untouched
    assert read_retained_samples(run_dir / "scales" / "0") == stored[0.0]
    check_retained_samples(run_dir / "scales" / "0.25", recs2[f"{run_id}@0.25"])
    assert recs2[run_id]["train"]["losses"] == main["train"]["losses"]

    third = run_cli(args("eval.scales=[0.25,1]"))
    assert third.returncode == 0 and "skipped (nothing to do)" in third.stdout
    # The test-read ledger: one line per evaluation, naming the scales it read (the skipped launch read nothing).
    reads = [json.loads(s) for s in (tmp_path / "runs" / "test_reads.jsonl").read_text().splitlines()]
    assert [(r["run_id"], r["scales"]) for r in reads] == [(run_id, [0.0, 0.5, 1.0]), (run_id, [0.25, 1.0])]

    # The analysis reads them as one training run at four scales.
    from analysis.collect import collect

    table = collect([str(tmp_path / "runs")]).table
    assert sorted(table["scale"]) == [0.0, 0.25, 0.5, 1.0]
    assert table["train_key"].nunique() == 1 and table["sweep_key"].nunique() == 4


@pytest.mark.slow
def test_base_method_ignores_scales(args, tmp_path):
    proc = run_cli([*args("eval.scales=[0,0.5,1]"), "method=base"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = _records(tmp_path / "runs")
    assert len(recs) == 1 and "scale" not in next(iter(recs.values()))


@pytest.mark.slow
@pytest.mark.parametrize("value", ["[]", "[0.5,0.5]", "[-1]"])
def test_bad_scales_are_rejected_before_compute(args, value):
    proc = run_cli(args(f"eval.scales={value}"))
    assert proc.returncode == 2
    assert "error: eval.scales=" in proc.stderr and "is not allowed: a non-empty list of distinct numbers in [0, 10]" in proc.stderr
