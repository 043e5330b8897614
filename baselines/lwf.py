"""LwF / KL-to-base (Li & Hoiem, ECCV 2016, arXiv 1606.09282) on retained calibration data.

Loss = L_task + lambda * mean over response tokens t of KL(p_base(. | x, y_<t) || p_theta(. | x, y_<t))

on a batch of retained calibration prompts x with the base's own responses y (reference cache),
drawn per micro-batch from a generator seeded by (seed, step, micro-batch). The base
log-probabilities are the reference cache's (`CachedLogprobs`): the full vocabulary, or the top-k
plus one tail bucket, in which case the term is the KL between the (k+1)-outcome coarsenings
(a lower bound of the full KL; `experiments.evaluation.retained_kl`). The per-token KL is the
evaluation's own (`CachedLogprobs.per_token_kl`), so the training term and the reported
`kl_token_mean` are the same quantity, and the term is 0 for the base model. No frozen base copy
is kept in memory. Knob: lwf_lambda.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from baselines.common import MicroCounter, step_generator
from baselines.lora import LoRA, LoRAParams
from experiments.calibration import calibration_pairs
from experiments.methods import RunContext, is_int, require


def response_logits(model: torch.nn.Module, pairs, pad_id: int, device) -> list[torch.Tensor]:
    """Per pair, the model's [len(response), V] logits at the positions that predict its response tokens."""
    width = max(len(p.prompt_ids) + len(p.response_ids) for p in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for b, p in enumerate(pairs):
        seq = p.prompt_ids + p.response_ids
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
    # Only positions from the shortest prompt's last token on predict response tokens: keep those logits.
    offset = min(len(p.prompt_ids) for p in pairs) - 1
    logits = model(input_ids=ids.to(device, non_blocking=True), attention_mask=mask.to(device, non_blocking=True),
                   logits_to_keep=width - offset).logits
    out = []
    for b, p in enumerate(pairs):
        start = len(p.prompt_ids) - 1 - offset  # position t predicts token t + 1
        out.append(logits[b, start: start + len(p.response_ids)])
    return out


def kl_to_cached_base(model: torch.nn.Module, pairs, reference, pad_id: int, device) -> torch.Tensor:
    """[sum of response lengths] per-token KL(base || model) of `pairs`, base log-probs from the reference cache."""
    parts = []
    for pair, logits in zip(pairs, response_logits(model, pairs, pad_id, device)):
        cached = reference.domains[pair.domain].split("calibration").logprobs
        rows = cached.rows([pair.index])[: len(pair.response_ids)]
        parts.append(cached.per_token_kl(rows, torch.log_softmax(logits.float(), dim=-1)))
    return torch.cat(parts)


@dataclass(kw_only=True)
class LwFParams(LoRAParams):
    """LoRA's, plus the distillation weight `lwf_lambda` and the retained pairs per micro-batch (`batch_size`)."""

    lwf_lambda: float
    batch_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        require("lwf_lambda", self.lwf_lambda, self.lwf_lambda >= 0, ">= 0")
        require("batch_size", self.batch_size, is_int(self.batch_size) and self.batch_size > 0, "an integer > 0")


class LwF(LoRA):
    """LoRA with lambda * KL(base || model) on retained calibration responses."""

    Params = LwFParams
    params: LwFParams

    def __init__(self, params: LwFParams) -> None:
        super().__init__(params)
        self.pairs = []
        self._micro = MicroCounter()

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        self.pairs = calibration_pairs(ctx)
        return super().prepare(model, ctx)

    def draw(self, ctx: RunContext, index: int):
        """The retained pairs of micro-batch `index` of step `ctx.step`."""
        g = step_generator(ctx.seed, ctx.step, index, "lwf")
        n = len(self.pairs)
        picks = torch.randperm(n, generator=g)[: min(self.params.batch_size, n)].tolist()
        return [self.pairs[i] for i in picks]

    def kl_term(self, model: torch.nn.Module, ctx: RunContext, pairs) -> torch.Tensor:
        """Mean over the response tokens of `pairs` of KL(base || model) (unweighted)."""
        return kl_to_cached_base(model, pairs, ctx.reference(), ctx.tokenizer.pad_token_id, ctx.device).mean()

    def extra_loss(self, model: torch.nn.Module, batch: dict, ctx: RunContext) -> Optional[torch.Tensor]:
        index = self._micro.next(ctx.step)
        if self.params.lwf_lambda == 0:
            return None
        return self.params.lwf_lambda * self.kl_term(model, ctx, self.draw(ctx, index))
