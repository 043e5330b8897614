"""Teacher-forced log-probabilities of responses given prompts, and multiple-choice scoring.

Each batch is one forward pass over right-padded prompt+response sequences. Only the logits
that predict response tokens are materialised (`logits_to_keep` drops the shared prompt prefix
positions, a boolean mask picks the response positions), so the cost in memory is
(response tokens x vocabulary), not (sequence x vocabulary), and no Python loop runs over tokens.
Rows are sorted by length before batching (less padding); results come back in the caller's order.

Multiple choice follows lm-evaluation-harness: each choice is scored by the log-likelihood of
its continuation `prompts.choice_continuation(choice)` (" " + text) after the prompt; the raw
choice is the argmax of the summed log-likelihood, the normalised choice the argmax of the sum
divided by the choice text's length in characters (lm-eval's `acc_norm`: `len(choice)` of the
choice strings; its byte-normalised `acc_bytes` is not used). Ties go to the lowest index, as
`numpy.argmax` does. Prompt and continuation are cut by `prompts.split_boundary` and tokenised
separately, as `prompts.encode_pair` does for training, so the scored tokens are the ones the
model trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch

from experiments import prompts as P
from experiments.evaluation.generation import encode_prompts, model_device, pad_token_id
from experiments.progress import progress_bar


@dataclass
class ResponseBatch:
    """Log-probabilities of one batch of responses, response tokens only, concatenated in row order.

    `indices[b]` is the position of row b in the caller's lists, `lengths[b]` its response
    length; `logprobs` is [sum(lengths), vocab] float32 log-softmax of the model's next-token
    distribution at each response token, `targets` [sum(lengths)] the response tokens themselves.
    """

    indices: list[int]
    lengths: list[int]
    logprobs: torch.Tensor
    targets: torch.Tensor

    def token_logprobs(self) -> torch.Tensor:
        """[sum(lengths)] log p(response token) under the model."""
        return self.logprobs.gather(-1, self.targets.unsqueeze(-1)).squeeze(-1)

    def split(self, per_token: torch.Tensor) -> list[torch.Tensor]:
        """Split a per-token tensor of this batch back into one tensor per row."""
        return list(torch.split(per_token, self.lengths))


def length_order(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[int]:
    """Row order used for batching: by total length, then by index (deterministic)."""
    return sorted(range(len(prompt_ids)), key=lambda i: (len(prompt_ids[i]) + len(response_ids[i]), i))


@torch.no_grad()
def iter_response_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    batch_size: int,
    progress: bool = False,
    desc: str = "score",
) -> Iterator[ResponseBatch]:
    """Yield the model's log-probabilities at every response token, one batch (one forward) at a time."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    device = model_device(model)
    order = length_order(prompt_ids, response_ids)
    was_training = model.training
    model.eval()
    bar = progress_bar(total=len(order), desc=desc, disable=not progress, leave=False)
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            p_len = torch.tensor([len(prompt_ids[i]) for i in rows])
            r_len = torch.tensor([len(response_ids[i]) for i in rows])
            width = int((p_len + r_len).max())
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for b, i in enumerate(rows):
                seq = list(prompt_ids[i]) + list(response_ids[i])
                ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[b, : len(seq)] = 1
            # Position t predicts token t + 1; the first response token is predicted at p_len - 1.
            offset = int(p_len.min()) - 1
            keep = width - offset
            logits = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=keep
            ).logits
            if logits.shape[1] != keep:
                raise RuntimeError(f"model returned {logits.shape[1]} logit positions, expected {keep}")
            predicted = torch.arange(offset + 1, offset + 1 + keep)  # absolute position of the predicted token
            in_response = (predicted[None, :] >= p_len[:, None]) & (predicted[None, :] < (p_len + r_len)[:, None])
            targets = torch.cat([ids[:, offset + 1:], torch.full((len(rows), 1), pad_id)], dim=1)
            sel = in_response.to(logits.device)
            logprobs = torch.log_softmax(logits[sel].float(), dim=-1)
            yield ResponseBatch(
                indices=list(rows),
                lengths=r_len.tolist(),
                logprobs=logprobs,
                targets=targets[in_response].to(logprobs.device),
            )
            bar.update(len(rows))
    finally:
        bar.close()
        model.train(was_training)


def response_token_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    batch_size: int,
    progress: bool = False,
) -> list[torch.Tensor]:
    """Per response, the [len(response)] log-probabilities of its tokens (CPU float32), in the caller's order."""
    out: list[Optional[torch.Tensor]] = [None] * len(prompt_ids)
    for batch in iter_response_logprobs(
        model, prompt_ids, response_ids, pad_id=pad_id, batch_size=batch_size, progress=progress
    ):
        for i, lp in zip(batch.indices, batch.split(batch.token_logprobs())):
            out[i] = lp.cpu()
    return out  # type: ignore[return-value]


@dataclass
class ChoiceScores:
    """Per item: each choice's summed log-likelihood, its character length, and the chosen indices."""

    loglik: list[list[float]]
    char_lengths: list[list[int]]
    choice: list[int]
    choice_norm: list[int]


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the lowest index on ties (numpy.argmax semantics)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def choose(loglik: Sequence[float], choices: Sequence[str]) -> tuple[int, int]:
    """(raw choice, character-normalised choice) from per-choice log-likelihoods."""
    norm = [ll / max(len(c), 1) for ll, c in zip(loglik, choices)]
    return _argmax(loglik), _argmax(norm)


def score_choices(
    model: Any,
    tokenizer: Any,
    items: Sequence[dict],
    *,
    chat_template: bool,
    batch_size: int,
    progress: bool = False,
) -> ChoiceScores:
    """Score every choice of every multiple-choice item (prompt from `prompts.choice_prompt`)."""
    contexts = [P.apply_template(tokenizer, P.choice_prompt(item), chat_template) for item in items]
    context_ids = encode_prompts(tokenizer, contexts)
    flat_prompts: list[list[int]] = []
    flat_conts: list[list[int]] = []
    owner: list[tuple[int, int]] = []
    for i, item in enumerate(items):
        if not item["choices"]:
            raise ValueError(f"item {item.get('id', i)!r} has no choices")
        conts = [P.encode_response(tokenizer, contexts[i], P.choice_continuation(c)) for c in item["choices"]]
        for j, cont in enumerate(conts):
            flat_prompts.append(context_ids[i])
            flat_conts.append(cont)
            owner.append((i, j))
    per_token = response_token_logprobs(
        model, flat_prompts, flat_conts, pad_id=pad_token_id(tokenizer), batch_size=batch_size, progress=progress
    )
    loglik: list[list[float]] = [[0.0] * len(item["choices"]) for item in items]
    for (i, j), lp in zip(owner, per_token):
        loglik[i][j] = float(lp.double().sum())
    chosen = [choose(ll, item["choices"]) for ll, item in zip(loglik, items)]
    return ChoiceScores(
        loglik=loglik,
        char_lengths=[[len(c) for c in item["choices"]] for item in items],
        choice=[c[0] for c in chosen],
        choice_norm=[c[1] for c in chosen],
    )
