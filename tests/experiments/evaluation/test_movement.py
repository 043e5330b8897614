"""`python -m experiments.evaluation.movement`: per-token KL(base || trained) on held-out retained and target tokens.
On retained tokens it is what the evaluation's retained KL measures (the base's responses), so a trained run's
figures must equal its record's; a model against itself moves nothing; a run without an export is refused."""

import json

import pytest

from experiments.evaluation.movement import main, movement, token_kl
from suite_schema.layout import RECORD_NAME
from tests.conftest import run_cli, tiny_overrides


def test_a_model_against_itself_moves_nothing(tiny):
    from experiments.backbones import load_backbone
    from experiments.calibration import pair_example, reference_pairs

    model, tok = load_backbone(tiny.cfg.backbone)
    seqs = [pair_example(p) for p in reference_pairs(tiny.reference, split="evaluation")][:6]
    kl = token_kl(model, model, seqs, tok.pad_token_id, batch_size=4)
    assert len(kl) == sum(sum(1 for t in s["labels"] if t != -100) for s in seqs) and float(kl.abs().max()) < 1e-6


@pytest.mark.slow
def test_a_trained_run_moves_retained_tokens_as_its_record_says(tiny_backbone_dir, tiny_benchmark_dir, tmp_path, capsys):
    cache = tmp_path / "cache"
    ov = tiny_overrides(tiny_backbone_dir, tiny_benchmark_dir, tmp_path / "runs", cache,
                        **{"train.steps": "12", "train.lr": "0.02", "++eval.logprob_dtype": "float32"})
    done = run_cli(["method=lora", *ov])
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = next((tmp_path / "runs").rglob(RECORD_NAME)).parent
    record = json.loads((run_dir / RECORD_NAME).read_text())
    res = movement(run_dir, cache_dir=str(cache))
    assert set(res["kl"]) == {*record["metrics"]["retained_near"], "target"}
    for domain, metrics in record["metrics"]["retained_near"].items():
        assert res["kl"][domain] == pytest.approx(metrics["kl_token_mean"], rel=1e-3, abs=1e-5), domain
    assert res["kl"]["target"] > 0 and res["selectivity"] > 0
    assert main([str(run_dir), "--cache-dir", str(cache)]) == 0
    assert "selectivity" in capsys.readouterr().out


def test_a_run_without_export_is_refused(tmp_path, capsys):
    (tmp_path / RECORD_NAME).write_text(json.dumps({"run_id": "x", "status": "complete", "config": {}}))
    assert main([str(tmp_path)]) == 2
    assert "no export/" in capsys.readouterr().err
