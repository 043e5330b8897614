import pytest
from eval_tiny_lm import tiny_model, tiny_tokenizer

from experiments import prompts as P
from experiments.evaluation.answers import extract_math_answer
from experiments.evaluation.generation import generate
from experiments.evaluation.lm_eval_runner import run_lm_eval, write_jsonl, write_local_tasks
from experiments.evaluation.scoring import score_choices

MATH = [
    {"question": "What is 12 + 7?", "answer": "12 + 7 = 19\n#### 19"},
    {"question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "What is 9 - 2?", "answer": "9 - 2 = 7\n#### 7"},
]
CHOICE = [
    {"id": "c0", "question": "Where do you sleep?", "choices": ["bedroom", "court", "ocean"],
     "labels": ["A", "B", "C"], "answer_index": 0},
    {"id": "c1", "question": "What is in the kitchen?", "choices": ["a", "car", "the"],
     "labels": ["A", "B", "C"], "answer_index": 1},
    {"id": "c2", "question": "Where is the car?", "choices": ["garden", "kitchen", "ocean"],
     "labels": ["A", "B", "C"], "answer_index": 2},
]


@pytest.fixture
def offline(monkeypatch):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")


@pytest.mark.slow
def test_local_tasks_offline_agree_with_suite_scoring(tmp_path, offline, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=11)
    # Gold answers = what the model itself answers greedily on the first two items, and a number it
    # does not produce on the third, so exact match must come out at exactly 2/3.
    texts = generate(model, tok, [P.math_prompt(it) for it in MATH], max_new_tokens=16).texts
    answers = [extract_math_answer(t.split("Question:")[0]) or "" for t in texts]
    # (A response without a number extracts to ""; a gold text without a number does too.)
    math_items = [
        {"question": it["question"], "answer": f"so\n#### {a}" if a else "no number"}
        for it, a in zip(MATH[:2], answers[:2])
    ] + [{"question": MATH[2]["question"], "answer": "#### 987654"}]
    assert answers[2] != "987654"
    write_jsonl(math_items, tmp_path / "data" / "math.jsonl")
    write_jsonl(CHOICE, tmp_path / "data" / "choice.jsonl")
    include = write_local_tasks(tmp_path / "tasks", {
        "atlas_math": ("math", tmp_path / "data" / "math.jsonl"),
        "atlas_commonsense": ("choice", tmp_path / "data" / "choice.jsonl"),
    }, max_gen_toks=16)

    out = run_lm_eval(model, tok, ["atlas_math", "atlas_commonsense"], limit=None, include_path=include,
                      batch_size=4)
    assert out["atlas_math"]["n"] == 3 and out["atlas_commonsense"]["n"] == 3
    assert out["atlas_math"]["exact_match"] == pytest.approx(2 / 3)
    scores = score_choices(model, tok, CHOICE, chat_template=False, batch_size=8)
    acc = sum(c == it["answer_index"] for c, it in zip(scores.choice, CHOICE)) / 3
    acc_norm = sum(c == it["answer_index"] for c, it in zip(scores.choice_norm, CHOICE)) / 3
    assert out["atlas_commonsense"]["acc"] == pytest.approx(acc)
    assert out["atlas_commonsense"]["acc_norm"] == pytest.approx(acc_norm)

    limited = run_lm_eval(model, tok, ["atlas_commonsense"], limit=2, include_path=include)
    assert limited["atlas_commonsense"]["n"] == 2


def test_rejects_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="allowed"):
        write_local_tasks(tmp_path, {"atlas_x": ("code", tmp_path / "x.jsonl")})
    assert run_lm_eval(None, None, []) == {}
