"""LwF, two ways.

`lwf` (Li & Hoiem; avalanche's `LearningWithoutForgetting`): lambda * mean over the TARGET micro-batch's response
tokens of KL(softmax(z_base / T) || softmax(z / T)), T = 2, the base being the model with its adapter disabled.
Pinned here to a re-derivation written from the paper: a freshly loaded base, each example run alone and unpadded,
the softened distributions and the KL written out by hand.

`lwf_retained`: lambda * mean over response tokens of KL(p_base || p_theta) at T = 1 on retained calibration pairs,
computed against the reference cache's log-probs (full or top-k + tail); retained batches are drawn per step from
(seed, step) alone (the suite's `lwf` before issue 58, same numbers).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.lwf import base_model, kl_to_cached_base, softened_kl
from experiments.config import train_config
from experiments.evaluation.retained_kl import cache_logprobs
from experiments.methods import MethodConfigError, build_named
from experiments.train import train
from tests.baselines.baseline_helpers import fresh_base, prepared, randomize_lora_b, target_batch


# -- configuration --------------------------------------------------------------------------------------------------
def test_defaults_are_the_authors():
    lwf = build_named("lwf").params
    assert (lwf.lwf_lambda, lwf.distill_on, lwf.temperature, lwf.batch_size) == (1.0, "target", 2.0, None)
    kept = build_named("lwf_retained").params
    assert (kept.lwf_lambda, kept.distill_on, kept.temperature, kept.batch_size) == (1.0, "retained", 1.0, 8)


@pytest.mark.parametrize("name, overrides, key", [
    ("lwf", {"lwf_lambda": -0.1}, "lwf_lambda"),
    ("lwf", {"distill_on": "old_task"}, "distill_on"),
    ("lwf", {"distill_on": None}, "distill_on"),
    ("lwf", {"temperature": 0.0}, "temperature"),
    ("lwf", {"temperature": -2.0}, "temperature"),
    ("lwf", {"temperature": math.inf}, "temperature"),
    ("lwf", {"temperature": math.nan}, "temperature"),
    ("lwf", {"temperature": "2"}, "temperature"),
    ("lwf", {"batch_size": 8}, "batch_size"),  # the target term reads the training micro-batch, nothing drawn
    ("lwf_retained", {"batch_size": 0}, "batch_size"),
    ("lwf_retained", {"temperature": 2.0}, "temperature"),  # the cached log-probs are at T = 1
])
def test_bad_knobs_are_rejected_before_any_compute(name, overrides, key):
    with pytest.raises(MethodConfigError, match=f"method.{key}"):
        build_named(name, **overrides)


# -- the re-derivation ------------------------------------------------------------------------------------------------
def log_softmax_at(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """log of Li & Hoiem's softened probabilities y_i^(1/T) / sum_j y_j^(1/T), y = softmax(z): z/T - logsumexp(z/T)."""
    s = z.double() / temperature
    return s - torch.logsumexp(s, dim=-1, keepdim=True)


