"""`benchmark.split=dev|test`: which items a run evaluates on, held-out slices of real training sets,
and calibration that never shares a question with dev or test."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from experiments.config import validate_config
from experiments.data.benchmark import build_benchmark, in_holdout, item_text
from experiments.data.dedup import normalise_text
from experiments.validation import ConfigError
from tests.conftest import REPO, tiny_math, write_jsonl

CONF = str(REPO / "conf")


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return validate_config(compose("config", overrides=list(overrides)))


def _texts(items) -> set[str]:
    return {normalise_text(item_text(it)) for it in items}


@pytest.mark.parametrize("world, test_split, far", [("micro_v3", "v3test", True), ("micro", "test", False)])
def test_micro_dev_and_test_runs_read_their_own_split_and_the_same_calibration(world, test_split, far):
    dev = build_benchmark(composed(f"benchmark={world}", "benchmark.split=dev").benchmark)
    test = build_benchmark(composed(f"benchmark={world}").benchmark)
    assert (dev.split, test.split) == ("dev", "test")
    assert {p["task_id"].split("/")[1] for p in dev.target_eval} == {"dev"}
    assert {p["task_id"].split("/")[1] for p in test.target_eval} == {test_split}
    assert len(dev.target_eval) == len(test.target_eval) == 132
    for name in ("math", "commonsense"):
        d, t = dev.retained[name], test.retained[name]
        assert d.calibration == t.calibration and len(d.calibration) == 250
        assert len(d.evaluation) == len(t.evaluation) >= 162
        assert bool(d.far) == bool(t.far) == far
        evaluated = [d.evaluation, t.evaluation, d.far, t.far]
        for i, a in enumerate(evaluated):
            for b in evaluated[i + 1:]:
                assert not _texts(a) & _texts(b)
        assert not _texts(d.calibration) & set().union(*map(_texts, evaluated))
        assert d.dropped_calibration == t.dropped_calibration == 0


def test_the_default_micro_world_is_v3():
    assert composed().benchmark.name == "micro_v3" and composed("benchmark=micro").benchmark.far is None


def test_far_items_of_an_unknown_domain_are_rejected_before_any_compute():
    with pytest.raises(ConfigError, match=r"benchmark\.far\.poetry"):
        composed("+benchmark.far.poetry={evaluation: {split: test_far}}")


def test_dev_and_test_runs_have_different_run_ids():
    from experiments.job import run_id_for

    assert run_id_for(composed("benchmark.split=dev")) != run_id_for(composed())


@pytest.mark.parametrize("override, key", [
    ("benchmark.split=val", "benchmark.split"),
    ("+benchmark.retained.math.dev.holdout=half", "benchmark.retained.math.dev.holdout"),
    ("+benchmark.target.dev.micro_code.id_range=[5,1]", "benchmark.target.dev.micro_code.id_range"),
])
def test_bad_split_settings_are_rejected_before_any_compute(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        composed(override)


def test_dev_split_needs_dev_specs():
    with pytest.raises(ConfigError, match=r"benchmark\.retained\.math\.dev"):
        composed("benchmark.split=dev", "~benchmark.retained.math.dev")
    with pytest.raises(ConfigError, match=r"benchmark\.target\.dev"):
        composed("benchmark.split=dev", "~benchmark.target.dev")


def test_calibration_items_that_are_in_dev_or_test_are_dropped(tmp_path, tiny_benchmark_dir):
    bench = tmp_path / "bench"
    bench.mkdir()
    for sub in ("code", "commonsense"):
        (bench / sub).symlink_to(tiny_benchmark_dir / sub)
    dev, test, far = tiny_math(5, 30), tiny_math(5, 50), tiny_math(4, 90)
    write_jsonl(bench / "math" / "calibration.jsonl", tiny_math(6, 0) + [test[0], dev[1], far[2]])
    write_jsonl(bench / "math" / "dev.jsonl", dev)
    write_jsonl(bench / "math" / "test.jsonl", test)
    write_jsonl(bench / "math" / "dev_far.jsonl", tiny_math(4, 70))
    write_jsonl(bench / "math" / "test_far.jsonl", far)
    cfg = composed(f"benchmark.retained.math.local={bench / 'math'}",
                   f"benchmark.retained.commonsense.local={bench / 'commonsense'}",
                   f"benchmark.target.train.local={bench / 'code'}",
                   f"benchmark.target.evaluation.micro_code.local={bench / 'code'}")
    math = build_benchmark(cfg.benchmark).retained["math"]
    assert math.dropped_calibration == 3  # a far item counts as evaluated too
    assert len(math.calibration) == 6
    assert not _texts(math.calibration) & (_texts(dev) | _texts(test) | _texts(far))


def test_holdout_rule_is_a_fixed_tenth_by_text():
    items = [{"question": f"What is {i} plus {i}?"} for i in range(2000)]
    held = [it for it in items if in_holdout(it)]
    assert 150 <= len(held) <= 250
    # the rule reads the text only: order and case/punctuation do not move an item
    assert in_holdout(held[0]) and in_holdout({"question": held[0]["question"].upper().replace("?", " ?")})


@pytest.mark.slow
def test_paper_benchmark_dev_and_test_on_the_real_data(shared_data):
    dev = build_benchmark(composed("backbone=qwen3-8b", f"benchmark.data_root={shared_data}",
                                   "benchmark.split=dev").benchmark)
    test = build_benchmark(composed("backbone=qwen3-8b", f"benchmark.data_root={shared_data}").benchmark)
    mbpp_ids = lambda b: sorted(int(p["task_id"].split("/")[1]) for p in b.target_eval if p["suite"] == "mbpp")  # noqa: E731
    assert len(mbpp_ids(dev)) == 43 and all(511 <= i <= 600 for i in mbpp_ids(dev))
    assert len(mbpp_ids(test)) == 257 and all(11 <= i <= 510 for i in mbpp_ids(test))
    assert sum(p["suite"] == "humaneval" for p in test.target_eval) == 164
    assert not any(p["suite"] == "humaneval" for p in dev.target_eval)
    for name in ("math", "commonsense"):
        d, t = dev.retained[name], test.retained[name]
        assert len(d.evaluation) == len(t.evaluation) == 500
        assert all(in_holdout(it) for it in d.evaluation)
        assert not any(in_holdout(it) for it in d.calibration)
        assert d.calibration == t.calibration and len(d.calibration) == 1000
        assert not _texts(d.calibration) & (_texts(d.evaluation) | _texts(t.evaluation))
        assert not _texts(d.evaluation) & _texts(t.evaluation)
    print(json.dumps({n: dev.retained[n].dropped_calibration for n in dev.retained}))
