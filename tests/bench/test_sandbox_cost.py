"""bench.sandbox_cost: the sandbox's checks against one bare interpreter per program, on the same problems."""

from __future__ import annotations

import json

import pytest

from bench import sandbox_cost


def test_the_micro_suite_is_the_benchmark_s_test_split():
    items = sandbox_cost.problems("micro")
    assert len(items) == 132 and all({"prompt", "canonical_solution", "test", "entry_point"} <= set(p) for p in items)
    with pytest.raises(SystemExit, match="--limit 0: must be >= 1"):
        sandbox_cost.main(["--limit", "0"])


@pytest.mark.slow
@pytest.mark.sandbox
def test_both_variants_pass_every_check_and_the_ratio_is_measured_in_one_process(tmp_path, capsys):
    out = tmp_path / "cost.json"
    sandbox_cost.main(["--limit", "3", "--repeats", "1", "--warmup", "0", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["n_checks"] == 3 and set(result["variants"]) == {"one_process", "sandbox"}
    assert result["ratio_sandbox_over_one_process"] == (result["variants"]["sandbox"]["median_s"]
                                                       / result["variants"]["one_process"]["median_s"])
    assert "sandbox / one_process = " in capsys.readouterr().out
