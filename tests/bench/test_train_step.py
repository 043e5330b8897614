"""bench.train_step on the micro backbone at one repeat: the full fine-tuning variant trains its own weights
(never the ones the adapter variants share), and the result carries each variant's throughput share of it."""

import json

import pytest
import torch

from bench import train_step
from bench.common import Settings, interval_verdict, load_preset, train_batch


def test_full_fine_tuning_trains_a_private_copy_and_leaves_the_shared_weights_alone(tmp_path):
    st = Settings(torch.device("cpu"), None, 0, None, tmp_path)
    bb = load_preset("micro", st)
    before = {n: p.detach().clone() for n, p in bb.model.named_parameters()}
    batch = train_batch(bb, 4, 64, 0)
    full, full_params = train_step.build_variant("fullft", bb, st)
    lora, lora_params = train_step.build_variant("lora", bb, st)
    assert len(full_params) == len(list(bb.model.parameters())) and all(p.requires_grad for p in full_params)
    assert 0 < sum(p.numel() for p in lora_params) < sum(p.numel() for p in full_params) / 10
    for step in (train_step.make_step(full, full_params, batch), train_step.make_step(lora, lora_params, batch)):
        step()
    moved = dict(full.named_parameters())
    assert any(not torch.equal(moved[n], before[n]) for n in before)  # full fine-tuning changed its copy
    for n, p in bb.model.named_parameters():  # ... and nothing that the adapter variants read
        assert torch.equal(p, before[n]), n


def test_result_has_each_variants_share_of_full_fine_tuning(tmp_path):
    out = tmp_path / "train_step.json"
    train_step.main(["--shape", "micro", "--variants", "fullft,lora", "--repeats", "2", "--warmup", "0",
                     "--batch", "4", "--out", str(out)])
    result = json.loads(out.read_text())["results"][0]
    v = result["variants"]
    assert v["fullft"]["share_of_fullft_throughput"] == 1.0
    assert v["lora"]["share_of_fullft_throughput"] == v["fullft"]["median_s"] / v["lora"]["median_s"]
    assert result["ratios"]["lora/fullft"] == v["lora"]["median_s"] / v["fullft"]["median_s"]
    assert 0 < result["batch"]["real_token_share"] <= 1
    assert v["lora"]["tokens_per_s"] == result["batch"]["tokens"] / v["lora"]["median_s"]


@pytest.mark.slow
def test_the_target_ratio_also_from_paired_rounds(tmp_path):
    out = tmp_path / "train_step.json"
    train_step.main(["--shape", "micro", "--variants", "lora,atlas", "--repeats", "3", "--warmup", "0",
                     "--batch", "2", "--seq", "32", "--atlas-cache", str(tmp_path / "atlas"), "--out", str(out)])
    result = json.loads(out.read_text())["results"][0]
    target, v = result["target"], result["variants"]
    assert target["value"] == v["atlas"]["median_s"] / v["lora"]["median_s"] and target["limit"] == 1.25
    assert len(target["per_round"]) == 3 and target["median_of_rounds"] == sorted(target["per_round"])[1]
    interval = target["interval"]
    assert interval["low"] == min(target["per_round"]) and interval["high"] == max(target["per_round"])
    assert target["by_rounds"] == interval_verdict(target["interval"], 1.25, at_least=False)
