"""LwF: the term is lambda * mean over response tokens of KL(p_base || p_theta) (that direction), 0 for the base,
computed against the reference cache's log-probs (full or top-k + tail); retained batches are drawn per step
from (seed, step) alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from baselines.lwf import kl_to_cached_base
from experiments.evaluation.retained_kl import cache_logprobs
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import fresh_base, prepared, randomize_lora_b, target_batch


def test_bad_knobs_are_rejected():
    with pytest.raises(MethodConfigError, match="method.lwf_lambda"):
        build_named("lwf", lwf_lambda=-0.1)
    with pytest.raises(MethodConfigError, match="method.batch_size"):
        build_named("lwf", batch_size=0)


def live_kl(base, model, pairs, reverse=False):
    """Mean over response tokens of KL(base || model) from both models' full distributions, by hand."""
    terms = []
    for pair in pairs:
        ids = torch.tensor([pair.prompt_ids + pair.response_ids])
        n, m = len(pair.prompt_ids), len(pair.response_ids)
        with torch.no_grad():
            p = torch.log_softmax(base(input_ids=ids).logits[0, n - 1: n - 1 + m].float(), -1)
            q = torch.log_softmax(model(input_ids=ids).logits[0, n - 1: n - 1 + m].float(), -1)
        if reverse:
            p, q = q, p
        terms.append((p.exp() * (p - q)).sum(-1))
    return torch.cat(terms).mean().item()


def test_term_is_zero_for_the_base_and_equals_the_forward_kl(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf", tmp_path, lwf_lambda=2.5, batch_size=5)
    ctx.step = 7
    assert tiny.reference.mode == "full"
    pairs = method.draw(ctx, 0)
    assert len(pairs) == 5
    # At init (B = 0) the model is the base: the term vanishes.
    at_init = method.extra_loss(model, target_batch(tiny), ctx)
    assert abs(at_init.item()) < 1e-6

    randomize_lora_b(model, std=0.3)
    model.eval()
    base = fresh_base(tiny)
    forward, reverse = live_kl(base, model, pairs), live_kl(base, model, pairs, reverse=True)
    assert forward > 1e-3 and abs(forward - reverse) > 1e-3 * forward  # the two directions differ here
    method._micro = type(method._micro)()  # the same micro-batch 0 of step 7 again
    term = method.extra_loss(model, target_batch(tiny), ctx)
    assert term.item() == pytest.approx(2.5 * forward, rel=1e-4)
    term.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_topk_cache_gives_the_coarsened_kl_a_lower_bound(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf", tmp_path)
    randomize_lora_b(model, std=0.3)
    base = fresh_base(tiny)
    domains = {}
    for name, dom in tiny.reference.domains.items():
        split = dom.split("calibration")
        cached = cache_logprobs(base, split.prompt_ids, split.response_ids, mode="topk", dtype="float32", top_k=5,
                                pad_id=tiny.tokenizer.pad_token_id, batch_size=4)
        same = SimpleNamespace(prompt_ids=split.prompt_ids, response_ids=split.response_ids, logprobs=cached)
        domains[name] = SimpleNamespace(split=lambda _name, s=same: s)
    topk_ref = SimpleNamespace(domains=domains)
    pairs = method.pairs[:6]
    pad = tiny.tokenizer.pad_token_id
    with torch.no_grad():
        coarse = kl_to_cached_base(model, pairs, topk_ref, pad, ctx.device)
        full = kl_to_cached_base(model, pairs, tiny.reference, pad, ctx.device)
        at_base = kl_to_cached_base(base, pairs, topk_ref, pad, ctx.device)
    assert coarse.shape == full.shape == (sum(len(p.response_ids) for p in pairs),)
    assert (coarse <= full + 1e-5).all() and coarse.sum() > 0
    assert at_base.abs().max() < 1e-5


def test_draws_depend_on_seed_and_step_only(tiny, tmp_path):
    _, method, ctx = prepared(tiny, "lwf", tmp_path, batch_size=4)
    ctx.step = 3
    torch.manual_seed(123)
    first = [(p.domain, p.index) for p in method.draw(ctx, 0)]
    torch.manual_seed(999)  # the global RNG plays no part
    assert [(p.domain, p.index) for p in method.draw(ctx, 0)] == first
    others = {tuple((p.domain, p.index) for p in method.draw(ctx, i)) for i in range(1, 4)}
    ctx.step = 4
    others |= {tuple((p.domain, p.index) for p in method.draw(ctx, 0))}
    assert tuple(first) not in others
