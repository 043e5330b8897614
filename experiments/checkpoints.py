"""A run's training checkpoints: written atomically with their sha256, verified before they are resumed.

`checkpoints/step_<step, 8 digits>.pt` is a `torch.save` of the loop's state; beside it
`step_<...>.pt.sha256` holds the sha256 of its bytes in `sha256sum` format (`sha256sum -c` checks it), written
before the checkpoint gets its final name, so a checkpoint under that name always has it. A checkpoint is intact
when its bytes match that checksum and it loads into the loop's state; one written before checksums existed (its
state lacks the `checksummed` mark) when it loads. A broken one (truncated, emptied, altered, without its checksum
file, not a file, without the state's fields) is never resumed: it is moved with its checksum into
`checkpoints/broken/` under a name with the time, and the run resumes from the newest intact one, or from scratch
when there is none.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Optional

import torch

from experiments.disk_cache import file_sha256
from experiments.records import atomic_write
from experiments.tensor_files import error_summary

log = logging.getLogger("suite.train")

CHECKPOINT_DIR = "checkpoints"
BROKEN_DIR = "broken"
CHECKSUM_SUFFIX = ".sha256"
#: What the training loop's state holds (`experiments.train.train`'s snapshot).
STATE_FIELDS = ("step", "method", "optimizer", "scheduler", "stream", "rng", "losses", "tokens_seen",
                "train_seconds")
#: Set in every checkpoint written with a checksum file: one that has lost that file is not taken for an older one.
CHECKSUMMED = "checksummed"


class BrokenCheckpoint(Exception):
    """A checkpoint that cannot be resumed; `what` says why in a few words."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"checkpoint {path} is broken: {what}")
        self.path, self.what = Path(path), what


def checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives: <run_dir>/checkpoints/step_<step, 8 digits>.pt."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{step:08d}.pt"


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """The checkpoints of a run under their final names, oldest first (half-written ones never carry the final
    name; broken ones may: see `newest_intact`)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    return sorted(folder.glob("step_*.pt")) if folder.is_dir() else []


def checksum_path(path: Path) -> Path:
    """`<checkpoint>.sha256`, the checkpoint's checksum file."""
    return Path(path).with_name(Path(path).name + CHECKSUM_SUFFIX)


def step_of(path: Path) -> int:
    """The step in a checkpoint's name."""
    return int(Path(path).stem.split("_")[1])


class _Sink:
    """A binary file for `torch.save` that hashes what is written and keeps the OSError of a failed write (ENOSPC,
    EIO), which torch itself turns into a RuntimeError without the errno."""

    def __init__(self, fh) -> None:
        self.fh, self.error, self.digest = fh, None, hashlib.sha256()

    def write(self, data) -> int:
        try:
            written = self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.digest.update(data)
        return written

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as exc:
            self.error = exc
            raise


