"""Adding a method takes its module, its config file and its test file (and a docs section): a toy "scaled LoRA"
defined in tests/experiments/toy_method.py and a config written into a Hydra search-path folder trains, evaluates
and writes a complete record through `python run.py method=scaled_lora`, with its hyperparameters validated
before any compute, and analysis shows it without being told about it."""

from __future__ import annotations

import json

import pytest

from analysis.methods import EXTRA_COLORS, EXTRA_MARKERS, label, style
from tests.conftest import run_cli, tiny_overrides

CONFIG = """\
_target_: tests.experiments.toy_method.ScaledLoRA
name: scaled_lora
rank: 4
alpha: 8
dropout: 0.0
target_modules: null
output_scale: 0.5
display: {label: "Scaled LoRA", group: extended, order: 9, color: "#123456", marker: "o", data: "target only"}
"""


@pytest.mark.slow
def test_a_toy_method_runs_end_to_end_from_its_module_and_config(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    conf = tmp_path / "conf"
    (conf / "method").mkdir(parents=True)
    (conf / "method" / "scaled_lora.yaml").write_text(CONFIG)
    run_root = tmp_path / "runs"
    args = ["method=scaled_lora", f"hydra.searchpath=[file://{conf}]",
            *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, run_root, tmp_path / "cache",
                            **{"train.steps": "2", "train.checkpoint_every": "2"})]
    proc = run_cli(args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    [record_path] = run_root.glob("*/record.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "complete" and record["method"] == "scaled_lora"
    assert record["knobs"]["output_scale"] == 0.5 and "display" not in record["config"]["method"]
    assert (record_path.parent / "run.log").read_text().count("[run]") >= 2
    # a bad value of the new knob is refused before any compute, naming the key
    bad = run_cli([*args, "method.output_scale=-1"], timeout=300)
    assert bad.returncode == 2 and "method.output_scale=-1" in bad.stderr
    # analysis has a stable style and a label for a method it has never seen
    assert label("scaled_lora") == "scaled_lora"
    assert style("scaled_lora").color in EXTRA_COLORS and style("scaled_lora").marker in EXTRA_MARKERS
