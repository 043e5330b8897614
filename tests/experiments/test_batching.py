"""Length-grouped micro-batches hold the same examples and give the padded batch's loss, logits and gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

from experiments.batching import length_groups, logit_positions, sft_batches, sft_loss_sum, target_count, target_groups
from experiments.config import train_config
from experiments.prompts import collate
from experiments.train import train
from tests.experiments.test_train import setup

PAD = 0


def example(ids: list[int], n_prompt: int) -> dict:
    return {"input_ids": ids, "labels": [-100] * n_prompt + ids[n_prompt:]}


def positions(lengths, groups) -> int:
    return sum(len(g) * max(lengths[i] for i in g) for g in groups)


def brute_force_fewest_positions(lengths, max_groups) -> int:
    ls = sorted(lengths)
    best = len(ls) * ls[-1]
    for g in range(2, min(max_groups, len(ls)) + 1):
        for cuts in itertools.combinations(range(1, len(ls)), g - 1):
            bounds = [0, *cuts, len(ls)]
            best = min(best, sum((b - a) * ls[b - 1] for a, b in zip(bounds, bounds[1:])))
    return best


def test_length_groups_by_hand_and_against_brute_force():
    # sorted 1, 2, 3, 10, 11: two groups {1, 2, 3} (3 x 3) and {10, 11} (2 x 11) = 31 positions, against 55 padded
    assert length_groups([10, 2, 11, 1, 3], 2) == [[3, 1, 4], [0, 2]]
    assert length_groups([5, 5, 5], 3) == [[0, 1, 2]]  # nothing to save: one group
    assert length_groups([4, 7], 1) == [[0, 1]]
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        lengths = torch.randint(1, 60, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g).tolist()
        for k in (1, 2, 3, 4):
            groups = length_groups(lengths, k)
            assert sorted(i for grp in groups for i in grp) == list(range(len(lengths)))  # every example once
            assert len(groups) <= k
            assert positions(lengths, groups) == brute_force_fewest_positions(lengths, k)
    with pytest.raises(ValueError, match="max_groups=0"):
        length_groups([3], 0)


def tiny_model(arch: str, vocab: int = 64):
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, pad_token_id=PAD, attn_implementation="sdpa")
    torch.manual_seed(0)
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(sliding_window=None, **common))
    return Gemma2ForCausalLM(Gemma2Config(head_dim=8, **{**common, "attn_implementation": "eager"}))


def random_examples(n: int, vocab: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 30, (1,), generator=g))
        ids = torch.randint(1, vocab, (length,), generator=g).tolist()
        out.append(example(ids, int(torch.randint(2, length - 1, (1,), generator=g))))
    return out


@pytest.mark.parametrize("arch", ["qwen3", "llama", "mistral", "gemma2"])
def test_grouped_loss_equals_the_padded_batch_loss_and_gradients(arch):
    """A tiny random model of each backbone family in conf/backbone: transformers' own causal-LM loss on one
    right-padded batch against the sum of `sft_loss_sum` over 3 length groups divided by the target count."""
    model = tiny_model(arch).train()
    examples = random_examples(12, 64, seed=1)
    padded = collate(examples, PAD)
    groups = sft_batches(examples, PAD, 3)
    assert len(groups) == 3 and sum(len(g["input_ids"]) for g in groups) == 12
    assert sum(int(g["attention_mask"].sum()) for g in groups) == int(padded["attention_mask"].sum())
    assert sum(g["input_ids"].numel() for g in groups) < padded["input_ids"].numel()
    n = target_count(padded)
    assert n == sum(target_count(g) for g in groups) == sum(sum(l != -100 for l in e["labels"][1:]) for e in examples)

    def grads():
        out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        return out

    reference = model(**padded, use_cache=False).loss
    reference.backward()
    g_ref = grads()
    grouped = sum(sft_loss_sum(model, g) / n for g in groups)
    grouped.backward()
    torch.testing.assert_close(grouped, reference, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads(), g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the check can fail: the mean over each group's own targets (transformers' default) is another loss
    with torch.no_grad():
        per_group_mean = sum(model(**g, use_cache=False).loss for g in groups) / len(groups)
    assert abs(float(per_group_mean) - float(reference.detach())) > 1e-4


def test_target_groups_count_on_the_host_and_carry_the_logit_positions():
    """`target_groups`: the groups holding targets, their target and real-token counts, and each group's logit
    positions (computed before the move), with which `sft_loss_sum` gives the loss it computes without them."""
    examples = random_examples(10, 64, seed=3)
    groups = target_groups(examples, PAD, 3, torch.device("cpu"))
    assert len(groups.batches) == 3 and sum(len(b["input_ids"]) for b in groups.batches) == 10
    assert groups.targets == target_count(collate(examples, PAD))
    assert groups.tokens == sum(len(e["input_ids"]) for e in examples)
    model = tiny_model("qwen3").eval()
    for batch in groups.batches:
        nxt = batch["labels"][:, 1:]
        expected = [p for p in range(nxt.shape[1]) if bool((nxt[:, p] != -100).any())]
        assert batch["logit_positions"].tolist() == expected
        bare = {k: v for k, v in batch.items() if k != "logit_positions"}
        torch.testing.assert_close(logit_positions(bare), batch["logit_positions"], rtol=0, atol=0)
        with torch.no_grad():
            torch.testing.assert_close(sft_loss_sum(model, batch), sft_loss_sum(model, bare), rtol=0, atol=0)
    # a group without targets is left out, and its tokens are not counted
    long_without = example(list(range(1, 40)), 39)
    kept = target_groups(examples[:4] + [long_without], PAD, 5, torch.device("cpu"))  # one example per group
    assert len(kept.batches) == 4 and kept.tokens == sum(len(e["input_ids"]) for e in examples[:4])
    empty = target_groups([example([5, 6, 7], 3)], PAD, 3, torch.device("cpu"))
    assert empty.batches == [] and empty.targets == 0 and empty.tokens == 0


def test_target_count_and_a_batch_without_targets():
    batch = collate([example([1, 2, 3, 4], 2), example([5, 6, 7], 1)], PAD)
    assert target_count(batch) == 4  # 3, 4 and 6, 7
    with pytest.raises(ValueError, match="no targets"):
        sft_loss_sum(torch.nn.Identity(), collate([example([1, 2], 2)], PAD))


@pytest.mark.trains
def test_training_in_length_groups_follows_one_padded_batch(tiny_backbone_dir, tmp_path):
    """`train()` itself, LoRA on the tiny backbone: one padded group against 3 length groups from the same start.
    The first step's loss is the same number and 6 steps later the losses agree to float rounding's drift."""
    runs = {}
    for groups in (1, 3):
        model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path / str(groups))
        cfg = train_config(steps=6, lr=5e-3, batch_size=8, grad_accum=1, checkpoint_every=100, progress=False,
                           length_groups=groups)
        runs[groups] = train(model, method, examples, ctx, cfg)
    assert runs[3].tokens_seen == runs[1].tokens_seen
    assert runs[3].losses[0] == pytest.approx(runs[1].losses[0], rel=1e-6)
    assert runs[3].losses == pytest.approx(runs[1].losses, rel=1e-4)


@pytest.mark.trains
def test_examples_without_targets_add_nothing_and_a_batch_of_only_those_is_refused(tiny_backbone_dir, tmp_path):
    """Examples whose labels are all -100 (nothing to predict) change neither the loss nor the gradients: a run
    with them mixed in follows the run without them step for step; a micro-batch of only such examples is refused."""
    runs = {}
    for mixed in (False, True):
        model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path / f"mixed{mixed}")
        if mixed:  # every second example also comes as a prompt-only copy, so groups of only those occur
            examples = [e for ex in examples for e in (ex, {"input_ids": ex["input_ids"][:5], "labels": [-100] * 5})]
        cfg = train_config(steps=1, lr=5e-3, batch_size=len(examples), grad_accum=1, checkpoint_every=100,
                           progress=False, length_groups=3)
        runs[mixed] = train(model, method, examples, ctx, cfg)
    assert runs[True].losses[0] == pytest.approx(runs[False].losses[0], rel=1e-6)
    model, method, examples, ctx, tok = setup(tiny_backbone_dir, tmp_path / "none")
    empty = [{"input_ids": e["input_ids"], "labels": [-100] * len(e["input_ids"])} for e in examples]
    with pytest.raises(ValueError, match="has a response token to train on"):
        train(model, method, empty, ctx, train_config(steps=1, lr=5e-3, batch_size=4, grad_accum=1, progress=False))
