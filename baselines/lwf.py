"""LwF (Li & Hoiem, ECCV 2016, arXiv 1606.09282) on a LoRA update, and its retained-prompts variant.

`distill_on: target` (`lwf`, the authors' method): the old model's outputs on the NEW task's inputs, the current
model distilled toward them, no old-task data:

    L = L_task + lwf_lambda * mean over the micro-batch's response tokens t of
            KL(softmax(z_base(x, y_<t) / T) || softmax(z_theta(x, y_<t) / T))

on the target examples the training loop is training on (remembered in `mix_batches`), at the positions the task
loss is taken on. The base ("old model") is the model with its LoRA adapter disabled, run without gradients and
in eval mode (no dropout: the authors record the old responses with the evaluation pass); at init (B = 0) it is
the trained model, so the term is 0. T = `temperature` (2 in the paper and in avalanche); no T^2 factor
(avalanche's `LearningWithoutForgetting`, the authors' MatConvNet loss). Adaptation: one new task and a language
model, so the "old task's outputs" are the base's next-token distributions over the whole vocabulary at the
response positions, the outputs the task loss reads (avalanche distils the same logits its cross-entropy reads).

`distill_on: retained` (`lwf_retained`, a stronger variant with replay-level data access), temperature 1:

    L = L_task + lwf_lambda * mean over response tokens t of KL(p_base(. | x, y_<t) || p_theta(. | x, y_<t))

on a batch of retained calibration prompts x with the base's own responses y (reference cache),
drawn per micro-batch from a generator seeded by (seed, step, micro-batch). The base
log-probabilities are the reference cache's (`CachedLogprobs`): the full vocabulary, or the top-k
plus one tail bucket, in which case the term is the KL between the (k+1)-outcome coarsenings
(a lower bound of the full KL; `experiments.evaluation.retained_kl`). The per-token KL is the
evaluation's own (`CachedLogprobs.per_token_kl`), so the training term and the reported
`kl_token_mean` are the same quantity, and the term is 0 for the base model. No frozen base copy
is kept in memory. Knob (both): lwf_lambda.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from baselines.common import MicroCounter, step_generator
from baselines.lora import LoRA, LoRAParams
from experiments.batching import IGNORE, target_groups
from experiments.calibration import calibration_pairs
from experiments.methods import RunContext, is_int, require

DISTILL_ON = ("target", "retained")
#: At most this many length groups per distillation pass (as conf/train/default.yaml's `train.length_groups`): the
#: grouping changes only the padded positions computed, not the term.
LENGTH_GROUPS = 3


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


@contextmanager
def base_model(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` (a peft model) as the base: its adapter disabled, in eval mode (no dropout), without gradients. The
    modules' train/eval flags are restored on exit."""
    training = [m for m in model.modules() if m.training]
    model.eval()
    try:
        with torch.no_grad(), model.disable_adapter():
            yield model
    finally:
        for m in training:
            m.train()


def target_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n, V] float32 logits of `model` at the batch's n next-token targets (labels != -100 at p + 1), row-major."""
    keep = batch["logit_positions"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=keep,
                   use_cache=False).logits
    return logits[batch["labels"][:, 1:][:, keep] != IGNORE].float()


