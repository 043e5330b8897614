import pytest
import torch
from eval_tiny_lm import tiny_model, tiny_tokenizer

from experiments import prompts as P
from experiments.evaluation.scoring import (
    choose,
    iter_response_logprobs,
    response_token_logprobs,
    score_choices,
)


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return tiny_model(tok, seed=2), tok


def _pairs(tok):
    texts = [
        ("Question: What is 12 + 7?\nAnswer:", " 12 + 7 = 19\n#### 19"),
        ("the", " kitchen"),
        ("Question: Where do you sleep?\nChoices: bedroom, court, ocean\nAnswer:", " bedroom"),
        ("def add(a, b):", "\n    return a + b"),
        ("a", ""),
    ]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [enc(p) for p, _ in texts], [enc(r) + [tok.eos_token_id] if r else [] for _, r in texts]


def _reference_logprobs(model, prompt, response):
    """Unpadded, one sequence at a time: log-softmax at each position that predicts a response token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    rows = lp[len(prompt) - 1: len(prompt) - 1 + len(response)]
    return rows, rows.gather(-1, torch.tensor(response, dtype=torch.long).unsqueeze(-1)).squeeze(-1)


def test_token_logprobs_match_unbatched_reference(lm):
    model, tok = lm
    prompts, responses = _pairs(tok)
    got = response_token_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, batch_size=2)
    assert [len(g) for g in got] == [len(r) for r in responses]
    for p, r, g in zip(prompts, responses, got):
        _, ref = _reference_logprobs(model, p, r)
        assert torch.allclose(g, ref, atol=1e-5)
    assert got[-1].numel() == 0


def test_full_distributions_match_and_one_forward_per_batch(lm):
    model, tok = lm
    prompts, responses = _pairs(tok)
    calls = {"n": 0}
    handle = model.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    try:
        batches = list(iter_response_logprobs(model, prompts, responses, pad_id=tok.pad_token_id, batch_size=3))
    finally:
        handle.remove()
    assert calls["n"] == len(batches) == 2
    seen = []
    for batch in batches:
        assert batch.logprobs.shape == (sum(batch.lengths), len(tok))
        assert torch.allclose(batch.logprobs.exp().sum(-1), torch.ones(sum(batch.lengths)), atol=1e-5)
        for i, rows in zip(batch.indices, batch.split(batch.logprobs)):
            ref_rows, _ = _reference_logprobs(model, prompts[i], responses[i])
            assert torch.allclose(rows, ref_rows, atol=1e-5)
            seen.append(i)
        assert batch.targets.tolist() == [t for i in batch.indices for t in responses[i]]
    assert sorted(seen) == list(range(len(prompts)))


def test_choose_raw_and_character_normalised():
    # raw: -5 > -8; normalised by characters: -5/1 < -8/8.
    assert choose([-5.0, -8.0], ["a", "abcdefgh"]) == (0, 1)
    # ties go to the lowest index, like numpy.argmax
    assert choose([-2.0, -2.0, -3.0], ["ab", "ab", "c"]) == (0, 0)


def test_score_choices_sums_continuation_logprobs(lm):
    model, tok = lm
    items = [
        {"id": "q1", "question": "Where do you sleep?", "choices": ["bedroom", "court", "ocean"],
         "labels": ["A", "B", "C"], "answer_index": 0},
        {"id": "q2", "question": "What is in the garden?", "choices": ["kitchen", "a", "car"],
         "labels": ["A", "B", "C"], "answer_index": 2},
    ]
    scores = score_choices(model, tok, items, chat_template=False, batch_size=4)
    for item, ll, raw, norm in zip(items, scores.loglik, scores.choice, scores.choice_norm):
        ctx = tok(P.choice_prompt(item), add_special_tokens=False)["input_ids"]
        ref = []
        for c in item["choices"]:
            cont = tok(P.choice_continuation(c), add_special_tokens=False)["input_ids"]
            ref.append(float(_reference_logprobs(model, ctx, cont)[1].sum()))
        assert ll == pytest.approx(ref, abs=1e-4)
        assert raw == max(range(3), key=lambda j: ref[j])
        assert norm == max(range(3), key=lambda j: ref[j] / len(item["choices"][j]))
    assert scores.char_lengths == [[7, 5, 5], [7, 1, 3]]


def test_rejects_mismatched_inputs(lm):
    model, tok = lm
    with pytest.raises(ValueError, match="prompts but"):
        list(iter_response_logprobs(model, [[1]], [], pad_id=0, batch_size=1))
    with pytest.raises(ValueError, match="at least one token"):
        list(iter_response_logprobs(model, [[]], [[1]], pad_id=0, batch_size=1))
