"""bench.throughput on the micro backbone at one round of one step: every method through the suite's own loop, its
tokens/s as a share of plain full fine-tuning, and the frozen floor; the plain reference trains its own weights."""

import json

import pytest
import torch

from bench import throughput


def test_shares_of_plain_full_fine_tuning_and_the_frozen_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "throughput.json"
    throughput.main(["--methods", "lora", "--groups", "3,1", "--steps", "1", "--repeats", "1", "--warmup", "0",
                     "--floor", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["complete"]
    rows = {(r["method"], r["length_groups"]): r for r in payload["results"]}
    assert set(rows) == {("plain", None), ("frozen", 3), ("frozen", 1), ("lora", 3), ("lora", 1)}
    plain = rows[("plain", None)]
    assert plain["share_of_plain"] == 1.0 and plain["tokens"] % 16 == 0  # dense rows of 16
    for key, r in rows.items():
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["median_s"])
        assert r["share_of_plain"] == pytest.approx(r["tokens_per_s"] / plain["tokens_per_s"])
    # the same examples in either layout: the same real tokens
    assert rows[("lora", 3)]["tokens"] == rows[("lora", 1)]["tokens"] == rows[("frozen", 3)]["tokens"]
    assert rows[("lora", 3)]["target"] == {"share_of_plain": 1.0, "met": rows[("lora", 3)]["share_of_plain"] >= 1.0}


def test_plain_reference_trains_a_private_copy(tmp_path):
    from experiments.backbones import load_backbone
    from bench.common import micro_backbone_config

    model, _ = load_backbone(micro_backbone_config())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    examples = [{"input_ids": list(range(2, 40)), "labels": list(range(2, 40))} for _ in range(4)]
    plain = throughput.PlainFullFT(model, examples, batch_size=2, lr=1e-3, seed=0)
    tokens, seconds = plain.run(1, None)
    assert tokens == 76 and seconds > 0  # 2 examples of 38 tokens, cut into 2 dense rows of 38
    assert any(not torch.equal(p, before[n]) for n, p in plain.model.named_parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_bad_groups_are_refused_before_any_work():
    with pytest.raises(SystemExit, match="--groups"):
        throughput.main(["--groups", "0"])
    with pytest.raises(SystemExit, match="not in conf/method"):
        throughput.main(["--methods", "nosuch"])
    with pytest.raises(SystemExit, match="--steps 0: must be >= 1"):
        throughput.main(["--steps", "0"])
