"""How items of each domain become (prompt, response) text, and how text becomes training tokens.

One module owns every template, so pretraining (micro), fine-tuning, the reference cache,
generation and scoring all see exactly the same strings. Items are the normalised dicts the
loaders in `experiments.data` return:

- math:        {"question": str, "answer": str}                      (GSM8K; answer ends in "#### N")
- choice:      {"id": str, "question": str, "choices": [str], "labels": [str], "answer_index": int}
- code_problem {"task_id", "prompt", "canonical_solution", "test", "entry_point"}   (HumanEval)
- code_instruction {"instruction": str, "input": str, "response": str}

A backbone with `chat_template: true` wraps the prompt text in its tokenizer's chat template (one
user turn, generation prompt added); the micro backbone uses the plain text as is.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

CODE_INSTRUCTION = "Complete the following Python function."


def math_prompt(item: dict) -> str:
    """Prompt text for a GSM8K-format math item."""
    return f"Question: {item['question']}\nAnswer:"


def math_response(item: dict) -> str:
    """Gold response text for a math item (reasoning, then a final line `#### N`)."""
    return " " + item["answer"].strip()


def choice_prompt(item: dict) -> str:
    """Prompt text for a multiple-choice item; the answer is the choice's text, scored by log-likelihood."""
    options = ", ".join(item["choices"])
    return f"Question: {item['question']}\nChoices: {options}\nAnswer:"


def choice_continuation(choice_text: str) -> str:
    """The continuation whose log-likelihood scores one choice (leading space, as lm-eval does)."""
    return " " + choice_text


def choice_response(item: dict) -> str:
    """Gold response text for a multiple-choice item."""
    return choice_continuation(item["choices"][item["answer_index"]])


def instruction_prompt(instruction: str, input_text: str = "") -> str:
    """Prompt text for an instruction (code SFT data and code evaluation alike)."""
    body = instruction.strip()
    if input_text:
        body = f"{body}\n{input_text}"
    return f"### Instruction:\n{body}\n### Response:\n"


def code_problem_prompt(item: dict) -> str:
    """Prompt text for a HumanEval-format problem: the instruction template around its signature+docstring.

    The model's completion is the function body; the program that runs is
    `item["prompt"] + completion` (see `experiments.evaluation.code_completion`).
    """
    return instruction_prompt(CODE_INSTRUCTION, item["prompt"])


def code_instruction_prompt(item: dict) -> str:
    """Prompt text for a code instruction-tuning item."""
    return instruction_prompt(item["instruction"], item.get("input", ""))


def code_instruction_response(item: dict) -> str:
    """Response text for a code instruction-tuning item."""
    return item["response"]


def retained_prompt(domain_kind: str, item: dict) -> str:
    """Prompt text for an item of a retained domain of kind `math` or `choice`."""
    if domain_kind == "math":
        return math_prompt(item)
    if domain_kind == "choice":
        return choice_prompt(item)
    raise ValueError(f"domain kind {domain_kind!r} is not a retained kind; allowed: math, choice")


def gold_response(domain_kind: str, item: dict) -> str:
    """Gold response text for an item of kind `math`, `choice` or `code_instruction`."""
    if domain_kind == "math":
        return math_response(item)
    if domain_kind == "choice":
        return choice_response(item)
    if domain_kind == "code_instruction":
        return code_instruction_response(item)
    raise ValueError(f"domain kind {domain_kind!r} has no gold response; allowed: math, choice, code_instruction")


def apply_template(tokenizer: Any, prompt_text: str, chat_template: bool) -> str:
    """The string the model actually sees before its response: chat-wrapped or plain.

    Backbone-specific template options (e.g. Qwen3's `enable_thinking: false`) are read from the
    tokenizer's `chat_template_kwargs` attribute, which `experiments.backbones.load_backbone` sets.
    """
    if not chat_template:
        return prompt_text
    extra = getattr(tokenizer, "chat_template_kwargs", None) or {}
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt_text}], tokenize=False, add_generation_prompt=True, **extra
    )


def split_boundary(prompt: str, response: str = "") -> tuple[str, str]:
    """Where prompt ends and response begins, in text: the prompt's trailing whitespace moves to the response.

    This is the one tokenisation rule of the suite (lm-evaluation-harness's rule for context and
    continuation). Pretraining documents are tokenised whole, and byte-level BPE tokenizers attach
    whitespace to the token that follows it (`"\\n    return"` is `"\\n   "` + `" return"`), so a
    prompt that ends in whitespace, tokenised alone, ends in a token the model never saw there
    (a lone `"\\n"`). Cut before the whitespace, the prompt's tokens are a prefix of the whole
    text's tokens and the response's tokens are the rest, for any tokenizer whose pre-tokenizer
    never puts whitespace after non-whitespace inside one piece (GPT-2, Llama 3 and the micro
    backbone's); `boundary_agrees` checks it for a given tokenizer and text.
    """
    stripped = prompt.rstrip()
    return stripped, prompt[len(stripped):] + response


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's token ids under `split_boundary`: what generation and scoring feed the model."""
    return encode_text(tokenizer, split_boundary(prompt)[0])


def encode_response(tokenizer: Any, prompt: str, response: str) -> list[int]:
    """The response's token ids under `split_boundary` (they start with the whitespace the prompt ended in)."""
    return encode_text(tokenizer, split_boundary(prompt, response)[1])


def response_text(prompt: str, generated: str) -> str:
    """A generated continuation of `encode_prompt(prompt)` as a response to the full `prompt`:
    the whitespace `split_boundary` moved out of the prompt is removed from its start when present."""
    lead = split_boundary(prompt)[1]
    return generated[len(lead):] if lead and generated.startswith(lead) else generated


def boundary_agrees(tokenizer: Any, prompt: str, response: str) -> bool:
    """Whether prompt tokens + response tokens (`split_boundary`) equal the tokens of the whole text."""
    return encode_prompt(tokenizer, prompt) + encode_response(tokenizer, prompt, response) == encode_text(
        tokenizer, prompt + response)


def encode_pair(
    tokenizer: Any, prompt: str, response: str, max_length: int, add_eos: bool = True
) -> dict[str, list[int]]:
    """Token ids of prompt+response and labels that are -100 on prompt tokens (loss on the response only).

    Prompt and response are cut by `split_boundary` (the prompt's trailing whitespace belongs to
    the response) and tokenised separately, so the prompt's tokens are exactly those generation
    and scoring feed the model. Truncation keeps the prompt's end and cuts the response's tail,
    never the other way round.
    """
    p_ids = encode_prompt(tokenizer, prompt)
    r_ids = encode_response(tokenizer, prompt, response)
    if add_eos and tokenizer.eos_token_id is not None:
        r_ids = r_ids + [tokenizer.eos_token_id]
    if len(p_ids) >= max_length:
        p_ids = p_ids[-(max_length // 2):]
    r_ids = r_ids[: max_length - len(p_ids)]
    return {"input_ids": p_ids + r_ids, "labels": [-100] * len(p_ids) + r_ids}


def collate(examples: Sequence[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad encoded pairs into `input_ids`, `attention_mask`, `labels` tensors."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        labels[row, :n] = torch.tensor(e["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
