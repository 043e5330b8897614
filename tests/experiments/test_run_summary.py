"""The `[result]` lines a finished run prints: its numbers, read from its record."""

from __future__ import annotations

from pathlib import Path

from experiments.run_summary import summary_lines


def _record(far: bool) -> dict:
    near = {"math": {"kl_token_mean": 0.0801, "answer_change_rate": {"rate": 0.5, "n": 250}},
            "commonsense": {"kl_token_mean": 0.4196, "choice_flip_rate": {"rate": 0.068, "n": 162}}}
    metrics = {"target": {"pass@1": 0.5606, "n_problems": 132}, "retained_near": near, "retained_kl_mean": 0.2471}
    if far:
        metrics["retained_far"] = {"math": {"kl_token_mean": 0.0957, "answer_change_rate": {"rate": 0.628, "n": 250}},
                                   "commonsense": {"kl_token_mean": 0.3929, "choice_flip_rate": {"rate": 0.078, "n": 129}}}
    return {"metrics": metrics, "cost": {"train_seconds": 169.4, "eval_seconds": 21.5}}


def test_near_and_far_numbers_per_domain():
    lines = summary_lines(_record(True), Path("runs/x/record.json"))
    assert lines == [
        "pass@1 0.5606 on 132 problems; retained KL 0.2471 nats/token (mean of near and far)",
        "  math         near KL 0.0801, far KL 0.0957, answers changed 50.0% near, 62.8% far",
        "  commonsense  near KL 0.4196, far KL 0.3929, choices flipped 6.8% near, 7.8% far",
        "train 169 s, eval 22 s; record runs/x/record.json",
    ]


def test_earlier_records_without_far_items_or_costs():
    record = _record(False)
    record["metrics"]["retained"] = record["metrics"].pop("retained_near")
    del record["cost"]
    lines = summary_lines(record, Path("r.json"))
    assert lines[0].endswith("(mean over domains)") and "far" not in " ".join(lines)
    assert lines[-1] == "record r.json"


def test_a_sweep_table_row_per_run_with_dashes_where_a_run_has_no_number():
    from experiments.run_summary import summary_row, table_lines

    done = dict(_record(True), status="complete")
    row = summary_row(done)
    assert row == {"pass@1": 0.5606, "KL": 0.2471, "math KL": 0.0801, "math far KL": 0.0957, "math changed": 0.5,
                   "commonsense KL": 0.4196, "commonsense far KL": 0.3929, "commonsense changed": 0.068,
                   "train s": 169.4, "eval s": 21.5}
    assert summary_row(dict(done, status="failed")) == {} and summary_row(None) == {}
    lines = table_lines([("method=atlas", row), ("method=lora", {})])
    assert len(lines) == 3 and lines[0].split() == ["pass@1", "KL", "math", "KL", "math", "far", "KL", "math",
                                                    "changed", "commonsense", "KL", "commonsense", "far", "KL",
                                                    "commonsense", "changed", "train", "s", "eval", "s"]
    assert lines[1].split() == ["method=atlas", "0.5606", "0.2471", "0.0801", "0.0957", "50.0%", "0.4196", "0.3929",
                                "6.8%", "169", "22"]
    assert lines[2].split() == ["method=lora"] + ["-"] * 10
    assert table_lines([("a", {}), ("b", {})]) == []
