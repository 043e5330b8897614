"""Adding a method is four files (docs/baselines.md, "Adding a method"): in a copy of the repository, a LoRA variant
added as its module, its conf/method file, its row in the method matrix and its line in the method table passes the
tests whose cases are the registered methods (the method matrix, the method table, every method with every backbone,
the unknown-method message, the presets checked against the registry, the dependency scan), and trains, exports,
scales and records through `run.py` like every other method. Without its matrix row the matrix says what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

NAME = "scaled_lora"
MODULE = (REPO / "tests" / "experiments" / "toy_method.py").read_text()  # Scaled LoRA
CONFIG = f"""# Scaled LoRA: LoRA whose update is multiplied by output_scale.
defaults:
  - lora
  - _self_
_target_: baselines.{NAME}.ScaledLoRA
name: {NAME}
output_scale: 0.5
display: {{label: "Scaled LoRA", group: extended, order: 9, color: "#123456", marker: "o", data: "target only"}}
"""
ROW = f'    "{NAME}": Row(),\n'
LINE = f"| `{NAME}` | extended | `baselines/{NAME}.py` | LoRA with its update scaled by `output_scale` |\n"
# The tests whose cases are the registered methods (or the conf/method files), in a copy with the new method; of the
# parametrized ones only the new method's cases: the others run in the suite itself, and adding a method changes none.
# The preset tests that compose whole presets are left out: every preset names its methods, so a new one is in none.
TESTS = ["tests/baselines/test_baseline_matrix.py", "tests/docs/test_docs_methods.py", "tests/test_dependencies.py",
         "tests/experiments/test_config.py::test_every_method_and_backbone_composes_and_validates",
         "tests/experiments/test_config.py::test_unknown_method_lists_valid_names",
         "tests/experiments/test_presets.py::test_defaults_preset_runs_each_method_once_at_its_defaults",
         "tests/experiments/test_presets.py::test_ablation_presets_run_atlas_and_each_of_its_variants_alike"]
PER_METHOD = ("trains_loss_falls_exports_reloads_and_scales_to_the_base", "composes_and_validates")


def copy_repository(dst: Path) -> Path:
    """The repository's files (tracked and untracked, not ignored) copied to `dst`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def add_method(root: Path, row: bool = True) -> None:
    """The four files of a new method: module, config, matrix row (unless `row` is False), method-table line."""
    (root / "baselines" / f"{NAME}.py").write_text(MODULE)
    (root / "conf" / "method" / f"{NAME}.yaml").write_text(CONFIG)
    matrix = root / "tests" / "baselines" / "test_baseline_matrix.py"
    text = matrix.read_text()
    assert "MATRIX = {\n" in text
    if row:
        matrix.write_text(text.replace("MATRIX = {\n", "MATRIX = {\n" + ROW, 1))
    docs = root / "docs" / "baselines.md"
    text = docs.read_text()
    anchor = "| `atlas_global` |"
    assert anchor in text
    docs.write_text(text.replace(anchor, LINE + anchor, 1))


def pytest_in(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_SILENT": "true", "ATLAS_CACHE_DIR": str(root.parent / "cache")}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_method_in_four_files_passes_every_registry_driven_test(tmp_path):
    root = copy_repository(tmp_path / "repo")
    add_method(root)
    selected = " and ".join(f"not {t}" for t in PER_METHOD)
    proc = pytest_in(root, "-v", *TESTS, "-k", f"({selected}) or {NAME}", timeout=3000)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    for test in (f"test_trains_loss_falls_exports_reloads_and_scales_to_the_base[{NAME}] PASSED",
                 "test_one_cli_sweep_writes_a_complete_record_per_method PASSED",
                 f"test_every_method_and_backbone_composes_and_validates[{NAME}-qwen3-8b] PASSED",
                 "test_unknown_method_lists_valid_names PASSED",
                 "test_the_method_table_lists_every_registered_method_with_its_group_and_module PASSED"):
        assert test in proc.stdout, test


def test_a_method_without_its_matrix_row_is_named_by_the_matrix(tmp_path):
    root = copy_repository(tmp_path / "repo")
    add_method(root, row=False)
    proc = pytest_in(root, "tests/baselines/test_baseline_matrix.py::test_every_trained_method_has_a_row",
                     timeout=600)
    assert proc.returncode == 1 and f"add a Row to MATRIX for ['{NAME}']" in proc.stdout, proc.stdout[-3000:]