def hand_kl(base_logits: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[n] sum_i p_i (log p_i - log q_i), p the base's softened distribution, q the model's."""
    log_p, log_q = log_softmax_at(base_logits, temperature), log_softmax_at(logits, temperature)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def response_positions(example: dict) -> list[int]:
    """The positions t whose logits predict a response token (label at t + 1 is not -100)."""
    labels = example["labels"]
    return [t - 1 for t in range(1, len(labels)) if labels[t] != -100]


def rederived(base, model, examples, temperature: float) -> torch.Tensor:
    """Mean over the examples' response tokens of KL(base_T || model_T), each example alone and unpadded; the
    model's side keeps its graph (for gradients)."""
    terms = []
    for e in examples:
        ids = torch.tensor([e["input_ids"]])
        pos = response_positions(e)
        with torch.no_grad():
            z_base = base(input_ids=ids).logits[0, pos]
        terms.append(hand_kl(z_base, model(input_ids=ids).logits[0, pos], temperature))
    return torch.cat(terms).mean()


def test_the_softened_kl_and_its_gradient_are_the_hand_written_ones():
    g = torch.Generator().manual_seed(0)
    z_base, z = torch.randn(5, 11, generator=g) * 3, torch.randn(5, 11, generator=g) * 3
    for t in (1.0, 2.0, 4.0):
        z_req = z.clone().requires_grad_(True)
        kl = softened_kl(z_base, z_req, t)
        torch.testing.assert_close(kl.double(), hand_kl(z_base, z, t), rtol=1e-5, atol=1e-6)
        kl.sum().backward()
        # d/dz KL(p_T || softmax(z / T)) = (softmax(z / T) - p_T) / T: no T^2 factor
        expected = (torch.softmax(z.double() / t, -1) - torch.softmax(z_base.double() / t, -1)) / t
        torch.testing.assert_close(z_req.grad.double(), expected, rtol=1e-5, atol=1e-7)
    # avalanche's form: kl_div(log_softmax(out / T), softmax(prev_out / T), batchmean) is the row mean
    t = 2.0
    avalanche = torch.nn.functional.kl_div(torch.log_softmax(z / t, -1), torch.softmax(z_base / t, -1),
                                           reduction="batchmean")
    assert softened_kl(z_base, z, t).mean().item() == pytest.approx(avalanche.item(), rel=1e-5)
    # degenerate cases: the same logits (or shifted by a constant) give 0 and no gradient; a large T flattens both
    z_req = z_base.clone().requires_grad_(True)
    same = softened_kl(z_base, z_req + 7.0, 2.0)
    assert same.abs().max() < 1e-6
    same.sum().backward()
    assert z_req.grad.abs().max() < 1e-7
    assert softened_kl(z_base, z, 1e4).max() < 1e-6
    # one-hot-like base (a very peaked teacher): finite, equal to the hand value
    peaked = torch.zeros(1, 11)
    peaked[0, 3] = 80.0
    torch.testing.assert_close(softened_kl(peaked, z[:1], 2.0).double(), hand_kl(peaked, z[:1], 2.0), rtol=1e-4,
                               atol=1e-5)


# -- lwf: distilled on the target micro-batch ----------------------------------------------------------------------------
def test_term_is_zero_at_init_and_reads_no_retained_data(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf", tmp_path, lwf_lambda=2.5)
    assert method.pairs == []
    ctx.reference_fn = lambda: pytest.fail("lwf read the reference cache (retained data)")
    model.train()
    examples = tiny.examples[:6]
    assert method.mix_batches(examples, ctx) == examples  # nothing mixed in
    term = method.extra_loss(model, target_batch(tiny), ctx)
    assert term.abs().item() < 1e-7  # B = 0: the model is the base


def test_base_is_the_adapter_disabled_model_the_freshly_loaded_base(tiny, tmp_path):
    model, _, _ = prepared(tiny, "lwf", tmp_path, dropout=0.3)
    batch = target_batch(tiny)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    base = fresh_base(tiny)
    with torch.no_grad():
        expected = base(**inputs).logits
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=1e-5, atol=1e-5)  # before any training
    randomize_lora_b(model, std=0.3)
    attention = [m for m in model.modules() if hasattr(m, "attention_dropout")]
    assert attention
    for m in attention:  # a backbone with dropout of its own (the tiny Qwen3 has none)
        m.attention_dropout = 0.5
    model.train()  # as in the training loop: LoRA and attention dropout active
    flags = {name: m.training for name, m in model.named_modules()}
    for _ in range(2):  # no dropout on the base's side: the same logits twice
        with base_model(model):
            got = model(**inputs).logits
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert not got.requires_grad
    assert {name: m.training for name, m in model.named_modules()} == flags  # train/eval flags restored
    with torch.no_grad():
        model.eval()
        assert not torch.allclose(model(**inputs).logits, expected, atol=1e-3)  # the adapter is back on


@pytest.mark.parametrize("temperature", [2.0, 1.0, 3.5])
def test_term_is_the_softened_kl_on_the_target_examples_response_tokens(tiny, tmp_path, temperature):
    model, method, ctx = prepared(tiny, "lwf", tmp_path, lwf_lambda=2.5, temperature=temperature)
    randomize_lora_b(model, std=0.3)
    model.train()
    examples = tiny.examples[:7]
    assert all(0 < len(response_positions(e)) < len(e["labels"]) - 1 for e in examples)  # prompt and response
    method.mix_batches(examples, ctx)
    # the batch argument is the loop's last length group: the term must not read it
    other = target_batch(SimpleNamespace(examples=tiny.examples[10:12], tokenizer=tiny.tokenizer))
    term = method.extra_loss(model, other, ctx)

    base = fresh_base(tiny)
    mine = rederived(base, model, examples, temperature)
    assert mine.item() > 1e-3
    assert term.item() == pytest.approx(2.5 * mine.item(), rel=1e-4)
    # the temperature matters: not the T = 1 value
    if temperature != 1.0:
        assert abs(rederived(base, model, examples, 1.0).item() - mine.item()) > 1e-2 * mine.item()

    grads = torch.autograd.grad(term, [p for p in model.parameters() if p.requires_grad])
    hand = torch.autograd.grad(2.5 * mine, [p for p in model.parameters() if p.requires_grad])
    assert sum(g.abs().sum() for g in grads) > 0
    for got, want in zip(grads, hand):
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-3, atol=1e-6)


