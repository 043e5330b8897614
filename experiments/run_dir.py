"""Where a run writes: `<run_root>/<run_id>`, and whether a launch may use the directory Hydra gives it.

Hydra decides a job's output directory (`hydra.run.dir`; `hydra.sweep.dir`/`hydra.sweep.subdir` in a sweep) and the
run locks, cleans and writes there. Pointed at another folder, a run would remove partial files and overwrite a
record that are not its own, so a directory is refused unless it is `<run_root>/<run_id>` (symlinks resolved) or
holds a record of this very run (a folder an earlier launch of it wrote into). `RunDirCheck`, a Hydra callback
(conf/config.yaml), refuses a single run before Hydra writes anything, and lets a complete run be skipped without
Hydra writing its `.hydra/` files into the run directory (a read-only run root is enough to skip it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from experiments import records
from experiments.validation import ConfigError, not_allowed


class RunDirError(ConfigError):
    """The directory a launch was given is not its run's own (another folder, or another run's)."""


def check_folder(key: str, value: Any) -> None:
    """Raise `RunDirError` for `key=value` unless the path `value` is a folder or one can be made there: the first
    path on the way up from it that exists is a folder (not a file, nor a dangling link)."""
    path = Path(os.path.abspath(str(value)))
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if not existing.is_dir():
        raise not_allowed(key, str(value), f"a folder; {existing} is not one", RunDirError)


def check_run_dir(run_dir: Path, run_root: Any, run_id: str, key: str, value: Any) -> None:
    """Raise `RunDirError` (naming `key=value`, the setting that chose `run_dir`) unless `run_dir` is
    `<run_root>/<run_id>` or holds a record of run `run_id`, and `run_root` is a folder (`check_folder`)."""
    check_folder("run_root", run_root)
    own = Path(str(run_root)) / run_id
    if os.path.realpath(run_dir) == os.path.realpath(own):
        return
    record = records.read_record(run_dir)
    if record is not None and record.get("run_id") == run_id:
        return
    held = f"; {run_dir} holds the record of run {record.get('run_id')!r}" if record is not None else ""
    raise not_allowed(key, str(value), f"a run writes only into its own directory {own} (<run_root>/<run_id>; "
                                       f"run_root=... moves it) or one holding its record{held}", RunDirError)


class RunDirCheck(Callback):
    """Hydra callback, called before Hydra makes or writes into any folder. A single run (`python run.py`): an
    invalid config or a directory that is not the run's (`check_run_dir`) ends the launch with its one-line error and
    exit code 2; for a complete run, Hydra writes no `.hydra/` (`hydra.output_subdir`: null). A sweep (`-m`): a
    run root or sweep folder that cannot be a folder ends it the same way (the sweep planner checks each job)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # here, not at the top: Hydra instantiates callbacks on every start
        from experiments import exit_codes

        try:
            check_folder("run_root", config.run_root)
            check_folder("hydra.sweep.dir", _resolved(config, "hydra.sweep.dir"))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(exit_codes.BAD_CONFIG)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # here, not at the top: Hydra instantiates callbacks on every start; torch loads only when a run starts
        from experiments import exit_codes, rerun
        from experiments.config import validate_config
        from experiments.methods import required_refinement, required_scales
        from suite_schema import run_identity

        try:
            typed = validate_config(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
            run_id = run_identity.run_id_of(OmegaConf.to_container(typed, resolve=True))
            value = _resolved(config, "hydra.run.dir")
            run_dir = Path(os.path.abspath(str(value)))
            check_run_dir(run_dir, typed.run_root, run_id, "hydra.run.dir", value)
        except ConfigError as exc:  # the config's own errors (MethodConfigError is one)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(exit_codes.BAD_CONFIG)
        complete = records.is_complete(run_dir, run_id, required_scales(typed), required_refinement(typed))
        if complete and not rerun.requested(typed.rerun_before, run_dir):
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.output_subdir = None


def _resolved(config: DictConfig, key: str) -> Any:
    """`key` of Hydra's composed `config`, resolved as Hydra resolves it for the job (its `${hydra:...}` too)."""
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(config)
    try:
        return OmegaConf.select(config, key)
    finally:
        HydraConfig.instance().cfg = previous
