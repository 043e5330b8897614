"""bench.eval_cost part (a) on the micro backbone at three rounds: retained KL against one plain forward, the target
as the ratio of the median rounds and from paired rounds, with the interval of their median and its verdict."""

import json

import pytest

from bench import eval_cost
from bench.common import interval_verdict


@pytest.mark.slow
def test_the_kl_target_also_from_paired_rounds(tmp_path):
    out = tmp_path / "eval_cost.json"
    eval_cost.main(["--shape", "micro", "--parts", "a", "--repeats", "3", "--warmup", "0",
                    "--kl-max-seqs", "96", "--atlas-cache", str(tmp_path / "atlas"), "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["complete"] and payload["sweep"] is None
    (result,) = payload["kl_vs_forward"]
    assert result["sequences"] == 96  # of micro's 500 retained evaluation sequences, spread over both domains
    target = result["target"]
    mode = result["reference_mode_at_default_budget"]
    assert target["ratio"] == f"kl_{mode}/forward" and target["limit"] == 1.3
    variants = result["variants"]
    assert target["value"] == variants[f"kl_{mode}"]["median_s"] / variants["forward"]["median_s"]
    assert len(target["per_round"]) == 3 and target["median_of_rounds"] == sorted(target["per_round"])[1]
    assert target["interval"]["coverage"] == 0.75
    assert target["by_rounds"] == interval_verdict(target["interval"], 1.3, at_least=False)


def test_a_bad_sequence_cap_is_refused_before_any_work():
    with pytest.raises(SystemExit, match="--kl-max-seqs 0: must be >= 1"):
        eval_cost.main(["--parts", "a", "--kl-max-seqs", "0"])
