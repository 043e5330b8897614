"""The suite's safetensors files (an atlas, a method's statistics, an export, cached log-probs): written atomically
like records, carrying the sha256 of their contents, verified on load.

`save_tensors` serializes with `safetensors.torch.save` and writes through `records.atomic_write`: the file gets the
user's umask as records do (safetensors' own writer leaves 0600), a failed write raises the OSError with its errno
(ENOSPC; safetensors' writer raises an error without it), and a killed writer leaves only a temporary name that
`records.partial_files` knows. The metadata field `sha256` holds the digest of every tensor's name, dtype, shape and
bytes and of the other metadata (`tensors_digest`); `load_tensors` recomputes it and raises `DamagedFile` for a file
that is truncated, altered or unreadable. A file written without the field (before it existed) loads unverified.
Files a library writes itself (peft's adapters) get the same mode and errno through `library_writes`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from experiments.records import atomic_write, file_mode

DIGEST_KEY = "sha256"


class DamagedFile(ValueError):
    """A safetensors file that cannot be read or does not match its digest."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path} is damaged: {what}")
        self.path, self.what = Path(path), what


def error_summary(exc: BaseException) -> str:
    """`<type>: <first sentence of the message>`, short enough for one log line."""
    first = (str(exc).splitlines() or [""])[0].split(". ")[0][:160]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _digest_of_metadata(metadata: dict[str, str]) -> Any:
    return hashlib.sha256(json.dumps(metadata, sort_keys=True).encode())


def _add_tensor(h: Any, name: str, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())


def tensors_digest(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """sha256 of the metadata (canonical JSON) and of each tensor's name, dtype, shape and bytes, by name."""
    h = _digest_of_metadata(metadata)
    for name in sorted(tensors):
        _add_tensor(h, name, tensors[name])
    return h.hexdigest()


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None) -> int:
    """Write `tensors` (and string `metadata`) to a safetensors file at `path` with their digest; return its bytes."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    metadata = dict(metadata or {})
    data = save(tensors, metadata={**metadata, DIGEST_KEY: tensors_digest(tensors, metadata)})
    atomic_write(Path(path), lambda fh: fh.write(data))
    return len(data)


def _read(path: Path, keep: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    tensors = {}
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = dict(fh.metadata() or {})
            expected = metadata.pop(DIGEST_KEY, None)
            h = _digest_of_metadata(metadata)
            for name in sorted(fh.keys()):  # one tensor in memory at a time unless they are kept
                t = fh.get_tensor(name)
                _add_tensor(h, name, t)
                if keep:
                    tensors[name] = t
    except (OSError, SafetensorError) as exc:
        raise DamagedFile(path, f"cannot be read ({error_summary(exc)})") from exc
    if expected is not None and expected != h.hexdigest():
        raise DamagedFile(path, "does not match its digest (truncated or altered)")
    return tensors, metadata


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata without the digest) of a file `save_tensors` wrote; raises `DamagedFile` when it cannot be
    read or does not match its digest."""
    return _read(path, keep=True)


def verify_tensors(path: Path) -> dict[str, str]:
    """`load_tensors` without keeping the tensors (one in memory at a time): the file's metadata, or `DamagedFile`."""
    return _read(path, keep=False)[1]


@contextmanager
def library_writes(folder: Path) -> Iterator[None]:
    """Around a library's own safetensors writes into `folder` (peft's `save_pretrained`): a failed write raises an
    OSError with the errno safetensors' error names ("... (os error 28)"), and the files written get the user's
    umask, as records do."""
    try:
        yield
    except SafetensorError as exc:
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code:
            raise OSError(int(code[1]), os.strerror(int(code[1])), str(folder)) from exc
        raise
    for path in Path(folder).rglob("*.safetensors"):
        os.chmod(path, file_mode())
