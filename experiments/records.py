"""Writing and reading a run's files: atomic writes, the record of a run directory, whether a run is complete, and
the provenance a record carries (code version, packages, machine). The record's layout is `suite_schema.layout`, the
run id `suite_schema.run_identity`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import reprlib
import socket
import subprocess
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

from experiments import scale_refinement
from suite_schema.layout import (
    RECORD_NAME,
    RUN_OUTPUT_NAMES,
    SCALES_DIR,
    STATUS_COMPLETE,
    STATUSES,
    is_number,
    scale_dir,
    scale_run_id,
    type_name,
)

PACKAGES = ("torch", "transformers", "peft", "hydra-core", "omegaconf", "lm-eval", "submitit", "wandb", "datasets")


def file_mode() -> int:
    """The mode a plain `open()` gives a new file under the process's umask (0o666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write a file so that readers see either the old one or the whole new one: `write(fh)` fills a temporary
    file beside it (named `.<name>.*.tmp`, see `partial_files`), which is fsynced and renamed over `path`. The file
    gets the user's umask, as `open()` would give it (a temp file alone would be 0600). On an error the temporary
    file is closed before it is removed: an unlinked file still open keeps its blocks, and on a full disk the
    record saying why the run stopped could not be written either."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, file_mode())
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, written with `atomic_write`."""
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


#: The folders of a run directory its writers put temporary files in, besides the run directory itself:
#: checkpoints, the export (the atlas) and each post-hoc scale's records.
PARTIAL_PLACES = ("checkpoints", "export", f"{SCALES_DIR}/*")


def is_partial_name(name: str) -> bool:
    """Whether `name` is one a writer of the suite gives a file before renaming it into place: `.<name>.<random>.tmp`
    (`atomic_write`), `<name>.tmp` (the atlas, cached activations), `.<name>.tmp-<pid>` (caches built by one
    process) or `.tmp<6 characters>` (safetensors' own writer, as peft's adapters use it)."""
    return (name.endswith(".tmp") or re.fullmatch(r"\..+\.tmp-\d+", name) is not None
            or re.fullmatch(r"\.tmp[A-Za-z0-9_]{6}", name) is not None)


def partial_files(run_dir: Path) -> list[Path]:
    """The temporary files a killed writer leaves in a run directory: every atomic write of a run (records and
    checkpoints through `atomic_write`, the atlas, cached activations) goes through a name of `is_partial_name`
    that is renamed when complete, so such a file is never a result. Only the run directory and its
    `PARTIAL_PLACES` are looked in, one level each (no other folder is the suite's). Only safe to remove under the
    run's lock."""
    run_dir = Path(run_dir)
    places = [run_dir, *(d for pattern in PARTIAL_PLACES for d in run_dir.glob(pattern))]
    return sorted(p for d in places if d.is_dir() for p in d.iterdir() if is_partial_name(p.name))


def _parse(path: Path) -> tuple[dict | None, str | None]:
    """(the record at `path`, None); (None, None) when there is none; (None, why) when the file cannot be read as a
    record: not a file, not UTF-8, not JSON, or not a JSON object."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8: {exc}"
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(value, dict):
        return None, f"it holds a JSON {type_name(value)}, not an object"
    return value, None


def read_record(run_dir: Path) -> dict | None:
    """The record in `run_dir`, or None when there is none or it cannot be read as a record."""
    return _parse(Path(run_dir) / RECORD_NAME)[0]


def part(record: dict | None, key: str) -> dict:
    """`record[key]` where it is a JSON object, else {} (a record written by other code may hold anything)."""
    value = (record or {}).get(key)
    return value if isinstance(value, dict) else {}


def _unusable(path: Path, run_id: str) -> str | None:
    """Why the file at `path` is no record of run `run_id` the suite can go on from, or None (none there, or a
    record of this run): it cannot be read as a record, holds a status the suite does not write, or another run id."""
    record, problem = _parse(path)
    if record is None:
        return problem
    if record.get("run_id") != run_id:
        return f"it is the record of run id {reprlib.repr(record.get('run_id'))}, not of {run_id}"
    if record.get("status") not in STATUSES:
        return f"its status {reprlib.repr(record.get('status'))} is none of {', '.join(STATUSES)}"
    return None


def set_aside_unreadable(run_dir: Path, run_id: str) -> list[tuple[Path, str]]:
    """Move every record file of `run_dir` (the run's own and each post-hoc scale's) that is no record of this run
    (`_unusable`: unreadable, of another run id, or with an unknown status) to `record.json.unreadable-<UTC time>`
    beside it, where neither the suite nor analysis reads it, instead of writing over it; return (where each went,
    why). Only safe under the run's lock."""
    run_dir = Path(run_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    moved = []
    found = [(run_dir / RECORD_NAME, run_id)]
    found += [(p, f"{run_id}@{p.parent.name}") for p in sorted(run_dir.glob(f"{SCALES_DIR}/*/{RECORD_NAME}"))]
    for path, expected in found:
        problem = _unusable(path, expected)
        if problem is None:
            continue
        dest, n = path.with_name(f"{RECORD_NAME}.unreadable-{stamp}"), 1
        while os.path.lexists(dest):
            n += 1
            dest = path.with_name(f"{RECORD_NAME}.unreadable-{stamp}-{n}")
        os.replace(path, dest)
        moved.append((dest, problem))
    return moved


def extra_scales(scales: Any) -> list[float]:
    """The scales besides 1.0 (the run's own record) that need their own record, sorted."""
    return sorted({float(a) for a in (scales or ()) if float(a) != 1.0})


#: The key of a run's own record naming the scale refinement it ran (`experiments.scale_refinement`): its settings,
#: the scales it `added`, why it `stopped`, the `widest_gap` left.
REFINEMENT_KEY = "scale_refinement"


def is_complete(run_dir: Path, run_id: str, scales: Any = (), refinement: Optional[dict] = None) -> bool:
    """True when `run_dir` holds a complete record for exactly this run id, and one for every
    post-hoc scale in `scales` (1.0 is the run's own record). With `refinement` (the settings of a scale refinement,
    `experiments.scale_refinement.settings`), also when the run's record names a refinement that added every scale
    one with these settings would (`scale_refinement.covers`) and every scale it added has its complete record: the
    refined scales are decided while the run is evaluated, so the run's own record, written last, lists them."""
    record = read_record(run_dir)
    if not (record and record.get("status") == STATUS_COMPLETE and record.get("run_id") == run_id):
        return False
    if refinement:
        done = part(record, REFINEMENT_KEY)
        added = done.get("added")
        if (not scale_refinement.covers(done, refinement) or not isinstance(added, list)
                or not all(is_number(a) for a in added)):
            return False
        scales = [*(scales or ()), *added]
    for alpha in extra_scales(scales):
        scaled = read_record(scale_dir(run_dir, alpha))
        if not (scaled and scaled.get("status") == STATUS_COMPLETE and scaled.get("run_id") == scale_run_id(run_id, alpha)):
            return False
    return True


def git_output(*args: str, cwd: Optional[Path] = None) -> Optional[str]:
    """Stdout of `git ARGS` in the code's checkout (or `cwd`), stripped; None when git fails or is absent."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd or Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


_CODE_VERSION: Optional[tuple[Optional[str], Optional[bool]]] = None


def code_version() -> tuple[Optional[str], Optional[bool]]:
    """(git sha, dirty flag) of the checkout, read once per process: a process runs the code it imported when it
    started, so a commit made while it runs does not change what its records say (call it early)."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        _CODE_VERSION = (git_output("rev-parse", "HEAD"), changed_code())
    return _CODE_VERSION


def changed_code(cwd: Optional[Path] = None) -> Optional[bool]:
    """Whether the checkout's tracked files differ from its commit, leaving out the files runs write into a run root
    (`suite_schema.layout.RUN_OUTPUT_NAMES`: records, the test-read ledger, the protocol's chunk log); None without git."""
    outputs = [f":(top,exclude,glob)**/{name}" for name in RUN_OUTPUT_NAMES]
    status = git_output("status", "--porcelain", "--untracked-files=no", "--", ":/", *outputs, cwd=cwd)
    return None if status is None else bool(status)


@functools.lru_cache(maxsize=None)
def _machine() -> tuple:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    capability = device = None
    try:
        # here, not at the top: Hydra's start imports this module through the sweep planner; torch loads only for a record
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    except Exception:  # a record is still written when torch cannot say
        pass
    return model or platform.processor() or None, capability, device


def machine() -> dict:
    """What decides how the run's float arithmetic rounds besides the code and the packages: the CPU model
    (`/proc/cpuinfo` "model name", else `platform.processor()`), the vector instruction set torch's CPU kernels use
    (`torch.backends.cpu.get_cpu_capability()`, e.g. AVX512), and the CUDA device's name where one is used. The same
    run on two CPUs can differ from its first loss on (another kernel, another order of sums). Read once per process."""
    return dict(zip(("cpu", "cpu_capability", "cuda_device"), _machine()))


def provenance(started: Optional[datetime] = None) -> dict:
    """Git sha and dirty flag of the code (`code_version`), package versions, host, the machine's CPU and device
    (`machine`), Python, and start/end times (UTC, ISO 8601)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    sha, dirty = code_version()
    now = datetime.now(timezone.utc).isoformat()
    return {
        "git_sha": sha,
        "git_dirty": dirty,
        "packages": versions,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": machine(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "start_time": started.isoformat() if started else now,
        "end_time": now,
    }