def softened_kl(base_logits: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[n] KL(softmax(base / T) || softmax(logits / T)) per row, nats (no T^2 factor)."""
    p = torch.log_softmax(base_logits.float() / temperature, dim=-1)
    q = torch.log_softmax(logits.float() / temperature, dim=-1)
    return (p.exp() * (p - q)).sum(-1)


def kl_to_base_on_targets(model: torch.nn.Module, examples: Sequence[dict], pad_id: int, device,
                          temperature: float) -> torch.Tensor:
    """Mean over the response tokens of `examples` (encoded target pairs) of KL(base_T || model_T) (`softened_kl`),
    the base being `model` with its adapter disabled (`base_model`)."""
    groups = target_groups(examples, pad_id, LENGTH_GROUPS, device)
    if not groups.batches:
        raise ValueError(f"lwf: none of the micro-batch's {len(examples)} examples has a response token")
    total = None
    for batch in groups.batches:
        with base_model(model):
            base = target_logits(model, batch)
        part = softened_kl(base, target_logits(model, batch), temperature).sum()
        total = part if total is None else total + part
    return total / groups.targets


@dataclass(kw_only=True)
class LwFParams(LoRAParams):
    """LoRA's, plus the distillation weight `lwf_lambda`, what the term reads (`distill_on`: the target micro-batch
    or retained calibration pairs), the softmax `temperature` T, and the retained pairs per micro-batch
    (`batch_size`, with `distill_on: retained` only)."""

    lwf_lambda: float
    distill_on: str
    temperature: float
    batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require("lwf_lambda", self.lwf_lambda, self.lwf_lambda >= 0, ">= 0")
        require("distill_on", self.distill_on, self.distill_on in DISTILL_ON, f"one of {list(DISTILL_ON)}")
        require("temperature", self.temperature, isinstance(self.temperature, (int, float))
                and not isinstance(self.temperature, bool) and math.isfinite(self.temperature)
                and self.temperature > 0, "a finite number > 0")
        if self.distill_on == "retained":
            require("batch_size", self.batch_size, is_int(self.batch_size) and self.batch_size > 0, "an integer > 0")
            require("temperature", self.temperature, self.temperature == 1.0,
                    "1.0 with distill_on: retained (the reference cache holds the base's log-probs at T = 1, top-k "
                    "+ tail where so cached)")
        else:
            require("batch_size", self.batch_size, self.batch_size is None,
                    "null with distill_on: target (the term reads the training micro-batch)")


class LwF(LoRA):
    """LoRA with lambda * KL(base_T || model_T) on the target micro-batch's response tokens (`distill_on: target`),
    or with lambda * KL(base || model) on retained calibration responses (`distill_on: retained`)."""

    Params = LwFParams
    params: LwFParams

    def __init__(self, params: LwFParams) -> None:
        super().__init__(params)
        self.pairs = []
        self._micro = MicroCounter()
        self._examples: Optional[list[dict]] = None

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        if self.params.distill_on == "retained":
            self.pairs = calibration_pairs(ctx)
        return super().prepare(model, ctx)

    def mix_batches(self, examples: list[dict], ctx: RunContext) -> list[dict]:
        """The micro-batch unchanged; its examples are what the next `extra_loss` distils on (`distill_on: target`)."""
        self._examples = list(examples)
        return examples

    def draw(self, ctx: RunContext, index: int):
        """The retained pairs of micro-batch `index` of step `ctx.step`."""
        g = step_generator(ctx.seed, ctx.step, index, "lwf")
        n = len(self.pairs)
        picks = torch.randperm(n, generator=g)[: min(self.params.batch_size, n)].tolist()
        return [self.pairs[i] for i in picks]

    def kl_term(self, model: torch.nn.Module, ctx: RunContext, pairs) -> torch.Tensor:
        """Mean over the response tokens of `pairs` of KL(base || model) (unweighted)."""
        return kl_to_cached_base(model, pairs, ctx.reference(), ctx.tokenizer.pad_token_id, ctx.device).mean()

    def target_term(self, model: torch.nn.Module, ctx: RunContext, examples: Sequence[dict]) -> torch.Tensor:
        """Mean over the response tokens of `examples` of KL(base_T || model_T) (unweighted)."""
        return kl_to_base_on_targets(model, examples, ctx.tokenizer.pad_token_id, ctx.device,
                                     self.params.temperature)

    def extra_loss(self, model: torch.nn.Module, batch: dict, ctx: RunContext) -> Optional[torch.Tensor]:
        index = self._micro.next(ctx.step)
        examples, self._examples = self._examples, None
        if self.params.lwf_lambda == 0:
            return None
        if self.params.distill_on == "retained":
            return self.params.lwf_lambda * self.kl_term(model, ctx, self.draw(ctx, index))
        if examples is None:
            raise RuntimeError("lwf: extra_loss without the micro-batch (mix_batches was not called before it)")
        return self.params.lwf_lambda * self.target_term(model, ctx, examples)
