"""bench.decode on the micro backbone at two rounds of a short `generate`: the target ratio (atlas/lora at batch 1)
as the ratio of the medians and paired per round, with the interval of the rounds' median and its verdict."""

import json

import pytest

from bench import decode
from bench.common import interval_verdict


@pytest.mark.slow
def test_the_target_ratio_per_round_and_its_interval(tmp_path):
    out = tmp_path / "decode.json"
    decode.main(["--shape", "micro", "--variants", "base,lora,atlas", "--batch-sizes", "1,2", "--new-tokens", "2",
                 "--prompt-len", "4", "--repeats", "3", "--warmup", "0", "--atlas-cache", str(tmp_path / "atlas"),
                 "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["complete"] and payload["target"] == "atlas/lora <= 1.15 at batch 1"
    batches = {b["batch_size"]: b for b in payload["results"][0]["batches"]}
    assert "target" not in batches[2]  # the target is at batch 1 only
    target, variants = batches[1]["target"], batches[1]["variants"]
    assert target["value"] == variants["atlas"]["median_s"] / variants["lora"]["median_s"]
    assert target["met"] == (target["value"] <= 1.15)
    per_round = target["per_round"]
    assert len(per_round) == 3
    # each round's ratio is one atlas call over one lora call, so it lies between the extreme calls' ratios
    atlas, lora = variants["atlas"]["all_s"], variants["lora"]["all_s"]
    assert min(per_round) >= min(atlas) / max(lora)
    assert max(per_round) <= max(atlas) / min(lora)
    assert target["median_of_rounds"] == sorted(per_round)[1]
    # three rounds: the interval is their range (coverage 1 - 2/8)
    assert target["interval"]["low"] == min(per_round) and target["interval"]["high"] == max(per_round)
    assert target["interval"]["coverage"] == pytest.approx(0.75)
    assert target["by_rounds"] == interval_verdict(target["interval"], 1.15, at_least=False)
