"""`eval.refine_scales`: after the fixed post-hoc scales, bisect the widest pass@1 gaps (experiments.scale_refinement);
each refined scale is a record of its own, marked `scale_refined`; the run's own record lists them, and completeness
checks that list."""

import json

import pytest
from hydra import compose, initialize_config_dir

from experiments import records
from experiments import scale_refinement as R
from experiments.config import validate_config
from experiments.evaluation.config import EvalConfig, ScaleRefinement
from experiments.job import run_id_for
from experiments.methods import required_refinement
from experiments.validation import ConfigError
from suite_schema import layout
from tests.conftest import REPO


def linear(lo=0.0, hi=1.0):
    """pass@1 rising linearly with alpha from `lo` at 0 to `hi` at 1, rounded to a 132-problem count."""
    return lambda a: round((lo + (hi - lo) * a) * 132) / 132


def test_next_scale_halves_the_widest_gap_above_max_gap():
    # gaps: [0.25, 0.5] 0.1, [0.5, 0.75] 0.4, [0.75, 1] 0.02
    assert R.next_scale({0.25: 0.1, 0.5: 0.2, 0.75: 0.6, 1.0: 0.62}, 0.05) == 0.625
    # a pass@1 that falls counts by its size too
    assert R.next_scale({0.25: 0.1, 0.5: 0.7, 1.0: 0.62}, 0.05) == 0.375
    # no gap above max_gap (0.05 itself meets it): nothing to add
    assert R.next_scale({0.5: 0.20, 0.75: 0.25, 1.0: 0.30}, 0.05) is None
    # equal gaps: the lower pair first
    assert R.next_scale({0.25: 0.1, 0.5: 0.3, 0.75: 0.5}, 0.05) == 0.375
    # a pair too close to halve (each half under 1/64) is passed over for a narrower gap that can be halved
    assert R.next_scale({0.5: 0.1, 0.52: 0.5, 1.0: 0.6}, 0.05) == 0.76
    assert R.next_scale({0.5: 0.1, 0.52: 0.5}, 0.05) is None
    # an unknown pass@1 (no target metrics) joins no pair
    assert R.next_scale({0.5: 0.1, 0.75: None, 1.0: 0.9}, 0.05) is None
    assert R.gaps({0.5: 0.1, 0.75: float("nan"), 1.0: 0.9}) == []


def test_halvable_tolerates_the_rounding_of_refined_scales():
    # 0.5 to 0.53125 rounds to 0.5 to 0.5312: still 2/64 wide up to the rounding, so halved once more
    assert R.halvable(0.5, 0.5312) and R.halvable(0.5, 0.53125)
    assert not R.halvable(0.5, 0.5156) and not R.halvable(0.9, 0.925)


def test_refine_stops_when_every_gap_meets_max_gap():
    f = linear()
    out = R.refine({a: f(a) for a in (0.25, 0.5, 0.75, 1.0)}, f, 0.05, 50)
    # each quarter (a 0.25 gap) is halved twice (0.0625 > 0.05) then once more: 7 points each -> 21, widest first
    assert out.stopped == R.STOP_GAP and len(out.added) == 21
    points = {a: f(a) for a in (0.25, 0.5, 0.75, 1.0, *out.added)}
    assert max(g for _, _, g in R.gaps(points)) <= 0.05 and out.widest_gap == R.widest_gap(points) <= 0.05
    assert out.added[:3] == [0.375, 0.625, 0.875]  # equal gaps: lowest pair first
    # every refined scale is rounded to 4 decimals (its record folder), new and between two measured scales
    assert all(round(a, R.DECIMALS) == a for a in out.added) and len(set(out.added)) == len(out.added)


def test_refine_stops_at_the_budget_and_the_same_points_give_the_same_scales():
    f = linear()
    start = {a: f(a) for a in (0.25, 0.5, 0.75, 1.0)}
    calls = []

    def measure(a):
        calls.append(a)
        return f(a)

    out = R.refine(start, measure, 0.05, 5)
    assert out.stopped == R.STOP_EVALS and out.added == calls and len(calls) == 5
    assert start == {a: f(a) for a in (0.25, 0.5, 0.75, 1.0)}  # not changed
    assert R.refine(start, f, 0.05, 5) == out
    # a larger budget goes on from the same scales: a smaller budget's scales are its first ones
    assert R.refine(start, f, 0.05, 9).added[:5] == out.added


