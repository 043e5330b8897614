"""Recipe of the micro backbone: generate the micro world, train its tokenizer, pretrain a tiny Qwen3.

    python -m tools.micro.pretrain --out assets/micro/backbone [--seed 0] [--steps N] [--minutes M] [--tiny]

Steps:
1. Generate the micro benchmark (`tools.micro.world`) into `--data-dir` (a temporary folder by
   default); the pretraining corpus is its pretrain splits rendered with the shared templates of
   `experiments.prompts` as (prompt, response) pairs and tokenised by the suite's one rule
   (`prompts.split_boundary`: prompt tokens, response tokens, eos), so the model sees at
   evaluation exactly the prompt tokens it saw in pretraining.
2. Train a byte-level BPE tokenizer (digits split one per token, vocab 1024, `<|endoftext|>` as eos,
   `<|pad|>` as pad) on that corpus.
3. Pretrain `Qwen3ForCausalLM` (hidden 192, 4 layers, 6 heads, intermediate 512, tied embeddings)
   on packed 256-token blocks of a token-weighted mixture of the three domains, AdamW with warmup
   and cosine decay, for `--steps` steps (`--minutes` is a wall-clock cap that stops it earlier).
4. Log quick held-out checks on the dev split during training (math exact match, multiple-choice accuracy) and a
   final check on the full dev and test splits (plus code pass@1 per family), save the Hugging Face folder
   (config, safetensors, tokenizer, generation config), `pretrain_log.json` and `loss_curve.png`.

Everything is seeded: the same seed and step count give the same data, tokenizer and initial
weights; training itself runs on the CPU with two threads.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from experiments.prompts import (
    choice_prompt,
    choice_response,
    code_problem_prompt,
    encode_prompt,
    encode_response,
    math_prompt,
    math_response,
)
from tools.micro import quick_eval
from tools.micro import world as micro

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


@dataclass
class Recipe:
    """Hyperparameters of one pretraining run."""

    seed: int = 0
    steps: int = 2600
    minutes: float = 14.0
    vocab_size: int = 1024
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    intermediate_size: int = 512
    block_size: int = 256
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    bf16: bool = True
    mix_math: float = 0.6
    mix_commonsense: float = 0.22
    mix_code: float = 0.18
    eval_every: int = 250
    quick_eval_items: int = 60
    math_max_new_tokens: int = 64
    code_max_new_tokens: int = 96
    threads: int = 2
    tiny: bool = False


def tiny_recipe(seed: int = 0, steps: int = 8) -> Recipe:
    """A few steps of a very small model: for tests of the recipe itself."""
    return Recipe(seed=seed, steps=steps, vocab_size=400, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, block_size=64, batch_size=4, warmup_steps=2, eval_every=4,
                  quick_eval_items=4, math_max_new_tokens=8, code_max_new_tokens=8, tiny=True)


# ---------------------------------------------------------------------------------------------
# Corpus and tokenizer
# ---------------------------------------------------------------------------------------------


def render_pairs(splits: dict[str, list[dict]]) -> dict[str, list[tuple[str, str]]]:
    """Pretraining documents of each domain as (prompt, response) text pairs (eos is added at tokenisation)."""
    pairs = {
        "math": [(math_prompt(it), math_response(it)) for it in splits["math/pretrain"]],
        "commonsense": [],
        "code": [(code_problem_prompt(p), p["canonical_solution"]) for p in splits["code/pretrain"]],
    }
    for rec in splits["commonsense/pretrain"]:
        item = quick_eval.csqa_to_choice(rec)
        pairs["commonsense"].append((choice_prompt(item), choice_response(item)))
    return pairs


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with digits split one per token, as a `PreTrainedTokenizerFast`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )


def encode_document(tokenizer, prompt: str, response: str) -> list[int]:
    """A pretraining document's token ids: prompt and response cut and tokenised by the suite's one
    rule (`prompts.encode_prompt` / `prompts.encode_response`), then eos, exactly as fine-tuning
    (`prompts.encode_pair`) and evaluation tokenise them."""
    return encode_prompt(tokenizer, prompt) + encode_response(tokenizer, prompt, response) + [tokenizer.eos_token_id]


def build_blocks(tokenizer, docs: dict[str, list[tuple[str, str]]], recipe: Recipe, n_tokens: int) -> torch.Tensor:
    """Packed training blocks `[n_blocks, block_size + 1]` of a token-weighted domain mixture of (prompt, response) documents."""
    rng = random.Random(f"{recipe.seed}/mixture")
    weights = {"math": recipe.mix_math, "commonsense": recipe.mix_commonsense, "code": recipe.mix_code}
    total_w = sum(weights.values())
    chosen: list[list[int]] = []
    for domain, pairs in docs.items():
        ids = [encode_document(tokenizer, p, r) for p, r in pairs]
        budget = n_tokens * weights[domain] / total_w
        got = 0
        while got < budget:
            order = list(range(len(ids)))
            rng.shuffle(order)
            for i in order:
                chosen.append(ids[i])
                got += len(ids[i])
                if got >= budget:
                    break
    rng.shuffle(chosen)
    stream = torch.tensor([t for doc in chosen for t in doc], dtype=torch.long)
    width = recipe.block_size + 1
    n_blocks = len(stream) // width
    return stream[: n_blocks * width].view(n_blocks, width)


# ---------------------------------------------------------------------------------------------
# Model and training
# ---------------------------------------------------------------------------------------------


def build_model(recipe: Recipe, tokenizer):
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads, head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id, use_cache=True,
    )
    torch.manual_seed(recipe.seed)
    return Qwen3ForCausalLM(config)


def lr_at(step: int, recipe: Recipe, progress: Optional[float] = None) -> float:
    """Learning rate: linear warmup over `warmup_steps`, then cosine decay to `min_lr_ratio * lr`.

    `progress` (0..1) is how far the run is; by default `step / steps`. The recipe passes the
    larger of the step fraction and the fraction of the wall-clock budget used, so a run slowed
    down by a busy machine still anneals fully before its time cap.
    """
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    if progress is None:
        progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    progress = min(1.0, max(0.0, progress))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cosine)


def run_progress(step: int, elapsed_s: float, recipe: Recipe) -> float:
    """Fraction of the run done: steps done over `steps`, or wall time over `minutes`, whichever is larger."""
    return max(step / recipe.steps, elapsed_s / (recipe.minutes * 60))


def quick_checks(model, tokenizer, splits: dict, n: Optional[int], recipe: Recipe, with_code: bool = False,
                 split: str = "dev") -> dict:
    """Math exact match, commonsense accuracy (and code pass@1, overall and per family) on `split`'s first `n` items."""
    math_items = splits[f"math/{split}"][:n]
    choice_items = [quick_eval.csqa_to_choice(r) for r in splits[f"commonsense/{split}"][:n]]
    out = {
        "split": split,
        "math_exact_match": quick_eval.math_exact_match(model, tokenizer, math_items, recipe.math_max_new_tokens)["exact_match"],
        "commonsense_accuracy": quick_eval.choice_accuracy(model, tokenizer, choice_items)["accuracy"],
        "n_math": len(math_items),
        "n_commonsense": len(choice_items),
    }
    if with_code:
        problems = splits[f"code/{split}"][:n]
        res = quick_eval.code_pass_at_1(model, tokenizer, problems, recipe.code_max_new_tokens)
        out["code_pass@1"] = res["pass@1"]
        out["n_code"] = len(problems)
        by_family: dict[str, list[bool]] = {}
        for p, ok in zip(problems, res["passed"]):
            by_family.setdefault(micro.code_family(p["task_id"]), []).append(ok)
        out["code_pass@1_by_family"] = {f: sum(v) / len(v) for f, v in by_family.items()}
    model.train()
    return out


