"""W&B logging offline: the run id is the W&B id, a second init resumes it, logger=none logs nothing."""

import pytest
from omegaconf import OmegaConf

from experiments.config import LoggerConfig
from experiments.logger import NullLogger, flatten, make_logger
from tests.conftest import REPO


def test_flatten_nests_with_slashes():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": [1]}) == {"a/b": 1, "a/c/d": 2, "e": [1]}


def test_none_logger():
    cfg = OmegaConf.merge(OmegaConf.structured(LoggerConfig), {"kind": "none"})
    assert isinstance(make_logger(cfg, "abc", None, {}, "x"), NullLogger)


@pytest.mark.slow
def test_wandb_offline_uses_run_id_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = OmegaConf.merge(OmegaConf.structured(LoggerConfig), OmegaConf.load(REPO / "conf/logger/wandb.yaml"), {"mode": "offline"})
    for attempt in range(2):  # the second init is a requeued job continuing the same run
        logger = make_logger(cfg, "0123456789abcdef", tmp_path, {"seed": 0}, "lora-micro")
        assert logger.run.id == "0123456789abcdef"
        logger.log({"train/loss": 1.0 / (attempt + 1)}, step=attempt)
        logger.summary({"metrics": {"pass@1": 0.5}})
        logger.close()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*-0123456789abcdef"))
    assert runs, list((tmp_path / "wandb").iterdir())
    assert all((r / "run-0123456789abcdef.wandb").exists() for r in runs)
