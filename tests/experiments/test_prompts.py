"""The one tokenisation rule: prompts are cut before their trailing whitespace in pretraining,
fine-tuning, generation and scoring alike, so evaluation prompts the model as it was trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments import prompts as P
from experiments.evaluation.generation import encode_prompts, generate
from tools.micro import pretrain, quick_eval
from tools.micro import world as micro

REPO = Path(__file__).resolve().parents[2]
BACKBONE = REPO / "assets" / "micro" / "backbone"
DATA = REPO / "assets" / "micro" / "data"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BACKBONE)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    """(prompt, response) of every committed micro split, rendered with the shared templates."""
    out = [(P.code_instruction_prompt(t), t["response"]) for t in json.loads((DATA / "code" / "train.json").read_text())]
    for split in ("dev", "test"):
        out += [(P.code_problem_prompt(p), p["canonical_solution"]) for p in _jsonl(DATA / "code" / f"{split}.jsonl")]
    for split in ("calibration", "dev", "test"):
        out += [(P.math_prompt(m), P.math_response(m)) for m in _jsonl(DATA / "math" / f"{split}.jsonl")]
        for rec in _jsonl(DATA / "commonsense" / f"{split}.jsonl"):
            item = quick_eval.csqa_to_choice(rec)
            out += [(P.choice_prompt(item), P.choice_continuation(c)) for c in item["choices"]]
    return out


def test_split_boundary_moves_trailing_whitespace_to_the_response():
    assert P.split_boundary("### Response:\n", "    return 1\n") == ("### Response:", "\n    return 1\n")
    assert P.split_boundary("Answer:", " 5") == ("Answer:", " 5")
    assert P.split_boundary("a \t\n") == ("a", " \t\n")
    assert P.response_text("### Response:\n", "\n    return 1") == "    return 1"
    assert P.response_text("### Response:\n", "    return 1") == "    return 1"  # no lead generated: unchanged
    assert P.response_text("Answer:", " 5") == " 5"


@pytest.mark.slow
def test_evaluation_prompt_tokens_equal_training_tokens_at_the_same_boundary(tok, pairs):
    """The acceptance check: for every committed item, the prompt tokens generation and scoring feed
    the model are exactly the prompt tokens of the fine-tuning example and of a pretraining document,
    and prompt + response tokens equal the tokens of the whole text (how pretraining reads text)."""
    prompts = [p for p, _ in pairs]
    eval_ids = encode_prompts(tok, prompts)
    mismatched = []
    for (prompt, response), ids in zip(pairs, eval_ids):
        example = P.encode_pair(tok, prompt, response, max_length=4096)
        n_prompt = example["labels"].count(-100)
        document = pretrain.encode_document(tok, prompt, response)
        whole = P.encode_text(tok, prompt + response) + [tok.eos_token_id]
        if not (example["input_ids"][:n_prompt] == ids == document[:n_prompt]
                and example["input_ids"] == document == whole):
            mismatched.append(prompt[-40:])
    assert len(pairs) > 4000
    assert mismatched == []


def test_the_old_rule_would_prompt_with_a_token_training_never_has_there(tok, pairs):
    """Tokenising a code prompt with its final newline (the old rule) ends it in a lone newline
    token, which is not a prefix of the whole text's tokens: the rule above is what fixes it."""
    code = [(p, r) for p, r in pairs if p.endswith("### Response:\n")]
    assert code
    broken = sum(P.encode_text(tok, p) != P.encode_text(tok, p + r)[: len(P.encode_text(tok, p))] for p, r in code)
    assert broken == len(code)


def test_the_base_reaches_its_pretraining_behaviour_when_prompted_as_evaluation_prompts(tok):
    """Pretrain-family problems in training style are what pretraining taught: prompted through the
    evaluation's generation, the shipped backbone writes their bodies; prompted the old way it does not."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(BACKBONE)
    train = json.loads((DATA / "code" / "train.json").read_text())
    items = [t for t in train if micro.code_family_of_prompt(t["input"]) in micro.PRETRAIN_FAMILIES][:40]
    prompts = [P.code_instruction_prompt(t) for t in items]
    texts = generate(model, tok, prompts, max_new_tokens=40, batch_size=20).texts
    exact = sum(text.split("\n\n")[0].rstrip() == t["response"].rstrip() for text, t in zip(texts, items))
    # the old rule: the prompt tokenised with its trailing newline
    old = []
    for prompt in prompts:
        ids = torch.tensor([P.encode_text(tok, prompt)])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        old.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    exact_old = sum(text.split("\n\n")[0].rstrip() == t["response"].rstrip() for text, t in zip(old, items))
    assert exact >= 0.7 * len(items), (exact, texts[:3])
    assert exact_old <= exact - 0.4 * len(items), (exact_old, old[:3])
