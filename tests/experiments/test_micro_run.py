"""End to end on the shipped micro backbone and benchmark (slow: a cold reference cache and real evaluation), on the
dev split: tests never read the test split of the current micro world."""

import json

import pytest

from tests.conftest import MICRO_BACKBONE, run_cli

pytestmark = pytest.mark.slow


def record(run_root):
    (path,) = list(run_root.glob("*/record.json"))
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def micro_runs(tmp_path_factory):
    if not (MICRO_BACKBONE / "model.safetensors").exists():
        pytest.skip("the micro backbone is not in assets/micro/backbone")
    root = tmp_path_factory.mktemp("micro")
    common = [f"eval.cache_dir={root / 'cache'}", "train.progress=false", "benchmark.split=dev"]
    base = run_cli(["method=base", f"run_root={root / 'base'}", *common], timeout=1200)
    assert base.returncode == 0, base.stderr[-3000:]
    lora = run_cli(["method=lora", "train.steps=40", f"run_root={root / 'lora'}", *common], timeout=1200)
    assert lora.returncode == 0, lora.stderr[-3000:]
    return record(root / "base"), record(root / "lora")


def test_base_against_itself_is_zero_and_meets_the_floors(micro_runs):
    base, _ = micro_runs
    m = base["metrics"]
    for domain, d in m["retained_near"].items():
        assert abs(d["kl_token_mean"]) < 1e-6 and abs(d["kl_seq_mean"]) < 1e-6, domain
    assert m["retained_near"]["math"]["answer_change_rate"] == {"rate": 0.0, "n": 250}
    assert m["retained_near"]["commonsense"]["choice_flip_rate"] == {"rate": 0.0, "n": 162}
    assert m["retained_far"]["math"]["answer_change_rate"] == {"rate": 0.0, "n": 250}
    assert m["retained_far"]["commonsense"]["choice_flip_rate"] == {"rate": 0.0, "n": 129}
    assert base["split"] == "dev" and base["benchmark"] == "micro_v3@dev"
    # The micro backbone's floors (docs/micro_backbone.md), measured by the evaluation code itself.
    assert m["retained_near"]["math"]["base_accuracy"]["accuracy"] >= 0.6
    assert m["retained_near"]["commonsense"]["base_accuracy"]["accuracy"] >= 0.7
    assert m["target"]["pass@1"] <= 0.3 and m["target"]["n_problems"] == 132
    assert base["timing"]["reference_hit"] is False


def test_lora_run_reuses_the_reference_and_records_everything(micro_runs):
    _, lora = micro_runs
    assert lora["status"] == "complete" and lora["train"]["steps"] == 40
    assert lora["timing"]["reference_hit"] is True and lora["timing"]["reference_build_s"] == 0.0
    assert lora["train"]["losses"][-1] < lora["train"]["losses"][0]
    m = lora["metrics"]
    assert m["retained_kl_mean"] > 0 and set(m["retained_near"]) == {"math", "commonsense"}
    assert lora["cost"]["trainable_params"] == 116736
