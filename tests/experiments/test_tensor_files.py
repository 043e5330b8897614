"""The suite's safetensors files: the records' mode, the errno of a full disk, a digest that catches damage a plain
safetensors load reads without an error."""

import errno
import subprocess
import sys
import time

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from experiments import records
from experiments.tensor_files import (
    DamagedFile,
    library_writes,
    load_tensors,
    save_tensors,
    verify_tensors,
)
from tests.conftest import REPO, mounted_tmpfs

TENSORS = {"a": torch.randn(64, 64), "ids": torch.arange(10), "half": torch.randn(3, 5, dtype=torch.bfloat16),
           "scalar": torch.tensor(2.5)}


def test_written_with_the_records_mode_and_read_back_exactly(tmp_path):
    path = tmp_path / "x.safetensors"
    size = save_tensors(path, TENSORS, {"sites": "[]"})
    assert size == path.stat().st_size and path.stat().st_mode & 0o777 == records.file_mode()
    tensors, metadata = load_tensors(path)
    assert metadata == {"sites": "[]"} and tensors.keys() == TENSORS.keys()
    assert all(torch.equal(tensors[k], TENSORS[k]) for k in TENSORS)
    assert verify_tensors(path) == metadata


@pytest.mark.parametrize("damage", ["half", "empty", "altered", "metadata"])
def test_damage_is_named_with_the_file(tmp_path, damage):
    path = tmp_path / "x.safetensors"
    save_tensors(path, TENSORS, {"sites": "[1]"})
    raw = path.read_bytes()
    if damage == "half":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "altered":  # bytes of a tensor changed in place: safetensors reads it without an error
        path.write_bytes(raw[:-200] + bytes(b ^ 0x0F for b in raw[-200:-196]) + raw[-196:])
        load_file(str(path))
    else:
        path.write_bytes(raw.replace(b'"sites":"[1]"', b'"sites":"[2]"'))
        assert load_file(str(path)).keys() == TENSORS.keys()
    with pytest.raises(DamagedFile, match=f"^{path} is damaged: "):
        load_tensors(path)
    with pytest.raises(DamagedFile):
        verify_tensors(path)


def test_a_file_written_before_the_digest_loads(tmp_path):
    save_file(TENSORS, str(tmp_path / "old.safetensors"), metadata={"sites": "[]"})
    tensors, metadata = load_tensors(tmp_path / "old.safetensors")
    assert metadata == {"sites": "[]"} and torch.equal(tensors["a"], TENSORS["a"])


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs: too small for a 200 KB tensor file."""
    yield from mounted_tmpfs(tmp_path / "small", "64k")


def test_a_full_disk_raises_enospc_and_leaves_nothing(small_tmpfs):
    big = {"w": torch.randn(256, 256)}
    with pytest.raises(OSError) as info:
        save_tensors(small_tmpfs / "atlas.safetensors", big)
    assert info.value.errno == errno.ENOSPC
    assert list(small_tmpfs.iterdir()) == []
    with pytest.raises(OSError) as info:  # a library's own write (peft's adapters), e.g. safetensors' save_file
        with library_writes(small_tmpfs):
            save_file(big, str(small_tmpfs / "adapter_model.safetensors"))
    assert info.value.errno == errno.ENOSPC and str(small_tmpfs) in str(info.value)


def test_a_library_write_error_gets_its_errno_and_its_files_the_records_mode(tmp_path, monkeypatch):
    with pytest.raises(OSError) as info:
        with library_writes(tmp_path):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert info.value.errno == errno.ENOSPC
    with library_writes(tmp_path):
        save_file(TENSORS, str(tmp_path / "adapter_model.safetensors"))
    assert (tmp_path / "adapter_model.safetensors").stat().st_mode & 0o777 == records.file_mode()


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_only_a_partial_file_a_launch_removes(tmp_path):
    """SIGKILL before the rename: what is left is a temporary name `records.partial_files` lists, never a file under
    the final name."""
    code = ("import os, signal, torch\n"
            "from experiments import records\n"
            "from experiments.tensor_files import save_tensors\n"
            "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"save_tensors({str(tmp_path / 'run' / 'atlas.safetensors')!r}, {{'w': torch.randn(512, 512)}})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    left = list((tmp_path / "run").iterdir())
    assert len(left) == 1 and records.partial_files(tmp_path / "run") == left, left


@pytest.mark.slow
def test_a_library_writer_killed_mid_write_leaves_a_file_a_launch_removes(tmp_path):
    """safetensors' own writer (peft's adapters) writes a temporary `.tmpXXXXXX` beside the file and renames it:
    killed before the rename, what it leaves is listed by `records.partial_files`."""
    code = ("import os, signal, torch\n"
            "from safetensors.torch import save_file\n"
            f"save_file({{f'w{{i}}': torch.randn(2048, 2048) for i in range(40)}}, "
            f"{str(tmp_path / 'run' / 'export' / 'adapter_model.safetensors')!r})\n")
    (tmp_path / "run" / "export").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        while not list((tmp_path / "run" / "export").iterdir()) and proc.poll() is None:
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    left = list((tmp_path / "run" / "export").iterdir())
    assert left and all(p.name.startswith(".tmp") for p in left), left
    assert records.partial_files(tmp_path / "run") == sorted(left)
