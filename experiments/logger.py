"""Experiment loggers: `none` and W&B (offline by default, run id derived from the run id, resumable).

A W&B run is grouped by what launched it (`wandb_group`) and typed by its method (job type); a complete run also
logs its record files as one artifact (`experiments.wandb_artifacts`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from experiments import wandb_artifacts
from experiments.wandb_artifacts import flatten

#: Environment variable naming the sweep folder (`<run_root>/.sweeps/<name>`) of the launch a job belongs to; the
#: sweep launchers set it (hydra_plugins/atlas_sweep/planner.py `new_sweep_folder`).
SWEEP_FOLDER_ENV = "ATLAS_SWEEP_FOLDER"


class NullLogger:
    """Logs nothing (logger=none)."""

    def log(self, metrics: dict, step: Optional[int] = None) -> None:
        pass

    def summary(self, metrics: dict) -> None:
        pass

    def log_run_files(self, run_dir: Path, record: dict) -> None:
        pass

    def close(self, exit_code: int = 0) -> None:
        pass


class WandbLogger:
    """W&B run whose id is the run id, so a resumed or requeued run continues the same W&B run; `group` and
    `job_type` as W&B shows them (None: no group)."""

    def __init__(self, cfg: Any, run_id: str, run_dir: Path, config: dict, name: str,
                 group: Optional[str] = None, job_type: Optional[str] = None) -> None:
        # here, not at the top: only logger=wandb needs it, and wandb takes a second to import
        import wandb

        self._wandb, self._cfg, self._logged = wandb, cfg, None
        self._wandb_dir = Path(run_dir) / "wandb"  # where wandb.init(dir=run_dir) writes
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=cfg.mode,
            id=run_id,
            resume="allow",
            name=name,
            dir=str(run_dir),
            config=config,
            group=group,
            job_type=job_type,
            tags=list(cfg.tags) or None,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, metrics: dict, step: Optional[int] = None) -> None:
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        for key, value in flatten(metrics).items():
            self.run.summary[key] = value

    def log_run_files(self, run_dir: Path, record: dict) -> None:
        """Log the complete run's record files (its own and its scales') as its `run-record` artifact."""
        wandb_artifacts.log_run_files(self.run, run_dir, record)
        self._logged = run_dir

    def close(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
        if self._logged is not None and exit_code == 0:
            wandb_artifacts.mark_logged(self._wandb_dir, self._logged, self._cfg)


def run_name(method: str, backbone: str, seed: Any, run_id: str) -> str:
    """The W&B display name of a run: `<method>-<backbone>-s<seed>-<first 8 characters of the run id>`."""
    return f"{method}-{backbone}-s{seed}-{run_id[:8]}"


def wandb_group(configured: Optional[str]) -> Optional[str]:
    """The W&B group of the run this process runs: `logger.group` when set; else the experiment preset Hydra composed
    (`experiment=<name>`); else, in a multirun sweep, `sweep-<sweep folder name>` (one per launch); else None (a
    single run has no group)."""
    if configured:
        return str(configured)
    # here, not at the top: only logger=wandb needs Hydra's runtime state
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    preset = hydra.runtime.choices.get("experiment")
    if preset:
        return str(preset)
    folder = os.environ.get(SWEEP_FOLDER_ENV)
    if hydra.mode == RunMode.MULTIRUN and folder:
        return f"sweep-{folder}"
    return None


def make_logger(cfg: Any, run_id: str, run_dir: Path, config: dict, name: str, job_type: Optional[str] = None):
    """The logger `cfg.kind` names (`none` or `wandb`); a W&B run's group is `wandb_group(cfg.group)`, its job type
    `cfg.job_type` or else `job_type` (the method's name)."""
    if cfg.kind == "wandb":
        return WandbLogger(cfg, run_id, run_dir, config, name, wandb_group(cfg.get("group")),
                           cfg.get("job_type") or job_type)
    return NullLogger()
