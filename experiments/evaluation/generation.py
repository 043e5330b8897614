"""Batched generation with `model.generate`: greedy, or sampled with one random stream per prompt.

Prompts are tokenised without special tokens and cut by `experiments.prompts.split_boundary`
(as `experiments.prompts.encode_pair` does for training: trailing whitespace is the response's), sorted by length, left-padded and generated in batches; results come back in the
caller's order. Generation stops at the end-of-sequence token(s) or after `max_new_tokens`.

Sampling and batch independence
-------------------------------
`generate(do_sample=True)` draws every row of a batch from the one global torch RNG, so the
sample a prompt gets depends on which prompts share its batch and in what order batches run.
Here sampling is done instead by the Gumbel-max trick: `GumbelNoise` adds Gumbel(0, 1) noise
from a per-row `torch.Generator` (seeded from the run seed, the prompt text and the sample index)
to the temperature-scaled (and optionally nucleus-filtered) logits, and `generate` then takes
the argmax, which is an exact draw from softmax(logits / T). A prompt's sample is therefore a
function of (seed, prompt, sample index) only: the same whatever the batch size, the batch
neighbours or the batch order. The one residue is floating point: padding changes the shape
of the batched matmuls, which can move logits in the last bits and, at a near-tie, the sampled
token. Greedy decoding uses no randomness at all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from experiments import prompts as P
from experiments.progress import progress_bar


@dataclass
class GenerationOutput:
    """Responses in the order of the prompts given.

    `token_ids[i]` are the generated tokens of response i, up to and including the first
    end-of-sequence token when one was generated (it is part of what the model chose);
    `texts[i]` is their decoding without special tokens, as a response to the full prompt text
    (`prompts.response_text`: the whitespace the prompt ended in is not repeated); `stopped[i]` says whether the response
    ended with end-of-sequence (False: cut by `max_new_tokens`).
    """

    texts: list[str]
    token_ids: list[list[int]]
    stopped: list[bool]


class GumbelNoise(LogitsProcessor):
    """Adds Gumbel(0, 1) noise from one `torch.Generator` per row, so that argmax = a categorical sample.

    Hand-written because transformers' sampler draws all rows from the global RNG (see the module
    docstring); nothing in transformers offers per-row random streams.
    """

    def __init__(self, seeds: Sequence[int], device: torch.device):
        self.generators = []
        for seed in seeds:
            g = torch.Generator(device=device)
            g.manual_seed(int(seed))
            self.generators.append(g)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"GumbelNoise built for {len(self.generators)} rows, got scores for {scores.shape[0]}")
        noise = torch.empty_like(scores, dtype=torch.float32)
        for row, g in enumerate(self.generators):
            # u in (0, 1]: -log(-log(u)) is finite except at u == 1, where it is +inf; avoid both ends.
            u = torch.rand(scores.shape[1], generator=g, device=scores.device, dtype=torch.float32)
            u = u.clamp_(min=torch.finfo(torch.float32).tiny, max=1.0 - torch.finfo(torch.float32).eps)
            noise[row] = -torch.log(-torch.log(u))
        return scores.float() + noise


def sample_seed(seed: int, prompt: str, sample_index: int = 0) -> int:
    """The seed of one prompt's random stream: a function of the run seed, the prompt text and the sample index."""
    digest = hashlib.sha256(f"{int(seed)}\x1f{sample_index}\x1f{prompt}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token id that ends a response: the tokenizer's eos and the model's generation-config eos ids."""
    ids: list[int] = []
    gen_cfg = getattr(model, "generation_config", None)
    model_eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(model_eos, int):
        ids.append(model_eos)
    elif model_eos is not None:
        ids.extend(int(i) for i in model_eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config defines an eos token")
    return ids


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, falling back to its eos id."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer defines neither a pad nor an eos token")
    return int(pad)


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Prompt token ids without special tokens, cut by `experiments.prompts.split_boundary` (as training is)."""
    return [P.encode_prompt(tokenizer, p) for p in prompts]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded `input_ids` and `attention_mask` for a batch of token id lists."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    sample_indices: Optional[Sequence[int]] = None,
    batch_size: int = 16,
    progress: bool = False,
    desc: str = "generate",
) -> GenerationOutput:
    """Generate one response per prompt (prompt strings are used as given: template them first).

    Greedy when `do_sample` is False. Sampled otherwise: temperature `temperature`, nucleus
    `top_p` (1.0 = off), one random stream per prompt seeded by `sample_seed(seed, prompt, k)`,
    where k is `sample_indices[i]` (default: how many times the same prompt text occurred before
    in `prompts`, so repeated prompts get distinct samples).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    n = len(prompts)
    if n == 0:
        return GenerationOutput(texts=[], token_ids=[], stopped=[])
    if sample_indices is None:
        seen: dict[str, int] = {}
        sample_indices = []
        for p in prompts:
            sample_indices.append(seen.get(p, 0))
            seen[p] = seen.get(p, 0) + 1
    elif len(sample_indices) != n:
        raise ValueError(f"sample_indices has {len(sample_indices)} entries for {n} prompts")

    device = model_device(model)
    pad_id = pad_token_id(tokenizer)
    eos_ids = eos_token_ids(model, tokenizer)
    encoded = encode_prompts(tokenizer, prompts)
    if any(len(e) == 0 for e in encoded):
        raise ValueError("an empty prompt cannot be generated from (it has no tokens)")
    order = sorted(range(n), key=lambda i: (len(encoded[i]), i))
    gen_cfg = GenerationConfig(
        max_new_tokens=int(max_new_tokens),
        do_sample=False,  # sampling, when asked for, is the argmax over Gumbel-perturbed logits
        num_beams=1,
        repetition_penalty=1.0,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    results: list[Optional[tuple[list[int], bool]]] = [None] * n
    was_training = model.training
    model.eval()
    bar = progress_bar(total=n, desc=desc, disable=not progress, leave=False)
    try:
        for start in range(0, n, batch_size):
            rows = order[start:start + batch_size]
            input_ids, attention_mask = left_pad([encoded[i] for i in rows], pad_id, device)
            processors = LogitsProcessorList()
            if do_sample:
                if temperature != 1.0:
                    processors.append(TemperatureLogitsWarper(float(temperature)))
                if top_p < 1.0:
                    processors.append(TopPLogitsWarper(float(top_p)))
                seeds = [sample_seed(seed, prompts[i], sample_indices[i]) for i in rows]
                processors.append(GumbelNoise(seeds, device))
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=gen_cfg,
                logits_processor=processors,
            )
            new_tokens = out[:, input_ids.shape[1]:].tolist()
            for row, i in enumerate(rows):
                results[i] = _cut_at_eos(new_tokens[row], eos_ids)
            bar.update(len(rows))
    finally:
        bar.close()
        model.train(was_training)
    token_ids = [r[0] for r in results]  # type: ignore[index]
    stopped = [r[1] for r in results]  # type: ignore[index]
    texts = tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    texts = [P.response_text(prompt, text) for prompt, text in zip(prompts, texts)]
    return GenerationOutput(texts=texts, token_ids=token_ids, stopped=stopped)


def _cut_at_eos(tokens: list[int], eos_ids: Sequence[int]) -> tuple[list[int], bool]:
    eos = set(eos_ids)
    for pos, t in enumerate(tokens):
        if t in eos:
            return tokens[: pos + 1], True
    return tokens, False