def test_refine_stops_at_the_minimum_width_below_a_jump():
    def step(a):  # pass@1 jumps from 0.1 to 0.6 at alpha 0.6: no interval around it gets below max_gap
        return 0.1 if a < 0.6 else 0.6

    out = R.refine({0.5: 0.1, 0.75: 0.6, 1.0: 0.6}, step, 0.05, 50)
    assert out.stopped == R.STOP_WIDTH and out.widest_gap == pytest.approx(0.5)
    # bisection closes in on the jump down to intervals of 1/64: 0.625, 0.5625, 0.59375 -> 0.5938, 0.6094 (0.6093750)
    assert out.added == [0.625, 0.5625, 0.5938, 0.6094]
    lo, hi = max(a for a in out.added + [0.5] if a < 0.6), min(a for a in out.added + [0.75] if a >= 0.6)
    assert (lo, hi) == (0.5938, 0.6094) and not R.halvable(lo, hi)


def test_eval_config_validates_the_refinement_with_clear_errors():
    off = EvalConfig.from_group().validate()
    assert off.refine_scales is None and off.refinement() is None
    on = EvalConfig.from_group(refine_scales={"max_gap": 0.05, "max_evals": 6}).validate()
    assert on.refinement() == ScaleRefinement(0.05, 6)
    assert EvalConfig.from_group(refine_scales={"max_gap": 0.05, "max_evals": 0}).validate().refinement() is None
    for value, message in [
        ({"max_gap": 0, "max_evals": 6}, "eval.refine_scales.max_gap=0 is not allowed: a number in (0, 1] (a pass@1 gap)"),
        ({"max_gap": 1.5, "max_evals": 6}, "eval.refine_scales.max_gap=1.5 is not allowed: a number in (0, 1]"),
        ({"max_gap": 0.05, "max_evals": -1}, "eval.refine_scales.max_evals=-1 is not allowed: an integer >= 0 (0 = no "
                                             "refinement)"),
        ({"max_gap": 0.05, "max_evals": 2.5}, "eval.refine_scales.max_evals=2.5 is not allowed: an integer >= 0"),
        ({"max_gap": 0.05, "max_evals": 6, "min_gap": 1}, "eval.refine_scales.min_gap=1 is not allowed: a key of "
                                                          "eval.refine_scales, one of ['max_evals', 'max_gap']"),
        (0.05, "eval.refine_scales=0.05 is not allowed: null or a mapping with max_gap and max_evals"),
    ]:
        with pytest.raises(ConfigError) as info:
            EvalConfig.from_group(refine_scales=value).validate()
        assert str(info.value).startswith(message)


