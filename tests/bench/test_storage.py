"""bench.storage: atlas + adapter against LoRA from the backbones' shapes alone (the upper bound, every filter at its
cap), and at micro from the exported files of real atlases."""

from __future__ import annotations

import json

import pytest

from atlas.footprint import footprint
from bench import storage
from suite_schema import registry


def test_estimates_follow_the_footprint_and_the_storage_target_is_judged_at_the_default(tmp_path, capsys):
    out = tmp_path / "storage.json"
    payload = storage.main(["--no-measure", "--backbones", "micro,qwen3-8b", "--settings", "16:8:32,4:2", "--out",
                            str(out)])
    assert payload["default_setting"] == {"num_centers": 16, "filter_rank": 8, "filter_basis": 32}
    assert len(payload["estimates"]) == 4 and payload["measured_micro"] == []
    for e in payload["estimates"]:
        bb = registry.group_values("backbone", e["backbone"])
        ref = footprint(bb["shapes"], e["rank"], e["num_centers"], e["filter_rank"], list(bb["target_modules"]),
                        bytes_per_value=1, filter_basis=e["filter_basis"])
        assert e["ratio_same_dtype"] == ref["ratio_to_lora"] and e["lora_params"] == ref["lora_params"]
        assert e["ratio_as_stored"] == (e["atlas_bytes"] + e["adapter_bytes"]) / e["adapter_bytes"] > 1
    target = payload["target"]
    assert (target["default_ratio_as_stored"] <= 2.0) == ("K=16 R=8 P=32" in target["settings_meeting_as_stored"])
    assert json.loads(out.read_text())["estimates"] == payload["estimates"]
    assert "qwen3-8b target x LoRA <= 2.0" in capsys.readouterr().out


def test_a_malformed_setting_is_refused():
    with pytest.raises(SystemExit, match="K:R or K:R:P"):
        storage.parse_settings("16:8,16")


@pytest.mark.slow
def test_micro_exports_of_real_atlases_are_measured(tmp_path):
    payload = storage.main(["--backbones", "micro", "--settings", "4:2", "--out", str(tmp_path / "s.json")])
    [measured] = payload["measured_micro"]
    assert measured["atlas_plus_adapter_bytes"] == measured["atlas_bytes"] + measured["adapter_bytes"]
    assert 1.0 < measured["ratio_as_stored"] and 0 < measured["mean_filter_rank"] <= 2