def save_loss_curve(history: list[dict], path: Path) -> None:
    # here, not at the top: matplotlib.use('Agg') must run before pyplot loads, and only the loss curve needs them
    import matplotlib

    matplotlib.use("Agg")
    # here, not at the top: matplotlib.use('Agg') must run before pyplot loads, and only the loss curve needs them
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_yscale("log")
    ax.set_title("micro backbone pretraining")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(out: str | Path, recipe: Recipe, data_dir: Optional[str | Path] = None) -> dict:
    """Run the whole recipe; returns the log that is also written to `out/pretrain_log.json`."""
    t0 = time.time()
    torch.set_num_threads(recipe.threads)
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = micro.TINY_SIZES if recipe.tiny else micro.MicroSizes()
    timings: dict[str, float] = {}

    with tempfile.TemporaryDirectory() as tmp:
        data_root = Path(data_dir) if data_dir else Path(tmp)
        micro.write(data_root, recipe.seed, sizes)
        splits = micro.generate(recipe.seed, sizes)
        docs = render_pairs(splits)
        timings["data_s"] = time.time() - t0

        t = time.time()
        tokenizer = train_tokenizer([p + r for pairs in docs.values() for p, r in pairs], recipe.vocab_size)
        timings["tokenizer_s"] = time.time() - t

        t = time.time()
        n_tokens = recipe.steps * recipe.batch_size * (recipe.block_size + 1)
        blocks = build_blocks(tokenizer, docs, recipe, n_tokens)
        timings["packing_s"] = time.time() - t

    model = build_model(recipe, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(blocks), generator=gen)
    history: list[dict] = []
    checks: list[dict] = []
    model.train()
    t_train = time.time()
    stopped_by_time = False
    tokens_seen = 0
    bar = tqdm(range(recipe.steps), desc="pretrain", dynamic_ncols=True)
    for step in bar:
        progress = run_progress(step, time.time() - t_train, recipe)
        if progress >= 1.0:
            stopped_by_time = True
            break
        lr = lr_at(step, recipe, progress)
        idx = order[(torch.arange(recipe.batch_size) + step * recipe.batch_size) % len(blocks)]
        batch = blocks[idx]
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        tokens_seen += batch[:, 1:].numel()
        history.append({"step": step, "loss": loss.item(), "lr": lr, "t": time.time() - t_train})
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_seen / (time.time() - t_train):.0f}")
        if (step + 1) % recipe.eval_every == 0 and step + 1 < recipe.steps:
            c = quick_checks(model, tokenizer, splits, recipe.quick_eval_items, recipe)
            c.update(step=step + 1, minutes=(time.time() - t_train) / 60)
            checks.append(c)
            tqdm.write(f"step {step + 1}: math EM {c['math_exact_match']:.3f}, MC acc {c['commonsense_accuracy']:.3f}")
    bar.close()
    timings["train_s"] = time.time() - t_train
    steps_done = len(history)

    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id, do_sample=False, max_new_tokens=128,
    ).save_pretrained(out)
    save_loss_curve(history, out / "loss_curve.png")

    t = time.time()
    final = {split: quick_checks(model, tokenizer, splits, None if not recipe.tiny else recipe.quick_eval_items,
                                 recipe, with_code=True, split=split) for split in ("dev", "test")}
    timings["final_eval_s"] = time.time() - t
    for split, c in final.items():
        tqdm.write(f"final ({split}): math EM {c['math_exact_match']:.3f}, MC acc {c['commonsense_accuracy']:.3f}, "
                   f"code pass@1 {c['code_pass@1']:.3f}")

    timings["total_s"] = time.time() - t0

    log = {
        "recipe": asdict(recipe),
        "generator": {"module": "tools.micro.world", "version": micro.GENERATOR_VERSION, "seed": recipe.seed},
        "params": n_params,
        "tokens_seen": tokens_seen,
        "steps_done": steps_done,
        "stopped_by_time_cap": stopped_by_time,
        "tokens_per_s": tokens_seen / max(timings["train_s"], 1e-9),
        "timings_s": timings,
        "final_loss": history[-1]["loss"] if history else None,
        "quick_checks": checks,
        "final_checks": final,
        "loss_history": [{"step": h["step"], "loss": round(h["loss"], 5)} for h in history],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
    }
    (out / "pretrain_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="Pretrain the micro backbone (tokenizer + tiny Qwen3) on the micro world.")
    ap.add_argument("--out", required=True, help="output folder (Hugging Face format)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training")
    ap.add_argument("--tiny", action="store_true", help="a few steps of a very small model (tests)")
    ap.add_argument("--data-dir", default=None, help="where to write the generated micro data (default: a temp dir)")
    ap.add_argument("--no-bf16", action="store_true", help="train in float32 instead of bfloat16 autocast")
    args = ap.parse_args(argv)
    recipe = tiny_recipe(args.seed) if args.tiny else Recipe(seed=args.seed)
    if args.steps is not None:
        recipe.steps = args.steps
    if args.minutes is not None:
        recipe.minutes = args.minutes
    if args.no_bf16:
        recipe.bf16 = False
    log = run(args.out, recipe, args.data_dir)
    print(json.dumps({k: log[k] for k in ("params", "steps_done", "tokens_seen", "timings_s", "final_checks")},
                     indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
