import math

import pytest
import torch
from eval_tiny_lm import perturbed_copy, tiny_model, tiny_tokenizer

from experiments.evaluation.generation import generate
from experiments.evaluation.retained_kl import (
    cache_logprobs,
    model_kl,
    per_token_kl_full,
    per_token_kl_topk,
    retained_kl,
    summarize_kl,
    tail_logmass,
)

PROMPTS = [
    "Question: What is 12 + 7?\nAnswer:",
    "Question: Where do you sleep?\nChoices: bedroom, court, ocean\nAnswer:",
    "def add(a, b):",
    "the kitchen",
]


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=5)
    adapted = perturbed_copy(base, tok, scale=0.3, seed=7)
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    responses = generate(base, tok, PROMPTS, max_new_tokens=10, do_sample=True, seed=0).token_ids
    return tok, base, adapted, prompt_ids, responses


def _hand_kl(base, adapted, prompt_ids, responses):
    """Loop reference: per response, sum over tokens of sum_v p(v) (log p(v) - log q(v))."""
    seq_sums, n_tokens = [], 0
    for p, r in zip(prompt_ids, responses):
        with torch.no_grad():
            lp = torch.log_softmax(base(torch.tensor([p + r])).logits[0].double(), -1)
            lq = torch.log_softmax(adapted(torch.tensor([p + r])).logits[0].double(), -1)
        total = 0.0
        for t in range(len(r)):
            pos = len(p) - 1 + t
            probs = lp[pos].exp()
            total += float(sum(probs[v] * (lp[pos, v] - lq[pos, v]) for v in range(lp.shape[-1])))
        seq_sums.append(total)
        n_tokens += len(r)
    return sum(seq_sums) / n_tokens, sum(seq_sums) / len(seq_sums), n_tokens


@pytest.mark.parametrize("mode,dtype", [("full", "float32"), ("full", "float16"), ("topk", "float32")])
def test_model_against_itself_is_zero(setup, mode, dtype):
    tok, base, _, prompt_ids, responses = setup
    cached = cache_logprobs(base, prompt_ids, responses, mode=mode, dtype=dtype, top_k=8,
                            pad_id=tok.pad_token_id, batch_size=2)
    # A different batch size than the cache build: padding differs, the result must not.
    res = retained_kl(base, prompt_ids, responses, cached, pad_id=tok.pad_token_id, batch_size=3)
    assert res["mode"] == mode
    assert abs(res["kl_token_mean"]) < 1e-6 and abs(res["kl_seq_mean"]) < 1e-6
    assert res["n"] == len(PROMPTS) and res["n_tokens"] == sum(len(r) for r in responses)
    assert abs(model_kl(base, base, prompt_ids, responses, pad_id=tok.pad_token_id, batch_size=2)
               ["exact"]["kl_token_mean"]) < 1e-6


def test_matches_hand_computation(setup):
    tok, base, adapted, prompt_ids, responses = setup
    token_mean, seq_mean, n_tokens = _hand_kl(base, adapted, prompt_ids, responses)
    assert token_mean > 1e-3  # the perturbation is large enough that the check has teeth
    cached = cache_logprobs(base, prompt_ids, responses, mode="full", dtype="float32", top_k=8,
                            pad_id=tok.pad_token_id, batch_size=2)
    res = retained_kl(adapted, prompt_ids, responses, cached, pad_id=tok.pad_token_id, batch_size=2)
    assert res["kl_token_mean"] == pytest.approx(token_mean, rel=1e-4)
    assert res["kl_seq_mean"] == pytest.approx(seq_mean, rel=1e-4)
    assert res["n_tokens"] == n_tokens
    live = model_kl(base, adapted, prompt_ids, responses, pad_id=tok.pad_token_id, batch_size=4)
    assert live["exact"]["kl_token_mean"] == pytest.approx(token_mean, rel=1e-4)
    # fp16 storage moves the value only by rounding noise
    half = cache_logprobs(base, prompt_ids, responses, mode="full", dtype="float16", top_k=8,
                          pad_id=tok.pad_token_id, batch_size=2)
    res16 = retained_kl(adapted, prompt_ids, responses, half, pad_id=tok.pad_token_id, batch_size=2)
    assert res16["kl_token_mean"] == pytest.approx(token_mean, rel=2e-2)


