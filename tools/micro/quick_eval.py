"""Small held-out checks of a micro model: math exact match, multiple-choice accuracy, code pass@1.

These are the quick checks the micro pretraining recipe logs while it trains, and the numbers the
micro backbone's model card reports. They use the shared templates of `experiments.prompts` and the evaluation's own generation and
scoring, so prompts are tokenised by the one rule (`prompts.split_boundary`):

- math: greedy answer to `math_prompt`, final number (`#### N`, else the last number) vs gold;
- multiple choice: the choice whose continuation `" {text}"` has the highest summed log-likelihood
  (lm-eval's `acc`; `acc_norm` divides by the choice's length in characters);
- code: greedy completion of `code_problem_prompt`, checked in the project sandbox exactly as the
  evaluation checks it (`completions_pass`).

The project's full evaluation (reference cache, KL, stability) lives in `experiments.evaluation`.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from experiments.evaluation.code_completion import build_check
from experiments.evaluation.generation import generate
from experiments.evaluation.scoring import score_choices
from experiments.prompts import code_problem_prompt, math_prompt
from sandbox import check_solutions

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


def greedy_generate(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 64
) -> list[str]:
    """Greedy responses to `prompts` (the evaluation's `generation.generate`, so the same tokenisation rule)."""
    return generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size).texts


def math_exact_match(model: Any, tokenizer: Any, items: Sequence[dict], max_new_tokens: int = 64) -> dict:
    """Greedy exact match of the final number on GSM8K-format items."""
    responses = greedy_generate(model, tokenizer, [math_prompt(it) for it in items], max_new_tokens)
    answers = [extract_number(r) for r in responses]
    gold = [extract_number(it["answer"]) for it in items]
    correct = [a is not None and a == g for a, g in zip(answers, gold)]
    return {"exact_match": sum(correct) / max(len(items), 1), "n": len(items),
            "responses": responses, "answers": answers}


def choice_accuracy(model: Any, tokenizer: Any, items: Sequence[dict], batch_size: int = 96) -> dict:
    """Accuracy of the highest log-likelihood choice (`acc`) and its length-normalised variant (`acc_norm`),
    scored by the evaluation's `scoring.score_choices`."""
    scores = score_choices(model, tokenizer, items, chat_template=False, batch_size=batch_size)
    n = max(len(items), 1)
    gold = [it["answer_index"] for it in items]
    return {"accuracy": sum(c == g for c, g in zip(scores.choice, gold)) / n,
            "accuracy_norm": sum(c == g for c, g in zip(scores.choice_norm, gold)) / n,
            "n": len(items), "choices": scores.choice}


def completions_pass(problems: Sequence[dict], completions: Sequence[str]) -> list[bool]:
    """Whether each completion passes its problem's tests, checked in the project sandbox.

    The same path as the evaluation (`code_completion.build_check` -> `sandbox.check_solutions`):
    the test and the model's code run in separate sandboxed processes. Raises RuntimeError when
    the sandbox cannot run here (a check that could not run is not a failed solution).
    """
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
