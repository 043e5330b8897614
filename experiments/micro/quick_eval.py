"""Small held-out checks of a micro model: math exact match, multiple-choice accuracy, code pass@1.

These are the quick checks the micro pretraining recipe logs while it trains, and the numbers the
micro backbone's model card reports. They use the shared templates of `experiments.prompts`:

- math: greedy answer to `math_prompt`, final number (`#### N`, else the last number) vs gold;
- multiple choice: the choice whose continuation `" {text}"` has the highest summed log-likelihood
  (lm-eval's `acc`; `acc_norm` divides by the continuation's byte length);
- code: greedy completion of `code_problem_prompt`; the program `prompt + completion + test +
  check(entry_point)` runs in a separate process with a timeout (through the project sandbox's
  `check_program` where that module is present).

The project's full evaluation (reference cache, KL, stability) lives in `experiments.evaluation`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
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


def run_program(program: str, timeout_s: float = 5.0) -> bool:
    """Whether a Python program runs to its end (exit status 0), isolated from this process.

    Uses the project sandbox (`experiments.evaluation.sandbox.check_program`, its default limits)
    where it is available; else a separate `python -I` process in its own temp dir, scrubbed
    environment and session, killed after `timeout_s`.
    """
    try:
        from experiments.evaluation.sandbox import check_program  # the project's sandbox, when present
    except ImportError:
        check_program = None
    if check_program is not None:
        return bool(check_program(program).passed)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", program], cwd=tmp, capture_output=True, timeout=timeout_s,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}, start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def code_program(problem: dict, completion: str) -> str:
    """The HumanEval program: prompt, completion, the tests, and the call of `check`."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


def code_pass_at_1(model: Any, tokenizer: Any, problems: Sequence[dict], max_new_tokens: int = 96) -> dict:
    """Greedy pass@1 on HumanEval-format problems."""
    completions = greedy_generate(model, tokenizer, [code_problem_prompt(p) for p in problems], max_new_tokens)
    passed = [run_program(code_program(p, c)) for p, c in zip(problems, completions)]
    return {"pass@1": sum(passed) / max(len(problems), 1), "n": len(problems), "passed": passed,
            "completions": completions}
