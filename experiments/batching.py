"""Length-grouped micro-batches and the SFT loss computed only where there are targets.

Two costs of a right-padded SFT batch are work on positions that never enter the loss:
- padding: every row is as long as the batch's longest example (on the micro benchmark a batch of 16 random
  examples is 72% real tokens). `length_groups` sorts a micro-batch's examples by length and cuts them into at
  most `max_groups` contiguous groups with the fewest padded positions in total (an exact dynamic program); each
  group is one forward and backward (3 groups: 92% real tokens on the same batches).
- prompt positions: the logits (a vocabulary-wide matrix product, a log-softmax and their backward) are needed
  only at positions whose next token is a target (16% of positions on the micro benchmark, whose prompts are
  long). `sft_loss_sum` asks the model for the logits of those positions only (`logits_to_keep`).

The loss of a micro-batch stays the mean token cross-entropy over its targets: each group contributes its sum
divided by the micro-batch's target count. Same examples per step, same loss and gradients, up to float rounding.
Written here because the training libraries' length grouping (transformers' `group_by_length`) orders a whole
dataset into batches of similar length, which changes which examples share a step.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from experiments.prompts import collate

IGNORE = -100


def length_groups(lengths: Sequence[int], max_groups: int) -> list[list[int]]:
    """Indices of the examples per group: sorted by length (ties by index), cut into at most `max_groups`
    contiguous runs minimising sum(group size x longest length in the group), the positions computed."""
    if max_groups < 1:
        raise ValueError(f"length_groups: max_groups={max_groups}; must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n, g_max = len(order), min(max_groups, len(order))
    ls = [lengths[i] for i in order]
    inf = float("inf")
    # cost[g][j]: fewest positions for the first j sorted examples in g groups; cut[g][j]: where the last group starts
    cost = [[inf] * (n + 1) for _ in range(g_max + 1)]
    cut = [[0] * (n + 1) for _ in range(g_max + 1)]
    cost[0][0] = 0
    for g in range(1, g_max + 1):
        for j in range(1, n + 1):
            for i in range(g - 1, j):  # the last group is sorted examples i .. j - 1, its width ls[j - 1]
                c = cost[g - 1][i] + (j - i) * ls[j - 1]
                if c < cost[g][j]:
                    cost[g][j], cut[g][j] = c, i
    best = min(range(1, g_max + 1), key=lambda g: (cost[g][n], g))
    groups, j = [], n
    for g in range(best, 0, -1):
        i = cut[g][j]
        groups.append(order[i:j])
        j = i
    return groups[::-1]


def sft_batches(examples: Sequence[dict[str, list[int]]], pad_id: int, max_groups: int) -> list[dict[str, torch.Tensor]]:
    """The micro-batch as right-padded groups (`length_groups`), each with `input_ids`, `attention_mask`, `labels`, on
    the host."""
    if not examples:
        raise ValueError("sft_batches: no examples")
    groups = length_groups([len(e["input_ids"]) for e in examples], max_groups)
    return [collate([examples[i] for i in group], pad_id) for group in groups]


class TargetGroups(NamedTuple):
    """A micro-batch ready for the loop: its length groups that hold targets, each a dict on the device with
    `input_ids`, `attention_mask`, `labels` and `logit_positions` (where `sft_loss_sum` needs logits); the
    micro-batch's target count and real (unpadded) token count, both counted on the host."""

    batches: list[dict[str, torch.Tensor]]
    targets: int
    tokens: int


def target_groups(examples: Sequence[dict[str, list[int]]], pad_id: int, max_groups: int,
                  device: torch.device) -> TargetGroups:
    """The micro-batch's `sft_batches` groups that hold targets, moved to `device`, with the counts the loop needs.
    A group of examples without response tokens adds nothing to the loss and is left out; none left gives no batches
    and 0 targets.

    Everything that depends on the values is computed on the host before the move (the target count, the positions
    whose logits are needed, the token count) and the move does not wait (`non_blocking`), so on an accelerator
    preparing a micro-batch never makes the host wait for the device (`bench.host_syncs` counts such waits)."""
    batches, targets, tokens = [], 0, 0
    for group in sft_batches(examples, pad_id, max_groups):
        count = target_count(group)
        if count:
            targets += count
            tokens += int(group["attention_mask"].sum())
            group["logit_positions"] = logit_positions(group)
            batches.append({k: v.to(device, non_blocking=True) for k, v in group.items()})
    return TargetGroups(batches, targets, tokens)


def target_count(batch: dict[str, torch.Tensor]) -> int:
    """How many next-token targets (labels != -100 after the first position) a batch holds."""
    return int((batch["labels"][:, 1:] != IGNORE).sum())


def logit_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(m,) the positions p, ascending, where some row's label at p + 1 is a target: where the logits are needed."""
    return (batch["labels"][:, 1:] != IGNORE).any(0).nonzero().squeeze(1)


def sft_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed token cross-entropy (nats) of the model's next-token predictions at the batch's targets.

    The logits are computed only at positions p where some row's label at p + 1 is a target (the model's
    `logits_to_keep` with a position index: the batch's `logit_positions` when it has them, as `target_groups` gives
    them, else computed here), in float32 as transformers' causal-LM loss does."""
    labels = batch["labels"]
    nxt = labels[:, 1:]
    keep = batch["logit_positions"] if "logit_positions" in batch else logit_positions(batch)
    if keep.numel() == 0:
        raise ValueError("sft_loss_sum: the batch has no targets")
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=keep,
                use_cache=False)
    logits = out.logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), nxt[:, keep].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")