def test_full_mode_in_row_chunks_equals_one_pass(setup, monkeypatch):
    """The full-mode KL over chunks of 3 rows (a chunk boundary inside every response) against all rows at once."""
    from experiments.evaluation import retained_kl as R

    tok, base, adapted, prompt_ids, responses = setup
    cached = cache_logprobs(base, prompt_ids, responses, mode="full", dtype="float16", top_k=8,
                            pad_id=tok.pad_token_id, batch_size=2)
    one = retained_kl(adapted, prompt_ids, responses, cached, pad_id=tok.pad_token_id, batch_size=4)
    monkeypatch.setattr(R, "KL_CHUNK_ELEMENTS", 3 * cached.full.shape[1])
    chunked = retained_kl(adapted, prompt_ids, responses, cached, pad_id=tok.pad_token_id, batch_size=4)
    assert chunked["kl_token_mean"] == pytest.approx(one["kl_token_mean"], rel=1e-6) and one["kl_token_mean"] > 1e-3
    assert chunked["kl_seq_mean"] == pytest.approx(one["kl_seq_mean"], rel=1e-6)


def test_direction_is_base_first():
    p = torch.tensor([[0.98, 0.01, 0.01]])
    q = torch.tensor([[1 / 3, 1 / 3, 1 / 3]])
    kl_pq = sum(a * math.log(a / b) for a, b in zip(p[0].tolist(), q[0].tolist()))
    kl_qp = sum(b * math.log(b / a) for a, b in zip(p[0].tolist(), q[0].tolist()))
    assert abs(kl_pq - kl_qp) > 0.5
    got = float(per_token_kl_full(p.log(), q.log())[0])
    assert got == pytest.approx(kl_pq, rel=1e-5)
    # zero-probability base outcomes contribute 0, not nan
    z = torch.tensor([[0.5, 0.5, 0.0]])
    assert float(per_token_kl_full(z.log(), q.log())[0]) == pytest.approx(math.log(1.5), rel=1e-5)


def test_topk_tail_is_a_lower_bound_and_gap_reported(setup):
    tok, base, adapted, prompt_ids, responses = setup
    live = model_kl(base, adapted, prompt_ids, responses, pad_id=tok.pad_token_id, batch_size=2, top_k=4)
    assert live["topk"]["kl_token_mean"] <= live["exact"]["kl_token_mean"] + 1e-7
    assert live["gap_token_mean"] == pytest.approx(
        live["exact"]["kl_token_mean"] - live["topk"]["kl_token_mean"])
    assert live["gap_token_mean"] > 0 and live["gap_seq_mean"] > 0
    # the cached top-k path gives the same bound as the live one
    cached = cache_logprobs(base, prompt_ids, responses, mode="topk", dtype="float32", top_k=4,
                            pad_id=tok.pad_token_id, batch_size=3)
    res = retained_kl(adapted, prompt_ids, responses, cached, pad_id=tok.pad_token_id, batch_size=2)
    assert res["kl_token_mean"] == pytest.approx(live["topk"]["kl_token_mean"], rel=1e-5)
    # k = vocabulary: the tail is empty and the bound is exact
    every = model_kl(base, adapted, prompt_ids, responses, pad_id=tok.pad_token_id, batch_size=2,
                     top_k=len(tok))
    assert every["gap_token_mean"] == pytest.approx(0.0, abs=1e-6)


def test_per_token_bound_and_tail_mass():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(50, 20) * 2, -1)
    lq = torch.log_softmax(torch.randn(50, 20) * 2, -1)
    vals, idx = lp.topk(3, -1)
    tail = tail_logmass(lp, idx)
    assert torch.allclose(tail.exp(), 1 - vals.exp().sum(-1), atol=1e-6)
    bound = per_token_kl_topk(vals, idx, tail, lq)
    exact = per_token_kl_full(lp, lq)
    assert bool((bound <= exact + 1e-6).all()) and bool((bound < exact - 1e-4).any())


def test_summary_means():
    s = summarize_kl([torch.tensor([1.0, 3.0]), torch.tensor([2.0])])
    assert s == {"kl_token_mean": 2.0, "kl_seq_mean": 3.0, "n_tokens": 3, "n": 2,
                 "per_item": {"kl_sum": [4.0, 2.0], "n_tokens": [2, 1]}}
