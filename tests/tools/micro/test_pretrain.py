"""The micro pretraining recipe (a few steps of a tiny model) and the shipped micro backbone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.micro import pretrain, quick_eval

REPO = Path(__file__).resolve().parents[3]
BACKBONE = REPO / "assets" / "micro" / "backbone"
DATA = REPO / "assets" / "micro" / "data"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny") / "model"
    log = pretrain.run(out, pretrain.tiny_recipe(seed=1, steps=6))
    return out, log


@pytest.mark.slow
def test_tiny_recipe_writes_a_loadable_hf_folder(tiny_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out, log = tiny_run
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
                 "pretrain_log.json", "loss_curve.png"):
        assert (out / name).is_file(), name
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok.eos_token == pretrain.EOS_TOKEN and tok.pad_token == pretrain.PAD_TOKEN
    gen = GenerationConfig.from_pretrained(out)
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    assert log["steps_done"] == 6 and len(log["loss_history"]) == 6
    assert json.loads((out / "pretrain_log.json").read_text())["params"] == sum(p.numel() for p in model.parameters())
    assert set(log["final_checks"]) == {"dev", "test"} and log["quick_checks"]
    assert all("code_pass@1" in c and c["split"] == s for s, c in log["final_checks"].items())
    assert all(c["split"] == "dev" for c in log["quick_checks"])  # no look at test while training
    ids = tok("Question: Tom has 3 apples.", return_tensors="pt")["input_ids"]
    new = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert new.shape[1] == ids.shape[1] + 4 or int(new[0, -1]) == tok.eos_token_id


def test_tokenizer_splits_digits_and_round_trips_code(tiny_run):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_run[0])
    ids = tok("1234", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4"]
    code = 'def f(n: int) -> int:\n    """Doc.\n    """\n    if n >= 12:\n        return True\n\treturn  n - 7\n'
    assert tok.decode(tok(code, add_special_tokens=False)["input_ids"]) == code


@pytest.mark.slow
def test_same_seed_same_run(tiny_run, tmp_path):
    out, log = tiny_run
    log2 = pretrain.run(tmp_path / "again", pretrain.tiny_recipe(seed=1, steps=6))
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "again" / "tokenizer.json").read_bytes()
    assert [h["loss"] for h in log["loss_history"]] == [h["loss"] for h in log2["loss_history"]]


def test_learning_rate_schedule():
    r = pretrain.Recipe(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert pretrain.lr_at(0, r) == pytest.approx(1e-4)
    assert pretrain.lr_at(9, r) == pytest.approx(1e-3)
    assert pretrain.lr_at(99, r) == pytest.approx(1e-4, rel=0.01)
    assert pretrain.lr_at(50, r) < pretrain.lr_at(20, r)


@pytest.mark.slow
def test_command_line_tiny_run(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tools.micro.pretrain", "--tiny", "--steps", "3", "--out", str(tmp_path / "m")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "m" / "pretrain_log.json").read_text())["steps_done"] == 3


def test_extract_number():
    assert quick_eval.extract_number("Tom has 3 + 4 = 7 apples.\n#### 7") == "7"
    assert quick_eval.extract_number("it is 12 then 15") == "15"
    assert quick_eval.extract_number("no number") is None


@pytest.mark.slow
def test_shipped_backbone_loads_and_answers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert BACKBONE.is_dir(), "the micro backbone is shipped in assets/micro/backbone"
    size = sum(p.stat().st_size for p in BACKBONE.iterdir())
    assert size <= 25 * 2**20
    tok = AutoTokenizer.from_pretrained(BACKBONE)
    model = AutoModelForCausalLM.from_pretrained(BACKBONE)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n_params <= 4_000_000
    torch.set_num_threads(2)
    items = [json.loads(line) for line in (DATA / "math" / "dev.jsonl").read_text().splitlines()[:20]]
    res = quick_eval.math_exact_match(model, tok, items)
    assert all("####" in r for r in res["responses"])
    assert res["exact_match"] >= 0.5
