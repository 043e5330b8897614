"""Small held-out checks of a micro model: math exact match, multiple-choice accuracy, code pass@1.

These are the quick checks the micro pretraining recipe logs while it trains, and the numbers the
micro backbone's model card reports. They use the shared templates of `experiments.prompts`:

- math: greedy answer to `math_prompt`, final number (`#### N`, else the last number) vs gold;
- multiple choice: the choice whose continuation `" {text}"` has the highest summed log-likelihood
  (lm-eval's `acc`; `acc_norm` divides by the continuation's byte length);
- code: greedy completion of `code_problem_prompt`, checked in the project sandbox exactly as the
  evaluation checks it (`completions_pass`).

The project's full evaluation (reference cache, KL, stability) lives in `experiments.evaluation`.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

import torch

from experiments.prompts import choice_continuation, choice_prompt, code_problem_prompt, math_prompt

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_number(text: str) -> Optional[str]:
    """The final answer of a math response: the number after `####`, else the last number."""
    if "####" in text:
        tail = text.split("####", 1)[1]
        m = _NUMBER.search(tail)
        if m:
            return m.group(0).replace(",", "")
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def csqa_to_choice(record: dict) -> dict:
    """A CommonsenseQA record (`question.stem`, `question.choices`, `answerKey`) as a choice item."""
    q = record["question"]
    labels = [c["label"] for c in q["choices"]]
    return {
        "id": record.get("id", ""),
        "question": q["stem"],
        "choices": [c["text"] for c in q["choices"]],
        "labels": labels,
        "answer_index": labels.index(record["answerKey"]),
    }


@torch.no_grad()
def greedy_generate(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 64
) -> list[str]:
    """Greedy continuations of `prompts` (text after the prompt, up to the eos token)."""
    model.eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    outs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in chunk]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), pad, dtype=torch.long)
        mask = torch.zeros((len(enc), width), dtype=torch.long)
        for row, e in enumerate(enc):  # left padding
            ids[row, width - len(e):] = torch.tensor(e)
            mask[row, width - len(e):] = 1
        gen = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=pad,
        )
        for row in gen[:, width:].tolist():
            if eos in row:
                row = row[: row.index(eos)]
            outs.append(tokenizer.decode([t for t in row if t != pad]))
    return outs


def math_exact_match(model: Any, tokenizer: Any, items: Sequence[dict], max_new_tokens: int = 64) -> dict:
    """Greedy exact match of the final number on GSM8K-format items."""
    responses = greedy_generate(model, tokenizer, [math_prompt(it) for it in items], max_new_tokens)
    answers = [extract_number(r) for r in responses]
    gold = [extract_number(it["answer"]) for it in items]
    correct = [a is not None and a == g for a, g in zip(answers, gold)]
    return {"exact_match": sum(correct) / max(len(items), 1), "n": len(items),
            "responses": responses, "answers": answers}


@torch.no_grad()
def choice_accuracy(model: Any, tokenizer: Any, items: Sequence[dict], batch_size: int = 96) -> dict:
    """Accuracy of the highest log-likelihood choice (`acc`) and its length-normalised variant (`acc_norm`)."""
    model.eval()
    pad = tokenizer.pad_token_id
    rows: list[tuple[int, list[int], int]] = []  # (item index, ids, n continuation tokens)
    for i, it in enumerate(items):
        p_ids = tokenizer(choice_prompt(it), add_special_tokens=False)["input_ids"]
        for text in it["choices"]:
            c_ids = tokenizer(choice_continuation(text), add_special_tokens=False)["input_ids"]
            rows.append((i, p_ids + c_ids, len(c_ids)))
    scores: list[float] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(r[1]) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (_, e, _) in enumerate(chunk):
            ids[row, : len(e)] = torch.tensor(e)
            mask[row, : len(e)] = 1
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
        for row, (_, e, n_cont) in enumerate(chunk):
            pos = torch.arange(len(e) - n_cont, len(e))
            scores.append(float(logp[row, pos - 1, ids[row, pos]].sum()))
    acc = acc_norm = 0
    choices: list[int] = []
    k = 0
    for i, it in enumerate(items):
        s = scores[k:k + len(it["choices"])]
        k += len(it["choices"])
        norm = [v / max(len(c.encode()), 1) for v, c in zip(s, it["choices"])]
        best = max(range(len(s)), key=s.__getitem__)
        choices.append(best)
        acc += best == it["answer_index"]
        acc_norm += max(range(len(s)), key=norm.__getitem__) == it["answer_index"]
    n = max(len(items), 1)
    return {"accuracy": acc / n, "accuracy_norm": acc_norm / n, "n": len(items), "choices": choices}


def completions_pass(problems: Sequence[dict], completions: Sequence[str]) -> list[bool]:
    """Whether each completion passes its problem's tests, checked in the project sandbox.

    The same path as the evaluation (`code_completion.build_check` -> `sandbox.check_solutions`):
    the test and the model's code run in separate sandboxed processes. Raises RuntimeError when
    the sandbox cannot run here (a check that could not run is not a failed solution).
    """
    from experiments.evaluation.code_completion import build_check
    from experiments.evaluation.sandbox import check_solutions

    results = check_solutions([build_check(p, c) for p, c in zip(problems, completions)])
    broken = [r.reason for r in results if r.status == "sandbox_error"]
    if broken:
        raise RuntimeError(f"{len(broken)} code checks could not run in the sandbox: {broken[0]}")
    return [r.passed for r in results]


def code_pass_at_1(model: Any, tokenizer: Any, problems: Sequence[dict], max_new_tokens: int = 96) -> dict:
    """Greedy pass@1 on HumanEval-format problems."""
    completions = greedy_generate(model, tokenizer, [code_problem_prompt(p) for p in problems], max_new_tokens)
    passed = completions_pass(problems, completions)
    return {"pass@1": sum(passed) / max(len(problems), 1), "n": len(problems), "passed": passed,
            "completions": completions}
