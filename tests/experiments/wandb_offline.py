"""Read back an offline W&B run file (`offline-run-*/run-<id>.wandb`) in tests.

The file is a LevelDB-style log (wandb-core writes it; the Python package no longer ships a reader): a 7-byte header
(`:W&B`, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte header (crc32c, length, type:
1 full, 2 first, 3 middle, 4 last); each whole record is a `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    """The serialized records of the file, in order."""
    data = Path(path).read_bytes()
    if len(data) < HEADER:  # not written yet
        return []
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
    return out


@dataclass
class OfflineRun:
    """What a run file says: the run (id, group, job type, config), its summary and its artifacts."""

    run_id: str = ""
    group: str = ""
    job_type: str = ""
    project: str = ""
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    artifacts: list = field(default_factory=list)  # dicts: name, type, digest, files (manifest paths)


def read_run(path: Path, timeout: float = 10.0) -> OfflineRun:
    """Parse the offline run file at `path`. wandb-core (another process) may still be writing it when `finish()` has
    returned: wait up to `timeout` seconds for the run's exit record."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + timeout
    while True:
        raws = raw_records(path)
        kinds = set()
        for raw in raws:
            rec = pb.Record()
            rec.ParseFromString(raw)
            kinds.add(rec.WhichOneof("record_type"))
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    run = OfflineRun()
    for raw in raws:
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.group, run.job_type, run.project = r.run_id, r.run_group, r.job_type, r.project
            run.config.update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "config":
            run.config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "summary":
            run.summary.update({u.key: json.loads(u.value_json) for u in rec.summary.update if u.key})
        elif kind == "artifact":
            a = rec.artifact
            run.artifacts.append({"name": a.name, "type": a.type, "digest": a.digest,
                                  "files": sorted(e.path for e in a.manifest.contents)})
    return run


def offline_runs(folder: Path) -> list[Path]:
    """The offline run files under `folder`, sorted."""
    return sorted(Path(folder).rglob("offline-run-*/run-*.wandb"))
