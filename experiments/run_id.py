"""The `${run_id:}` resolver of conf/config.yaml (the run directory): the one place a composed config becomes
its run id, for `run.py`, the sweep planner and SLURM jobs (which do not execute run.py's module code).

Kept free of heavy imports: `run.py` registers it at start-up, before Hydra has even parsed the command line
(`--help`, `--cfg job` must stay fast); the run id itself is `experiments.job.run_id_for`, imported when a
run directory is first resolved.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


def _run_id(*, _root_: DictConfig) -> str:
    # here, not at the top: run.py registers the resolver before Hydra parses --help or --cfg (no torch until a run id)
    from experiments.job import run_id_for

    return run_id_for(OmegaConf.masked_copy(_root_, [k for k in _root_ if k != "hydra"]))


def register_run_id_resolver() -> None:
    """Register `${run_id:}` once per process."""
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", _run_id, use_cache=False)
