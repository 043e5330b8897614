"""Experiment loggers: `none` and W&B (offline by default, run id derived from the run id, resumable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


class NullLogger:
    """Logs nothing (logger=none)."""

    def log(self, metrics: dict, step: Optional[int] = None) -> None:
        pass

    def summary(self, metrics: dict) -> None:
        pass

    def close(self, exit_code: int = 0) -> None:
        pass


class WandbLogger:
    """W&B run whose id is the run id, so a resumed or requeued run continues the same W&B run."""

    def __init__(self, cfg: Any, run_id: str, run_dir: Path, config: dict, name: str) -> None:
        # here, not at the top: only logger=wandb needs it, and wandb takes a second to import
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=cfg.mode,
            id=run_id,
            resume="allow",
            name=name,
            dir=str(run_dir),
            config=config,
            tags=list(cfg.tags) or None,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, metrics: dict, step: Optional[int] = None) -> None:
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        for key, value in flatten(metrics).items():
            self.run.summary[key] = value

    def close(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a/b": 1}; lists and scalars are kept as leaves."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def make_logger(cfg: Any, run_id: str, run_dir: Path, config: dict, name: str):
    """The logger `cfg.kind` names (`none` or `wandb`)."""
    if cfg.kind == "wandb":
        return WandbLogger(cfg, run_id, run_dir, config, name)
    return NullLogger()
