"""What W&B gets of a finished run: its summary (metrics and costs, flattened as the live logger writes them) and
one `run-record` artifact holding its record files; and the marker that says which files a W&B run already got.

The artifact's name is `record-<run id>`; W&B versions an artifact by the digest of its contents, so logging the same
files again adds no version.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from experiments import records
from suite_schema import layout

RUN_RECORD_TYPE = "run-record"
REPORT_TYPE = "report"
#: A run's files (its own and each post-hoc scale's) that go into its artifact, where present. `retained_samples.json`
#: holds the stored answers on the retained domains.
RUN_FILES = (layout.RECORD_NAME, layout.CODE_SAMPLES_NAME, layout.RETAINED_SAMPLES_NAME)
#: In a run's W&B folder (`<dir>/wandb/`): where, and with which files, the run's W&B run was last logged complete.
MARKER_NAME = "atlas-logged.json"


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


def artifact_name(run_id: str) -> str:
    """The name of a run's `run-record` artifact."""
    return f"record-{run_id}"


def run_files(run_dir: Path) -> list[tuple[Path, str]]:
    """(file, its name in the artifact) of each of `RUN_FILES` in `run_dir` and in each post-hoc scale's folder
    (`scales/<label>/<file>`), the run's own first."""
    run_dir = Path(run_dir)
    out = [(run_dir / name, name) for name in RUN_FILES if (run_dir / name).is_file()]
    for scale in sorted(p for p in run_dir.glob(f"{layout.SCALES_DIR}/*") if p.is_dir()):
        rel = f"{layout.SCALES_DIR}/{scale.name}"
        out += [(scale / name, f"{rel}/{name}") for name in RUN_FILES if (scale / name).is_file()]
    return out


def scale_records(run_dir: Path, run_id: str) -> dict[str, dict]:
    """The complete record of each post-hoc scale of run `run_id`, by scale label (the folder name)."""
    out = {}
    for folder in sorted(Path(run_dir).glob(f"{layout.SCALES_DIR}/*")):
        rec = records.read_record(folder)
        if rec and rec.get("status") == layout.STATUS_COMPLETE and rec.get("train_run_id") == run_id:
            out[folder.name] = rec
    return out


def summary_of(record: dict, scales: dict[str, dict]) -> dict:
    """The W&B summary of a complete record: `metrics/...` and `cost/...` flattened with `/`, and each scale's
    `scale/<label>/metrics/...`: the keys the live logger writes (`experiments.job`)."""

    tree = {"metrics": records.part(record, "metrics"), "cost": records.part(record, "cost")}
    tree.update({f"scale/{label}": {"metrics": records.part(rec, "metrics")} for label, rec in scales.items()})
    return flatten(tree)


def files_digest(run_dir: Path) -> str:
    """sha256 (hex) over the names and bytes of the run's artifact files (`run_files`)."""
    h = hashlib.sha256()
    for path, name in run_files(run_dir):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def log_run_files(run: Any, run_dir: Path, record: dict) -> Any:
    """Log the run's files (`run_files`) as its `run-record` artifact from the W&B run `run` and return it."""
    # here, not at the top: wandb takes a second to import and only logger=wandb needs it
    import wandb

    art = wandb.Artifact(artifact_name(record["run_id"]), type=RUN_RECORD_TYPE,
                         metadata={key: record.get(key) for key in ("run_id", "method", "backbone", "benchmark", "seed")})
    for path, name in run_files(run_dir):
        art.add_file(str(path), name=name)
    run.log_artifact(art)
    return art


def _marker(run_dir: Path, cfg: Any) -> dict:
    return {"project": cfg.project, "entity": cfg.entity, "mode": cfg.mode, "files_sha256": files_digest(run_dir)}


def mark_logged(wandb_dir: Path, run_dir: Path, cfg: Any) -> None:
    """Write the marker: the W&B run in `wandb_dir` holds `run_dir`'s files as they are now (`cfg`: project, entity,
    mode). Nothing for mode `disabled`."""
    if cfg.mode != "disabled":
        records.atomic_write_json(Path(wandb_dir) / MARKER_NAME, _marker(run_dir, cfg))


def logged_before(wandb_dir: Path, run_dir: Path, cfg: Any) -> Optional[Path]:
    """The marker file when the W&B run in `wandb_dir` was logged complete with the same project, entity, mode and
    files as `run_dir` holds now; else None."""
    path = Path(wandb_dir) / MARKER_NAME
    try:
        seen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return path if seen == _marker(run_dir, cfg) else None
