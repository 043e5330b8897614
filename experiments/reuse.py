"""Evaluating a finished run's trained model on another split instead of training it again: `reuse_training_from`.

A dev run and a test run of one sweep point train the same model. They differ only in `benchmark.split`, which
chooses the items a run is evaluated on, and nothing that trains reads those items: methods fit their statistics on
the calibration split and train on the target training split (experiments/calibration.py), and the reference cache
stores each split's log-probs by that split's own size. `run_identity.training_id_of` hashes a config without the split.

With `reuse_training_from=[<run_root>, ...]`, a run that trains and has no intact checkpoint of its own looks there
for a complete run with the same training id whose final checkpoint is still in its folder, intact (`find_donor`). It
copies the method's statistics files (`Method.run_files`: an atlas, a basis, a decomposition) and that checkpoint into
its own folder (`adopt`), and the training loop then resumes at the last step, as a preempted run resumes: the
trained state, the optimizer, the data position and every RNG state are the donor's. Exporting, diagnostics and
evaluation at every post-hoc scale then run on this run's own split. The record says where the training came from
(`train.reused_from`: the donor's run id, folder, split and code version), and `cost.train_seconds` is the donor's.

Why it is worth having: the test runs of the points chosen on dev include the dev runs' own seed, so the equal-budget
protocol (micro_tune, then micro_main) trains those models once instead of twice, and the test number of a chosen
point is the number of the very model that was chosen.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from experiments import records, rerun
from experiments.checkpoints import checkpoint_path, checkpoint_problem, checksum_path, newest_intact
from suite_schema import layout, run_identity

log = logging.getLogger("suite.run")

#: In a run folder that resumed another run's training: where that training came from (written before the checkpoint).
REUSED_FILE = "reused_training.json"


@dataclass(frozen=True)
class Donor:
    """A finished run whose training a run can resume at its last step."""

    run_dir: Path
    record: dict
    checkpoint: Path

    def origin(self) -> dict:
        """Where the training was made: the donor itself, or the run it reused its training from in turn."""
        earlier = (self.record.get("train") or {}).get("reused_from")
        if isinstance(earlier, dict):
            return earlier
        prov = self.record.get("provenance") or {}
        return {"run_id": self.record.get("run_id"), "run_dir": str(self.run_dir), "split": self.record.get("split"),
                "git_sha": prov.get("git_sha"), "git_dirty": prov.get("git_dirty"),
                "threads": (self.record.get("cost") or {}).get("threads")}


def find_donor(roots: Sequence[Path], training_id: str, steps: int, own_dir: Path,
               rerun_before: Optional[str] = None) -> Optional[Donor]:
    """The first complete run under `roots` (folders `<root>/<run_id>/`, in root order, then run id order) that trained
    `training_id` for `steps` steps and still holds the checkpoint of its last step; None when there is none. A run
    that `rerun_before` would make again is not used, nor the run in `own_dir` itself."""
    own = Path(own_dir).resolve()
    for root in roots:
        for path in sorted(Path(root).glob(f"*/{layout.RECORD_NAME}")):
            run_dir = path.parent
            if run_dir.resolve() == own:
                continue
            record = records.read_record(run_dir)
            if not (record and record.get("status") == layout.STATUS_COMPLETE and isinstance(record.get("config"), dict)):
                continue
            if run_identity.training_id_of(record["config"]) != training_id:
                continue
            final = checkpoint_path(run_dir, steps)  # the training id holds train.steps: the donor trained `steps`
            if not final.exists():
                log.info("%s trains the same model but holds no checkpoint of step %d; not reused", run_dir, steps)
                continue
            broken = checkpoint_problem(final)
            if broken:
                log.warning("%s trains the same model but its checkpoint %s is broken: %s; not reused", run_dir,
                            final.name, broken)
                continue
            stale = rerun.requested(rerun_before, run_dir)
            if stale:
                log.info("%s trains the same model but %s (rerun_before); not reused", run_dir, stale)
                continue
            return Donor(run_dir, record, final)
    return None


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")  # a killed copy leaves a partial file under a name no reader takes
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def adopt(donor: Donor, run_dir: Path, run_files: Sequence[str]) -> dict:
    """Copy the donor's statistics files (those of `run_files` it has) and its final checkpoint with its checksum into
    `run_dir`, the checkpoint last (its presence is what makes the loop resume); return the origin written to
    `REUSED_FILE`."""
    run_dir = Path(run_dir)
    origin = donor.origin()
    records.atomic_write_json(run_dir / REUSED_FILE, origin)
    for name in run_files:
        for file in (checksum_path(donor.run_dir / name), donor.run_dir / name):  # a checksum file first, if any
            if file.is_file():
                _copy(file, run_dir / file.relative_to(donor.run_dir))
    own = run_dir / donor.checkpoint.relative_to(donor.run_dir)
    if checksum_path(donor.checkpoint).is_file():
        _copy(checksum_path(donor.checkpoint), checksum_path(own))
    _copy(donor.checkpoint, own)
    return origin


def reused_training(run_dir: Path) -> Optional[dict]:
    """The origin of the training a run folder resumed from another run (`adopt`), or None."""
    try:
        return json.loads((Path(run_dir) / REUSED_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def reuse_training(roots: Sequence[Path], training_id: str, steps: int, run_dir: Path, run_files: Sequence[str],
                   rerun_before: Optional[str] = None) -> Optional[dict]:
    """Before a trained run loads anything: the origin of the training it resumes, or None when it trains itself.

    A folder with checkpoints of its own resumes them (an earlier attempt of this run, itself perhaps a reuse: then
    `REUSED_FILE` says so). Otherwise a donor from `roots` is adopted when there is one."""
    run_dir = Path(run_dir)
    if newest_intact(run_dir):  # broken ones are moved aside: a folder left with none may adopt a donor
        return reused_training(run_dir)
    (run_dir / REUSED_FILE).unlink(missing_ok=True)  # an attempt killed before its checkpoint was copied
    if not roots or steps <= 0:
        return None
    donor = find_donor(roots, training_id, steps, run_dir, rerun_before)
    if donor is None:
        log.info("no finished run under %s trains this model (training id %s); training it",
                 ", ".join(str(r) for r in roots), training_id)
        return None
    origin = adopt(donor, run_dir, run_files)
    log.info("training reused from %s (split %s, run %s): resuming its step-%d checkpoint", donor.run_dir,
             donor.record.get("split"), donor.record.get("run_id"), steps)
    return origin
