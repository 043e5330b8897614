"""The method matrix: one row per method that trains (ATLAS, the baselines and the methods beyond the paper), with
what its record must show against LoRA's. Every method through the one training loop on the tiny backbone: the loss
falls, the export reloads onto a fresh base with the same outputs, post-hoc scale 0 is the base; and one CLI sweep
writes a complete record per method, each as its row says. Adding a method adds its row here (a registered method
without one fails `test_every_trained_method_has_a_row`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from experiments.backbones import model_summary
from experiments.config import train_config
from experiments.methods import build_named
from experiments.train import train
from suite_schema import registry
from suite_schema.layout import RECORD_NAME
from tests.baselines.baseline_helpers import (
    fresh_base,
    logits_of,
    prepared,
    sft_loss,
    target_batch,
)
from tests.conftest import run_cli, tiny_overrides


@dataclass(frozen=True)
class Row:
    """What one method's record shows next to LoRA's on the same tiny run: method-specific `costs` that are > 0, its
    trainable parameters and stored bytes as a factor range of LoRA's (`None`: not compared), and the least stored
    bytes per trainable parameter."""

    costs: tuple[str, ...] = ()
    trainable: Optional[tuple[float, float]] = (1.0, 1.0)
    stored: Optional[tuple[float, float]] = (1.0, 1.0)
    stored_per_trainable: float = 0.0


SAME, MORE, FEWER = (1.0, 1.0), (1.0 + 1e-9, float("inf")), (0.0, 1.0 - 1e-9)
MATRIX = {
    "atlas": Row(costs=("atlas_build_seconds", "atlas_bytes", "adapter_bytes"), stored=MORE),  # + the atlas
    "lora": Row(),
    "olora": Row(costs=("basis_build_seconds",)),
    "replay": Row(costs=("replay_pool_size",)),
    "ewc": Row(costs=("fisher_build_seconds",)),
    "lwf": Row(),
    "lwf_retained": Row(),
    # the converted update for the true W0: a rank-2r LoRA [B | B0], [A ; -A0]
    "corda": Row(costs=("covariance_build_seconds",), stored=(1.5, 2.5)),
    "inflora": Row(trainable=FEWER, stored=None),  # A frozen: only B trains
    "milora": Row(costs=("svd_seconds",), stored=(1.5, 2.5)),
    "pissa": Row(costs=("svd_seconds",), stored=(1.5, 2.5)),
    "dora": Row(trainable=MORE, stored=MORE),  # + a magnitude per output feature
    "loranull": Row(costs=("null_space_build_seconds",), stored=(1.5, 2.5)),  # both factors train: rank-2r export
    # every adapted weight trains and is stored whole (float32)
    "fullft": Row(costs=("w0_copy_bytes",), trainable=(2.0, float("inf")), stored=MORE, stored_per_trainable=4.0),
}
METHODS = list(MATRIX)


def test_every_trained_method_has_a_row():
    assert sorted(MATRIX) == sorted(registry.trained_methods()), \
        f"add a Row to MATRIX for {sorted(set(registry.trained_methods()) - set(MATRIX))}"


def reload(name: str, tiny, export_dir):
    """The export on a freshly loaded base, through the method's own `load_export`."""
    return type(build_named(name)).load_export(fresh_base(tiny), export_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_trains_loss_falls_exports_reloads_and_scales_to_the_base(name, tiny, tmp_path):
    model, method, ctx = prepared(tiny, name, tmp_path / "run")
    trainable = model_summary(model)["params_trainable"]
    # Full fine-tuning trains every adapted weight: most of the tiny model (all but embeddings and norms).
    assert 0 < trainable < model_summary(model)["params_total"] / (1 if name == "fullft" else 2)
    probe = target_batch(tiny)
    base_logits = logits_of(fresh_base(tiny), probe)
    before = sft_loss(model, probe)
    result = train(model, method, tiny.examples, ctx, train_config(steps=20, lr=5e-2, batch_size=4, grad_accum=2,
                   checkpoint_every=100, progress=False))
    after = sft_loss(model, probe)
    print(f"{name}: trainable {trainable}, SFT loss {before:.3f} -> {after:.3f}, step losses "
          f"{result.losses[0]:.3f} -> {result.losses[-1]:.3f}")
    assert len(result.losses) == 20 and all(map(torch.isfinite, torch.tensor(result.losses)))
    assert after < before - 0.1, (before, after)

    stored = method.export(model, tmp_path / "export")
    assert stored > 0 and stored == sum(p.stat().st_size for p in (tmp_path / "export").iterdir()
                                        if p.suffix == ".safetensors")
    trained = logits_of(model, probe)
    again = logits_of(reload(name, tiny, tmp_path / "export"), probe)
    # CorDA, MiLoRA, PiSSA and LoRA-Null rewrite W0 in training (W_res + s B A) and export the converted update for
    # the true W0 (W0 + D): the same function, different float32 rounding (`exact_export = False`). Every other
    # export holds exactly the trained tensors on the unmodified base.
    if type(method).exact_export:
        assert torch.equal(again, trained)
    else:
        torch.testing.assert_close(again, trained, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(trained, base_logits, atol=1e-3)

    method.scale(model, 0.0)
    torch.testing.assert_close(logits_of(model, probe), base_logits, rtol=1e-4, atol=1e-4)
    method.scale(model, 1.0)
    torch.testing.assert_close(logits_of(model, probe), trained, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_one_cli_sweep_writes_a_complete_record_per_method(tiny_backbone_dir, tiny_benchmark_dir, tmp_path):
    """`python run.py -m method=<all>` (one process, Hydra's sequential launcher): a complete record each."""
    run_root = tmp_path / "runs"
    args = ["-m", f"method={','.join(METHODS)}", "logger=none",
            *tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, run_root, tmp_path / "cache",
                            **{"train.steps": "3", "train.checkpoint_every": "3"})]
    proc = run_cli(args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    records = {}
    for path in run_root.glob(f"*/{RECORD_NAME}"):
        rec = json.loads(path.read_text())
        records[rec["method"]] = rec
    assert set(records) == set(METHODS), sorted(records)
    for name, rec in records.items():
        assert rec["status"] == "complete", (name, rec.get("error"))
        assert rec["train"]["steps"] == 3 and len(rec["train"]["losses"]) == 3
        cost = rec["cost"]
        assert cost["trainable_params"] > 0 and cost["stored_bytes"] > 0 and cost["train_seconds"] > 0, name
        assert set(rec["metrics"]["retained_near"]) == {"math", "commonsense"}
        assert rec["metrics"]["retained_kl_mean"] >= 0 and "pass@1" in rec["metrics"]["target"]
    lora = records["lora"]["cost"]
    for name, row in MATRIX.items():
        cost = records[name]["cost"]
        assert all(cost[key] > 0 for key in row.costs), (name, {key: cost.get(key) for key in row.costs})
        for field, bounds in (("trainable_params", row.trainable), ("stored_bytes", row.stored)):
            if bounds is not None:
                ratio = cost[field] / lora[field]
                assert bounds[0] <= ratio <= bounds[1], (name, field, ratio, bounds)
        assert cost["stored_bytes"] >= row.stored_per_trainable * cost["trainable_params"], name
