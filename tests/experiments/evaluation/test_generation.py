import pytest
import torch
from eval_tiny_lm import tiny_model, tiny_tokenizer

from experiments.evaluation.generation import GumbelNoise, generate, sample_seed

PROMPTS = [
    "Question: What is 12 + 7?\nAnswer:",
    "Question: Where do you sleep?\nChoices: bedroom, court, ocean\nAnswer:",
    "def add(a, b):",
    "the",
    "Question: What is 3 + 4?\nAnswer:",
]


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return tiny_model(tok), tok


def _manual_greedy(model, tok, prompt, max_new_tokens):
    """One prompt, no padding, argmax over a full forward at every step."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            nxt = int(logits.argmax())
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
    return out


def test_greedy_matches_unbatched_argmax_and_keeps_order(lm):
    model, tok = lm
    res = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2)
    assert len(res.token_ids) == len(PROMPTS)
    for prompt, ids, text, stopped in zip(PROMPTS, res.token_ids, res.texts, res.stopped):
        assert ids == _manual_greedy(model, tok, prompt, 6)
        assert text == tok.decode(ids, skip_special_tokens=True)
        assert stopped == (ids[-1] == tok.eos_token_id)
        assert len(ids) <= 6


def test_response_is_cut_at_first_eos(lm):
    model, tok = lm
    eos = tok.eos_token_id
    calls = {"n": 0}

    def favour_eos_at_third_step(module, inputs, output):
        # The third decoding step (prefill + 2 steps) makes eos the argmax; later ids would follow it.
        calls["n"] += 1
        if calls["n"] == 3:
            output = output.clone()
            output[:, -1, eos] = 1e4
        return output

    handle = model.lm_head.register_forward_hook(favour_eos_at_third_step)
    try:
        res = generate(model, tok, PROMPTS[:3], max_new_tokens=6, batch_size=3)
    finally:
        handle.remove()
    for ids, stopped, text in zip(res.token_ids, res.stopped, res.texts):
        assert len(ids) == 3 and ids[-1] == eos and stopped
        assert eos not in ids[:-1]
        assert text == tok.decode(ids[:-1])


def test_sampling_independent_of_batching_and_seeded(lm):
    model, tok = lm
    kw = dict(max_new_tokens=8, do_sample=True, temperature=1.0, seed=3)
    together = generate(model, tok, PROMPTS, batch_size=5, **kw)
    alone = [generate(model, tok, [p], batch_size=1, **kw).token_ids[0] for p in PROMPTS]
    reordered = generate(model, tok, PROMPTS[::-1], batch_size=2, **kw)
    assert together.token_ids == alone
    assert reordered.token_ids[::-1] == together.token_ids
    other_seed = generate(model, tok, PROMPTS, batch_size=5, **{**kw, "seed": 4})
    assert other_seed.token_ids != together.token_ids
    greedy = generate(model, tok, PROMPTS, max_new_tokens=8)
    assert greedy.token_ids != together.token_ids


def test_repeated_prompts_get_distinct_samples(lm):
    model, tok = lm
    res = generate(model, tok, [PROMPTS[0]] * 4, max_new_tokens=8, do_sample=True, seed=0, batch_size=4)
    assert len({tuple(ids) for ids in res.token_ids}) > 1
    again = generate(model, tok, [PROMPTS[0]] * 4, max_new_tokens=8, do_sample=True, seed=0,
                     sample_indices=[0, 1, 2, 3], batch_size=1)
    assert again.token_ids == res.token_ids


def test_gumbel_argmax_is_a_categorical_sample():
    """Frequencies of argmax(logits + Gumbel) match softmax(logits)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits[0], -1)
    counts = torch.zeros(4)
    n = 4000
    proc = GumbelNoise([sample_seed(0, "x")], torch.device("cpu"))
    for _ in range(n):
        counts[int(proc(None, logits).argmax())] += 1
    freq = counts / n
    # 4 standard errors at n = 4000 is < 0.032 for every p here.
    assert torch.allclose(freq, probs, atol=0.032), (freq, probs)


def test_rejects_bad_arguments(lm):
    model, tok = lm
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, tok, PROMPTS, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, tok, PROMPTS, max_new_tokens=2, do_sample=True, temperature=0.0)
    assert generate(model, tok, [], max_new_tokens=2).token_ids == []
