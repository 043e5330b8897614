"""Replay: each micro-batch holds the configured share of retained calibration examples (the base's own responses,
or gold answers when labelled), drawn from (seed, step, micro-batch) alone."""

from __future__ import annotations

import pytest
import torch

from baselines.replay import replay_count
from experiments.calibration import pair_example, reference_pairs
from experiments.methods import MethodConfigError, build_named
from experiments.prompts import gold_response
from tests.baselines.baseline_helpers import prepared


def key(example):
    return tuple(example["input_ids"]), tuple(example["labels"])


def test_replay_count():
    assert replay_count(8, 0.25, "replace", 0.99) == 2
    assert replay_count(8, 0.2, "append", 0.99) == 2  # 2 / (8 + 2) = 0.2
    assert replay_count(4, 0.1, "replace", 0.39) == 1 and replay_count(4, 0.1, "replace", 0.41) == 0
    assert replay_count(4, 1.0, "replace", 0.5) == 4 and replay_count(4, 0.0, "replace", 0.0) == 0


def test_bad_knobs_are_rejected():
    with pytest.raises(MethodConfigError, match="method.rho"):
        build_named("replay", rho=1.0, mode="append")
    with pytest.raises(MethodConfigError, match="method.mode"):
        build_named("replay", mode="mix")


@pytest.mark.parametrize("mode, rho, kept, replayed", [("replace", 0.25, 6, 2), ("append", 0.2, 8, 2)])
def test_batches_hold_the_configured_share_of_base_responses(tiny, tmp_path, mode, rho, kept, replayed):
    _, method, ctx = prepared(tiny, "replay", tmp_path, rho=rho, mode=mode)
    pool = {key(pair_example(p)) for p in reference_pairs(tiny.reference, 96)}
    targets = tiny.examples[:8]
    for step in range(1, 6):
        ctx.step = step
        mixed = method.mix_batches(list(targets), ctx)
        assert len(mixed) == kept + replayed
        assert mixed[:kept] == targets[:kept]
        assert all(key(e) in pool for e in mixed[kept:])
        assert len({key(e) for e in mixed[kept:]}) == replayed  # no duplicate within a micro-batch
        assert sum(key(e) in pool for e in mixed) / len(mixed) == pytest.approx(rho)


def test_fractional_share_holds_in_expectation(tiny, tmp_path):
    _, method, ctx = prepared(tiny, "replay", tmp_path, rho=0.1)  # E[k] = 0.4 of a batch of 4
    pool = {key(e) for e in method.pool}
    counts = []
    for step in range(1, 1001):
        ctx.step = step
        mixed = method.mix_batches(list(tiny.examples[:4]), ctx)
        assert len(mixed) == 4
        counts.append(sum(key(e) in pool for e in mixed))
    assert set(counts) == {0, 1}
    assert sum(counts) / 4000 == pytest.approx(0.1, abs=0.015)


def test_draws_depend_on_seed_step_and_micro_batch_only(tiny, tmp_path):
    _, method, ctx = prepared(tiny, "replay", tmp_path, rho=0.5)
    targets = tiny.examples[:8]
    ctx.step = 9
    torch.manual_seed(0)
    a = method.draw(8, ctx, 0)
    torch.manual_seed(1)
    assert method.draw(8, ctx, 0) == a
    assert method.draw(8, ctx, 1) != a
    ctx.step = 10
    assert method.draw(8, ctx, 0) != a
    # Micro-batches of one step are numbered in call order and restart at the next step.
    ctx.step = 11
    first = method.mix_batches(list(targets), ctx)
    second = method.mix_batches(list(targets), ctx)
    assert first[4:] == method.draw(8, ctx, 0) and second[4:] == method.draw(8, ctx, 1)


def test_labelled_replay_uses_gold_answers(tiny, tmp_path):
    _, method, ctx = prepared(tiny, "replay", tmp_path, rho=0.5, labelled=True)
    tok = tiny.tokenizer
    golds = {gold_response(dom.kind, item).strip() for dom in tiny.benchmark.retained.values()
             for item in dom.calibration}
    assert len(method.pool) == sum(len(dom.calibration) for dom in tiny.benchmark.retained.values()) == 12
    ctx.step = 1
    mixed = method.mix_batches(list(tiny.examples[:8]), ctx)
    for example in mixed[4:]:
        response = [t for t, l in zip(example["input_ids"], example["labels"]) if l != -100]
        assert response[-1] == tok.eos_token_id
        assert tok.decode(response[:-1]).strip() in golds
