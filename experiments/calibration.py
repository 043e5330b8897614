"""The data methods may fit statistics on: retained calibration pairs and encoded target examples.

Every method reads retained data only from the calibration split: the base model's own responses
(token ids, from the reference cache) or the benchmark's calibration items with their gold answers.
Sequences are cut at the run's `ctx.max_length` exactly as `experiments.prompts.encode_pair` cuts
training examples, so a statistic never sees a sequence longer than the training loop does.
`held_out_sequences` gives what diagnostics measure on instead: the evaluation split, which no statistic reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from experiments import prompts


@dataclass
class CalibrationPair:
    """One retained calibration prompt and the base's cached response to it (token ids)."""

    domain: str
    index: int
    prompt_ids: list[int]
    response_ids: list[int]


def truncate_pair(prompt_ids: Sequence[int], response_ids: Sequence[int], max_length: int) -> tuple[list[int], list[int]]:
    """Cut like `prompts.encode_pair`: keep the prompt's end, cut the response's tail."""
    p, r = list(prompt_ids), list(response_ids)
    if len(p) >= max_length:
        p = p[-(max_length // 2):]
    return p, r[: max_length - len(p)]


def reference_pairs(reference: Any, max_length: Optional[int] = None, drop_empty: bool = True,
                    sort_domains: bool = True, split: str = "calibration") -> list[CalibrationPair]:
    """Every prompt of the cache's `split` (calibration unless told) with the base's response, domains in name
    order (in the cache's order with `sort_domains=False`), items in split order.

    With `drop_empty`, pairs whose (truncated) response is empty are dropped: they carry no response token.
    """
    out = []
    for name in (sorted(reference.domains) if sort_domains else reference.domains):
        part = reference.domains[name].split(split)
        for i, (p, r) in enumerate(zip(part.prompt_ids, part.response_ids)):
            if max_length is not None:
                p, r = truncate_pair(p, r, max_length)
            if len(p) and (len(r) or not drop_empty):
                out.append(CalibrationPair(name, i, list(p), list(r)))
    if not out:
        raise ValueError(f"the reference cache holds no retained {split} responses")
    return out


def calibration_pairs(ctx: Any) -> list[CalibrationPair]:
    """The run's retained calibration pairs (protected domains only), cut at `ctx.max_length`."""
    return reference_pairs(ctx.reference(), ctx.max_length)


def pair_example(pair: CalibrationPair) -> dict[str, list[int]]:
    """An encoded training example (loss on the response tokens) from a calibration pair."""
    return {"input_ids": pair.prompt_ids + pair.response_ids,
            "labels": [-100] * len(pair.prompt_ids) + pair.response_ids}


def labelled_calibration_examples(ctx: Any) -> list[dict[str, list[int]]]:
    """Calibration items of every protected retained domain with their gold answers, templated as everywhere else."""
    out = []
    for name in ctx.benchmark.protected:
        dom = ctx.benchmark.retained[name]
        for item in dom.calibration:
            prompt = prompts.apply_template(ctx.tokenizer, prompts.retained_prompt(dom.kind, item), ctx.chat_template)
            out.append(prompts.encode_pair(ctx.tokenizer, prompt, prompts.gold_response(dom.kind, item), ctx.max_length))
    if not out:
        raise ValueError("the benchmark has no retained calibration items")
    return out


def target_examples(ctx: Any, limit: Optional[int] = None, seed: int = 0) -> list[dict[str, list[int]]]:
    """Encoded target training examples (as the training loop sees them); a seeded subset of `limit` when set."""
    items = seeded_subset(list(ctx.benchmark.target_train), limit, seed)
    return [encode_target_item(ctx.tokenizer, item, ctx.chat_template, ctx.max_length) for item in items]


def seeded_subset(items: list, limit: Optional[int], seed: int) -> list:
    """`limit` of `items` drawn with `seed`, in their original order (all of them when `limit` is null or larger)."""
    if limit is None or limit >= len(items):
        return list(items)
    keep = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()[:limit]
    return [items[i] for i in sorted(keep)]


def encode_target_item(tokenizer: Any, item: Any, chat_template: bool, max_length: int) -> dict[str, list[int]]:
    """One target training item as an SFT example: templated instruction prompt, response loss."""
    prompt = prompts.apply_template(tokenizer, prompts.code_instruction_prompt(item), chat_template)
    return prompts.encode_pair(tokenizer, prompt, prompts.code_instruction_response(item), max_length)


def held_out_sequences(ctx: Any) -> tuple[dict[str, list[dict]], list[dict]]:
    """(retained by domain, target) encoded sequences of the run's evaluation split (the dev split in a dev run):
    retained = each domain's evaluation prompts followed by the base model's own responses (the reference cache),
    in the cache's domain name order; target = the code problems' prompts followed by their reference solutions.
    Neither is read by anything that fits a statistic (those read the calibration split) or trains."""
    retained: dict[str, list[dict]] = {}
    for pair in reference_pairs(ctx.reference(), drop_empty=False, split="evaluation"):
        retained.setdefault(pair.domain, []).append(pair_example(pair))
    target = []
    for item in ctx.benchmark.target_eval:
        prompt = prompts.apply_template(ctx.tokenizer, prompts.code_problem_prompt(item), ctx.chat_template)
        target.append(prompts.encode_pair(ctx.tokenizer, prompt, item.get("canonical_solution") or "", ctx.max_length))
    if not retained or not target:
        raise ValueError("diagnostics need retained evaluation responses and target problems")
    return retained, target