def save_checkpoint(run_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Write `state` atomically as checkpoints/step_<step>.pt with its checksum, and keep only the newest `keep`."""
    final = checkpoint_path(run_dir, step)

    def write(fh) -> None:
        sink = _Sink(fh)
        try:
            torch.save({**state, CHECKSUMMED: True}, sink)
        except RuntimeError as exc:
            if sink.error is not None:  # torch reports a failed write (a full disk) as a bare RuntimeError
                raise sink.error from exc
            raise
        line = f"{sink.digest.hexdigest()}  {final.name}\n".encode()
        atomic_write(checksum_path(final), lambda out: out.write(line))  # before the checkpoint gets its name

    atomic_write(final, write)
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
        checksum_path(old).unlink(missing_ok=True)
    for orphan in final.parent.glob(f"step_*.pt{CHECKSUM_SUFFIX}"):  # a writer killed before the rename left it
        if not orphan.with_name(orphan.name[: -len(CHECKSUM_SUFFIX)]).exists():
            orphan.unlink(missing_ok=True)
    return final


def move_sealed(tmp: Path, final: Path) -> None:
    """Rename the complete file `tmp` to `final`, the checksum file of its bytes written first (as a checkpoint's is):
    for a run file a library writes itself (CorDA's decomposition)."""
    line = f"{file_sha256(tmp)}  {Path(final).name}\n".encode()
    atomic_write(checksum_path(final), lambda out: out.write(line))
    os.replace(tmp, final)


def checksum_problem(path: Path) -> Optional[str]:
    """Why the file at `path` does not match its checksum file; None when it does or has none."""
    path = Path(path)
    if not path.is_file():
        return "not a file"
    try:
        expected = checksum_path(path).read_text().split()[0]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError) as exc:
        return f"its checksum file cannot be read ({type(exc).__name__})"
    key = _identity(path)
    if _VERIFIED.get(key) != expected:
        if file_sha256(path) != expected:
            return "does not match its checksum (truncated or altered)"
        _VERIFIED[key] = expected
    return None


#: Files whose bytes were found to match their checksum in this process, by `_identity`: a run start checks the
#: newest checkpoint before loading it, which would otherwise read a large checkpoint twice.
_VERIFIED: dict[tuple, str] = {}


def _identity(path: Path) -> tuple:
    st = path.stat()
    return str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def load_checkpoint(path: Path, mmap: bool = False) -> dict:
    """The loop's state stored in the checkpoint at `path`; raises `BrokenCheckpoint` for one that is not intact.
    With `mmap` the tensors are mapped from the file, not read (enough to check the rest)."""
    path = Path(path)
    problem = checksum_problem(path)
    if problem:
        raise BrokenCheckpoint(path, problem)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except MemoryError:  # the file may well be intact
        raise
    except Exception as exc:  # torch raises RuntimeError, EOFError, OSError, UnpicklingError, ... for a damaged file
        raise BrokenCheckpoint(path, f"cannot be read ({error_summary(exc)})") from exc
    missing = [f for f in STATE_FIELDS if not isinstance(state, dict) or f not in state]
    if missing:
        raise BrokenCheckpoint(path, f"lacks {', '.join(missing)}")
    if state.get(CHECKSUMMED) and not checksum_path(path).exists():
        raise BrokenCheckpoint(path, "its checksum file is missing")
    if state["step"] != step_of(path):
        raise BrokenCheckpoint(path, f"holds step {state['step']}")
    return state


def set_aside(error: BrokenCheckpoint) -> Path:
    """Move a broken checkpoint and its checksum file into `checkpoints/broken/` (the name gets the time), saying so
    in one warning line; return where it went."""
    path = error.path
    folder = path.parent / BROKEN_DIR
    folder.mkdir(exist_ok=True)
    dest = folder / f"{path.stem}-{time.strftime('%Y%m%dT%H%M%S')}{path.suffix}"
    n = 1
    while dest.exists():
        n += 1
        dest = folder / f"{path.stem}-{time.strftime('%Y%m%dT%H%M%S')}-{n}{path.suffix}"
    path.rename(dest)
    if checksum_path(path).exists():
        checksum_path(path).rename(checksum_path(dest))
    log.warning("%s; moved to %s", error, dest)
    return dest


def checkpoint_problem(path: Path) -> Optional[str]:
    """Why the checkpoint at `path` is not intact, None when it is (`load_checkpoint`, the tensors mapped, not read:
    the checksum covers their bytes)."""
    try:
        load_checkpoint(path, mmap=True)
    except BrokenCheckpoint as exc:
        return exc.what
    return None


def newest_intact(run_dir: Path) -> Optional[Path]:
    """The newest intact checkpoint of a run (`checkpoint_problem`), the broken ones newer than it moved aside
    (`set_aside`); None when there is none."""
    for path in reversed(checkpoint_paths(run_dir)):
        problem = checkpoint_problem(path)
        if not problem:
            return path
        set_aside(BrokenCheckpoint(path, problem))
    return None


def resume(run_dir: Path) -> Optional[tuple[Path, dict]]:
    """(path, state) of the newest intact checkpoint of a run, the broken ones newer than it moved aside
    (`set_aside`); None when there is none."""
    for path in reversed(checkpoint_paths(run_dir)):
        try:
            return path, load_checkpoint(path)
        except BrokenCheckpoint as exc:
            set_aside(exc)
    return None