def test_prompt_positions_do_not_enter_the_term(tiny, tmp_path):
    """The term's positions are the response tokens (the task loss's): the same examples with every position marked
    as a target give another value, the examples as encoded give the re-derivation's."""
    model, method, ctx = prepared(tiny, "lwf", tmp_path)
    randomize_lora_b(model, std=0.3)
    examples = tiny.examples[:4]
    method.mix_batches(examples, ctx)
    on_responses = method.extra_loss(model, {}, ctx).item()
    everywhere = [{**e, "labels": list(e["input_ids"])} for e in examples]
    method.mix_batches(everywhere, ctx)
    on_all = method.extra_loss(model, {}, ctx).item()
    assert on_all != pytest.approx(on_responses, rel=1e-3)
    assert on_responses == pytest.approx(rederived(fresh_base(tiny), model, examples, 2.0).item(), rel=1e-4)


def test_lambda_zero_and_a_missing_micro_batch(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf", tmp_path, lwf_lambda=0.0)
    method.mix_batches(tiny.examples[:2], ctx)
    assert method.extra_loss(model, {}, ctx) is None
    model, method, ctx = prepared(tiny, "lwf", tmp_path)
    with pytest.raises(RuntimeError, match="mix_batches"):
        method.extra_loss(model, {}, ctx)
    method.mix_batches(tiny.examples[:2], ctx)
    method.extra_loss(model, {}, ctx)
    with pytest.raises(RuntimeError, match="mix_batches"):  # the examples serve one micro-batch only
        method.extra_loss(model, {}, ctx)


def test_training_loop_distils_each_micro_batch_it_trains_on(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf", tmp_path / "run")
    mixed, distilled = [], []
    mix, term = method.mix_batches, method.target_term

    def spy_mix(examples, c):
        mixed.append([e["input_ids"] for e in examples])
        return mix(examples, c)

    def spy_term(m, c, examples):
        distilled.append([e["input_ids"] for e in examples])
        return term(m, c, examples)

    method.mix_batches, method.target_term = spy_mix, spy_term
    result = train(model, method, tiny.examples, ctx, train_config(steps=3, lr=5e-2, batch_size=4, grad_accum=2,
                   checkpoint_every=100, progress=False))
    assert len(result.losses) == 3 and all(map(math.isfinite, result.losses))
    assert len(distilled) == 6 and distilled == mixed


# -- lwf_retained: distilled on retained calibration prompts (the earlier `lwf`) -------------------------------------------
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


def test_retained_term_is_zero_for_the_base_and_equals_the_forward_kl(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf_retained", tmp_path, lwf_lambda=2.5, batch_size=5)
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
    method.mix_batches(tiny.examples[:4], ctx)  # the target micro-batch plays no part
    term = method.extra_loss(model, target_batch(tiny), ctx)
    assert term.item() == pytest.approx(2.5 * forward, rel=1e-4)
    term.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_retained_topk_cache_gives_the_coarsened_kl_a_lower_bound(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "lwf_retained", tmp_path)
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


def test_retained_draws_depend_on_seed_and_step_only(tiny, tmp_path):
    _, method, ctx = prepared(tiny, "lwf_retained", tmp_path, batch_size=4)
    ctx.step = 3
    torch.manual_seed(123)
    first = [(p.domain, p.index) for p in method.draw(ctx, 0)]
    torch.manual_seed(999)  # the global RNG plays no part
    assert [(p.domain, p.index) for p in method.draw(ctx, 0)] == first
    others = {tuple((p.domain, p.index) for p in method.draw(ctx, i)) for i in range(1, 4)}
    ctx.step = 4
    others |= {tuple((p.domain, p.index) for p in method.draw(ctx, 0))}
    assert tuple(first) not in others