def composed(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_composed_refinement_is_checked_before_a_run_and_is_not_part_of_the_run_id(tmp_path):
    with pytest.raises(ConfigError, match=r"^eval.refine_scales.max_evals='x' is not allowed: Value 'x' of type 'str' "
                                          r"could not be converted to Integer"):
        validate_config(composed("eval.refine_scales={max_gap:0.05,max_evals:x}"))
    with pytest.raises(ConfigError, match=r"^eval.refine_scales.max_gap=0.0 is not allowed: a number in \(0, 1\]"):
        validate_config(composed("eval.refine_scales={max_gap:0,max_evals:4}"))
    plain = composed("eval.scales=[0.5,1]")
    refined = composed("eval.scales=[0.5,1]", "eval.refine_scales={max_gap:0.05,max_evals:4}")
    assert run_id_for(plain) == run_id_for(refined)
    assert required_refinement(validate_config(plain)) is None
    assert required_refinement(validate_config(refined)) == {"max_gap": 0.05, "max_evals": 4, "min_width": 1 / 64}
    # nothing to refine: the base trains nothing, scale 1 alone has no neighbour, a budget of 0 is off
    for extra in ("method=base", "eval.scales=[1]", "eval.refine_scales.max_evals=0"):
        cfg = validate_config(composed("eval.scales=[0.5,1]", "eval.refine_scales={max_gap:0.05,max_evals:4}", extra))
        assert required_refinement(cfg) is None, extra


def test_the_dense_fronts_presets_refine_alike():
    """Every preset selecting conf/eval/scales/fronts.yaml refines with the same settings, so a run they share is
    complete for all of them."""
    presets = [p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")
               if "/eval/scales: fronts" in p.read_text()]
    assert len(presets) >= 6
    settings = {json.dumps(required_refinement(validate_config(composed(f"experiment={p}"))), sort_keys=True)
                for p in presets}
    assert settings == {json.dumps({"max_evals": 12, "max_gap": 0.05, "min_width": 1 / 64}, sort_keys=True)}


def _write(path, run_id, **extra):
    records.atomic_write_json(path / layout.RECORD_NAME, {"run_id": run_id, "status": "complete", **extra})


def test_completeness_checks_the_scales_the_run_s_record_says_refinement_added(tmp_path):
    run_id, settings = "r1", R.settings(0.05, 4)
    for alpha in (0.5, 0.625):
        _write(layout.scale_dir(tmp_path, alpha), layout.scale_run_id(run_id, alpha))

    def ran(stopped, **changed):
        _write(tmp_path, run_id, scale_refinement={**settings, **changed, "added": [0.625], "stopped": stopped,
                                                   "widest_gap": 0.04})

    ran(R.STOP_GAP)
    assert records.is_complete(tmp_path, run_id, [0.5], settings)
    assert records.is_complete(tmp_path, run_id, [0.5])  # without refinement asked for, the extra record is extra
    # It stopped with every gap <= 0.05 after one scale: any budget, and any looser max_gap, gives that scale or none.
    assert records.is_complete(tmp_path, run_id, [0.5], R.settings(0.05, 12))
    assert records.is_complete(tmp_path, run_id, [0.5], R.settings(0.1, 1))
    assert not records.is_complete(tmp_path, run_id, [0.5], R.settings(0.03, 4))  # stricter: may halve more
    assert not records.is_complete(tmp_path, run_id, [0.5], {**settings, "min_width": 1 / 128})
    ran(R.STOP_EVALS, max_evals=1)  # its budget spent: a larger one may go on, a smaller one is a first part
    assert not records.is_complete(tmp_path, run_id, [0.5], R.settings(0.05, 2))
    assert records.is_complete(tmp_path, run_id, [0.5], R.settings(0.05, 1))
    ran(R.STOP_GAP)
    (layout.scale_dir(tmp_path, 0.625) / layout.RECORD_NAME).unlink()  # a refined scale's record is gone
    assert not records.is_complete(tmp_path, run_id, [0.5], settings)
    _write(tmp_path, run_id)  # a run's record made without refinement
    assert records.is_complete(tmp_path, run_id, [0.5]) and not records.is_complete(tmp_path, run_id, [0.5], settings)
    for odd in ({**settings, "added": ["0.625"], "stopped": R.STOP_GAP}, {**settings, "added": []},
                {**settings, "max_gap": "0.05", "added": [], "stopped": R.STOP_GAP}):  # not records the suite writes
        _write(tmp_path, run_id, scale_refinement=odd)
        assert not records.is_complete(tmp_path, run_id, [0.5], settings), odd


# -- the job, in process, on the tiny backbone: training and the method's scaling are real; the evaluation is replaced
# -- by a pass@1 that depends only on the scale the method was last set to, so the refinement has gaps to close.
def _curve(alpha):
    return min(1.0, max(0.0, 2 * (alpha - 0.3)))  # 0 up to alpha 0.3, then rising to 1 at alpha 0.8


@pytest.fixture
def job_run(tiny_backbone_dir, tiny_benchmark_dir, tmp_path, monkeypatch):
    """`(run, calls)`: `run(*overrides)` runs one lora job in process on the tiny backbone and returns its record;
    `calls` lists the scale of every evaluation."""
    from baselines.lora import LoRA
    from experiments import job
    from tests.conftest import compose_tiny

    current, calls = [1.0], []
    scale = LoRA.scale

    def scaled(self, model, alpha):
        current[0] = float(alpha)
        return scale(self, model, alpha)

    def evaluate_run(*args, **kwargs):
        calls.append(current[0])
        p = _curve(current[0])
        return {"target": {"pass@1": p, "n_problems": 4}, "retained": {}, "retained_kl_mean": p / 10,
                "code_samples": [], "timing": {}}

    monkeypatch.setattr(LoRA, "scale", scaled)
    monkeypatch.setattr(job, "evaluate_run", evaluate_run)

    def run(*overrides):
        current[0] = 1.0
        cfg = compose_tiny(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", tmp_path / "cache", *overrides)
        return job.run(cfg), cfg

    return run, calls


@pytest.mark.slow
def test_the_job_evaluates_refined_scales_marks_their_records_and_a_rerun_finds_the_run_complete(job_run, tmp_path):
    from experiments.methods import required_scales

    run, calls = job_run
    fixed = ["eval.scales=[0,0.5,1]"]
    record, cfg = run(*fixed, "eval.refine_scales={max_gap:0.05,max_evals:3}")
    run_id, run_dir = record["run_id"], tmp_path / "runs" / record["run_id"]
    # measured: 0 -> 0, 0.5 -> 0.4, 1 -> 1; the widest gap is [0.5, 1] (0.6): 0.75 (0.9), then [0.5, 0.75] (0.5):
    # 0.625 (0.65), then [0, 0.5] (0.4): 0.25 (0); the budget of 3 is spent with [0.25, 0.5] 0.4 apart
    done = record["scale_refinement"]
    assert done == {"max_gap": 0.05, "max_evals": 3, "min_width": 1 / 64, "added": [0.75, 0.625, 0.25],
                    "stopped": R.STOP_EVALS, "widest_gap": pytest.approx(0.4)}
    assert calls == [0.0, 0.5, 1.0, 0.75, 0.625, 0.25]  # fixed scales, the run's own, then the refined ones
    for alpha in done["added"]:
        scaled = json.loads((layout.scale_dir(run_dir, alpha) / layout.RECORD_NAME).read_text())
        assert scaled["scale_refined"] is True and scaled["scale"] == alpha and scaled["train_run_id"] == run_id
        assert scaled["run_id"] == layout.scale_run_id(run_id, alpha) and scaled["status"] == "complete"
        assert scaled["metrics"]["target"]["pass@1"] == _curve(alpha)
    fixed_record = json.loads((layout.scale_dir(run_dir, 0.5) / layout.RECORD_NAME).read_text())
    assert "scale_refined" not in fixed_record
    assert json.loads((run_dir / layout.RECORD_NAME).read_text()) == record
    assert records.is_complete(run_dir, run_id, required_scales(cfg), required_refinement(cfg))

    # The same command again: complete, nothing evaluated.
    calls.clear()
    again, _ = run(*fixed, "eval.refine_scales={max_gap:0.05,max_evals:3}")
    assert calls == [] and again == record
    # A smaller budget or a looser max_gap asks for the first of these scales: complete.
    for looser in ("{max_gap:0.05,max_evals:2}", "{max_gap:0.3,max_evals:3}"):
        assert run(*fixed, f"eval.refine_scales={looser}")[0] == record and calls == []
    # A larger budget: the run's own record is evaluated again, the first 3 refined scales are read back, 2 more added.
    more, cfg5 = run(*fixed, "eval.refine_scales={max_gap:0.05,max_evals:5}")
    # (0.375: [0.25, 0.5], 0.4 apart; then 0.4375: [0.375, 0.5], 0.25 apart as [0.5, 0.625] and [0.625, 0.75]: the
    # lowest of equal gaps)
    assert calls == [1.0, 0.375, 0.4375]
    assert more["run_id"] == run_id and more["scale_refinement"]["added"] == [0.75, 0.625, 0.25, 0.375, 0.4375]
    assert more["scale_refinement"]["widest_gap"] == pytest.approx(0.25)
    assert records.is_complete(run_dir, run_id, required_scales(cfg5), required_refinement(cfg5))
    assert not records.is_complete(run_dir, run_id, required_scales(cfg5), R.settings(0.05, 6))
