"""A run that reuses a finished run's training (`reuse_training_from`, experiments/reuse.py): it must be the model a
fresh run trains, evaluated on its own split, and say where its training came from."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments import records, reuse
from experiments.checkpoints import (
    STATE_FIELDS,
    checkpoint_path,
    checkpoint_problem,
    checksum_path,
    checksum_problem,
    move_sealed,
    save_checkpoint,
)
from experiments.config import train_config, validate_config
from experiments.train import train
from experiments.validation import ConfigError
from suite_schema import layout, registry, run_identity
from suite_schema.registry import CONF
from tests.baselines.baseline_helpers import prepared
from tests.conftest import run_cli, tiny_overrides


def resolved(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(validate_config(compose("config", overrides=list(overrides))), resolve=True)


def test_training_id_is_the_run_id_without_the_split():
    dev, test = resolved("benchmark.split=dev"), resolved("benchmark.split=test", "eval.scales=[0.5,1.0]")
    assert run_identity.run_id_of(dev) != run_identity.run_id_of(test)
    assert run_identity.training_id_of(dev) == run_identity.training_id_of(test)
    # a record's config (already scientific) gives the same id as the resolved config it came from
    assert run_identity.training_id_of(run_identity.scientific_config(dev)) == run_identity.training_id_of(dev)
    for change in ("seed=1", "method.conditioning=0.5", "train.steps=300", "eval.reference_seed=1",
                   "benchmark.seed=7", "method=lora"):
        assert run_identity.training_id_of(resolved("benchmark.split=dev", change)) != run_identity.training_id_of(dev), change


def test_reuse_training_from_must_name_folders(tmp_path):
    with pytest.raises(ConfigError, match=r"reuse_training_from\[1\]=.*not allowed: a folder"):
        resolved(f"reuse_training_from=[{tmp_path},{tmp_path / 'missing'}]")
    assert resolved(f"reuse_training_from=[{tmp_path}]")["reuse_training_from"] == [str(tmp_path)]


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in registry.method_names() if m != "base"])
def test_a_folder_that_adopts_a_finished_run_resumes_exactly_its_trained_model(tiny, tmp_path, name):
    """Every method: the statistics files and final checkpoint copied into a new folder, a fresh model prepared there
    and `train` called resumes at the last step with the donor's losses and every tensor of the donor's model."""
    cfg = train_config(steps=4, lr=2e-2, batch_size=4, grad_accum=1, checkpoint_every=100, progress=False)
    donor_dir, own_dir = tmp_path / "donor", tmp_path / "own"
    model, method, ctx = prepared(tiny, name, donor_dir, seed=3)
    done = train(model, method, tiny.examples, ctx, cfg)
    record = {"run_id": "d0", "split": "dev", "train": {"steps": 4}, "provenance": {"git_sha": "abc"}, "cost": {}}
    origin = reuse.adopt(reuse.Donor(donor_dir, record, checkpoint_path(donor_dir, 4)), own_dir, method.run_files)
    assert origin["run_id"] == "d0" and reuse.reused_training(own_dir) == origin
    for file in method.run_files:
        assert (own_dir / file).read_bytes() == (donor_dir / file).read_bytes()

    model2, method2, ctx2 = prepared(tiny, name, own_dir, seed=3)
    again = train(model2, method2, tiny.examples, ctx2, cfg)
    assert again.resumed_from == 4 and again.losses == done.losses
    ours, theirs = model2.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    unequal = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not unequal, unequal[:5]


@pytest.mark.slow
def test_a_test_run_evaluates_the_dev_run_s_model_and_equals_a_fresh_test_run(tiny_backbone_dir, tiny_benchmark_dir,
                                                                                 tmp_path):
    """Dev and test runs of one point in one folder; with the test run's checkpoints removed only the dev run can give
    its training. A test run elsewhere that reuses it has the fresh test run's metrics and losses exactly."""
    first, second, cache = tmp_path / "first", tmp_path / "second", tmp_path / "cache"
    common = ["logger=none", "method=atlas", "method.num_centers=4", "method.max_tokens=256"]
    proc = run_cli(["-m", "benchmark.split=dev,test", *common,
                    *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, first, cache)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    made = {rec["split"]: rec for rec in (json.loads(p.read_text()) for p in first.glob(f"*/{layout.RECORD_NAME}"))}
    assert set(made) == {"dev", "test"}
    dev, fresh = made["dev"], made["test"]
    shutil.rmtree(first / fresh["run_id"] / "checkpoints")

    proc = run_cli(["benchmark.split=test", f"reuse_training_from=[{first}]", "eval.scales=[0.5,1.0]", *common,
                    *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, second, cache)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    log = (second / fresh["run_id"] / "run.log").read_text()
    assert f"training reused from {first / dev['run_id']} (split dev" in log
    rec = records.read_record(second / fresh["run_id"])
    assert rec["run_id"] == fresh["run_id"] and rec["split"] == "test"
    assert rec["train"]["reused_from"]["run_id"] == dev["run_id"] and rec["train"]["reused_from"]["split"] == "dev"
    assert rec["train"]["resumed_from"] == 6 and rec["train"]["losses"] == fresh["train"]["losses"] == dev["train"]["losses"]
    assert rec["cost"]["train_seconds"] == dev["cost"]["train_seconds"]
    assert rec["metrics"] == fresh["metrics"]
    assert rec["metrics"] != dev["metrics"]  # evaluated on its own split
    assert records.is_complete(second / fresh["run_id"], fresh["run_id"], [0.5, 1.0])


def test_a_run_without_its_last_checkpoint_or_made_for_another_training_is_no_donor(tmp_path, caplog):
    def finished(run_id: str, config: dict, steps: int, checkpoint: bool) -> None:
        run_dir = tmp_path / "root" / run_id
        records.atomic_write_json(run_dir / layout.RECORD_NAME, {"run_id": run_id, "status": layout.STATUS_COMPLETE,
                                                                   "config": config, "train": {"steps": steps}})
        if checkpoint:
            save_checkpoint(run_dir, steps, {"step": steps, **{f: {} for f in STATE_FIELDS if f != "step"}}, keep=1)

    dev = run_identity.scientific_config(resolved("benchmark.split=dev"))
    training = run_identity.training_id_of(dev)
    finished("a-no-checkpoint", dev, 600, checkpoint=False)
    finished("b-other-seed", run_identity.scientific_config(resolved("benchmark.split=dev", "seed=1")), 600, checkpoint=True)
    own = tmp_path / "own"
    with caplog.at_level("INFO", logger="suite.run"):
        assert reuse.find_donor([tmp_path / "root"], training, 600, own) is None
    assert "a-no-checkpoint trains the same model but holds no checkpoint of step 600; not reused" in caplog.text
    assert "b-other-seed" not in caplog.text
    finished("bb-broken", dev, 600, checkpoint=True)
    broken = checkpoint_path(tmp_path / "root" / "bb-broken", 600)
    broken.write_bytes(broken.read_bytes()[:50])  # truncated: never copied
    finished("c-donor", dev, 600, checkpoint=True)
    caplog.clear()
    with caplog.at_level("WARNING", logger="suite.run"):
        donor = reuse.find_donor([tmp_path / "root"], training, 600, own)
    assert donor is not None and donor.run_dir.name == "c-donor"
    assert [r.getMessage() for r in caplog.records] == [
        f"{broken.parents[1]} trains the same model but its checkpoint step_00000600.pt is broken: does not match its "
        "checksum (truncated or altered); not reused"]
    stats = donor.run_dir / ".corda_eigens.pt.tmp"
    stats.write_bytes(b"eigens")
    move_sealed(stats, donor.run_dir / "corda_eigens.pt")
    reuse.adopt(donor, own, ["corda_eigens.pt"])
    assert checkpoint_problem(checkpoint_path(own, 600)) is None and checksum_path(checkpoint_path(own, 600)).is_file()
    assert checksum_problem(own / "corda_eigens.pt") is None and checksum_path(own / "corda_eigens.pt").is_file()
    assert reuse.find_donor([tmp_path / "root"], training, 300, own) is None  # trained for another number of steps
    assert reuse.find_donor([tmp_path / "root"], training, 600, tmp_path / "root" / "c-donor") is None  # not itself
