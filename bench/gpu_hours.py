"""Estimated GPU-hours of the paper presets, from the configs alone (no GPU, no weights).

    python -m bench.gpu_hours            # the tables of docs/reproducing.md

An estimate, not a measurement. Training costs 6 N T FLOPs (forward 2N, backward through frozen
weights about 2N, recomputation under gradient checkpointing 2N) for N parameters (from the backbone's
published `shapes`) and T = steps x 32 sequences x MEAN_TOKENS tokens, at SUSTAINED_FLOPS.
Evaluation is bounded by batched greedy decoding: ceil(n / 32) x max_new_tokens steps per suite, at
DECODE_S_PER_STEP_8B seconds a step for an 8.2B model, scaled with N, once per post-hoc scale the preset
evaluates (`eval.scales`, and at most `eval.refine_scales.max_evals` refined ones). Each run adds OVERHEAD_H for loading and the method's statistics; a base run only
evaluates.
"""

from __future__ import annotations

import math

from hydra import compose, initialize_config_dir

from suite_schema import registry

PAPER_BACKBONES = ("qwen3-8b", "qwen3-4b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-2-9b")
TIED_EMBEDDINGS = {"qwen3-4b", "gemma-2-9b"}  # their config.json: tie_word_embeddings
SEQUENCES_PER_STEP = 32
MEAN_TOKENS = 512              # Magicoder-style instruction + response, truncated at 1024
SUSTAINED_FLOPS = 3.5e14       # about 35% of an H100 SXM's dense bf16 peak
DECODE_S_PER_STEP_8B = 0.025   # one batched decoding step of an 8.2B model
OVERHEAD_H = 0.05              # loading, atlas / Fisher / covariances, about 3 minutes
A100_FACTOR = 2.5
# (items, max new tokens) per evaluation suite: HumanEval + MBPP, GSM8K, CommonsenseQA.
SUITES = ((164 + 257, "max_new_tokens_code"), (500, "max_new_tokens_math"), (500, "max_new_tokens_choice"))


def grid_points() -> tuple[int, int]:
    """(points of the shared tuning grid, `conf/point/tune_*.yaml`; LoRA's paper points, `paper_tune_lora_*.yaml`)."""
    point = registry.CONF / "point"
    return len(list(point.glob("tune_*.yaml"))), len(list(point.glob("paper_tune_lora_*.yaml")))


GRID, LORA_GRID = grid_points()


def preset_seeds(preset: str) -> int:
    """How many seeds preset `preset` sweeps (its `hydra.sweeper.params.seed`, e.g. "0,1,2")."""
    values = registry.group_values("experiment", preset)
    return len(str(values["hydra"]["sweeper"]["params"]["seed"]).split(","))


MAIN_SEEDS, TUNE_SEEDS = preset_seeds("paper_main"), preset_seeds("paper_tune")
# The main sweep on one backbone: paper_tune's grid on test at 3 seeds, the grid at the default length, LoRA's points
# at a quarter to one (mean 0.625), and the base at each seed.
MAIN_SWEEP = ((MAIN_SEEDS * GRID, MAIN_SEEDS, 1.0), (MAIN_SEEDS * LORA_GRID, 0, 0.625))
# Runs each preset adds (backbone, trained, base, mean training length as a multiple of train/paper's steps).
PRESETS = {
    "paper_main": [("qwen3-8b", *runs) for runs in MAIN_SWEEP],
    "paper_backbones": [(b, *runs) for b in PAPER_BACKBONES if b != "qwen3-8b" for runs in MAIN_SWEEP],
    "paper_retained": [("qwen3-8b", 168, 0, 1.0)],
    # 18 runs at half, 15 at one (3 shared with paper_main), 18 at two epochs
    "paper_ablations": [("qwen3-8b", 18, 0, 0.5), ("qwen3-8b", 15, 0, 1.0), ("qwen3-8b", 18, 0, 2.0)],
    # the grid at the default length, LoRA's points at a mean 0.625, the base; seeds 0 and 1 on the dev split
    "paper_tune": [("qwen3-8b", TUNE_SEEDS * GRID, TUNE_SEEDS, 1.0), ("qwen3-8b", TUNE_SEEDS * LORA_GRID, 0, 0.625)],
}
# Presets whose seed-0 trained runs are another preset's trainings on the dev split: run with
# `reuse_training_from=[<that preset's run_root>]` they evaluate those models instead of training them again
# (experiments/reuse.py). paper_main runs paper_tune's grid, so every trained run of paper_tune is one of its runs.
REUSES = {"paper_main": "paper_tune"}


def evaluations_per_run(preset: str) -> int:
    """Evaluations of each trained run of a preset, at most: one per post-hoc scale of its composed `eval.scales`,
    plus the `eval.refine_scales.max_evals` refined scales where there are scales besides 1 to refine between."""
    with initialize_config_dir(config_dir=str(registry.CONF), version_base="1.3"):
        ev = compose("config", overrides=[f"experiment={preset}"]).eval
    refine = ev.refine_scales
    refined = refine.max_evals if refine is not None and any(float(a) != 1.0 for a in ev.scales) else 0
    return len(ev.scales) + refined


def paper_eval() -> dict:
    """conf/eval/paper.yaml over the file it starts from, as Hydra composes it."""
    return registry.group_values("eval", "paper")


def parameters(name: str) -> float:
    """Parameter count of a decoder-only backbone from its published shapes."""
    s = registry.group_values("backbone", name)["shapes"]
    h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    attn = 2 * h * s["num_attention_heads"] * s["head_dim"] + 2 * h * s["num_key_value_heads"] * s["head_dim"]
    embeddings = s["vocab_size"] * h * (1 if name in TIED_EMBEDDINGS else 2)
    return layers * (attn + 3 * h * inter) + embeddings


def run_hours(name: str) -> tuple[float, float]:
    """(training hours, evaluation hours) of one run on `name` with train/paper and eval/paper."""
    n = parameters(name)
    tokens = registry.group_values("train", "paper")["steps"] * SEQUENCES_PER_STEP * MEAN_TOKENS
    train = 6 * n * tokens / SUSTAINED_FLOPS / 3600
    ev = paper_eval()
    steps = sum(math.ceil(items / 32) * ev[key] for items, key in SUITES)
    return train, steps * DECODE_S_PER_STEP_8B * n / 8.2e9 / 3600


def main() -> None:
    print("| backbone | params | train (h) | eval (h) | one run (H100-h) |\n|---|---|---|---|---|")
    hours = {}
    for b in PAPER_BACKBONES:
        train, ev = run_hours(b)
        hours[b] = (train, ev)
        print(f"| {b} | {parameters(b) / 1e9:.1f} B | {train:.2f} | {ev:.2f} | {train + ev + OVERHEAD_H:.2f} |")
    print("\n| preset | new runs | H100-hours | A100-80GB-hours (x2.5) |\n|---|---|---|---|")
    for preset, parts in PRESETS.items():
        total = preset_hours(parts, evaluations_per_run(preset), hours)
        runs = sum(t + base for _, t, base, _ in parts)
        print(f"| `{preset}` | {runs} | {total:.0f} | {total * A100_FACTOR:.0f} |")
    for preset, donor in REUSES.items():
        saved = sum(t * hours[b][0] * f for b, t, _, f in PRESETS[donor])
        total = preset_hours(PRESETS[preset], evaluations_per_run(preset), hours) - saved
        runs = sum(t + base for _, t, base, _ in PRESETS[preset])
        reused = sum(t for _, t, _, _ in PRESETS[donor])
        print(f"| `{preset}` after `{donor}`, `reuse_training_from` | {runs} ({reused} not trained again) | "
              f"{total:.0f} | {total * A100_FACTOR:.0f} |")


def preset_hours(parts: list, evaluations: int, hours: dict) -> float:
    """H100-hours of a preset's runs (`PRESETS` entries), each trained run evaluated `evaluations` times."""
    return sum(t * (hours[b][0] * f + evaluations * hours[b][1] + OVERHEAD_H) + base * (hours[b][1] + OVERHEAD_H)
               for b, t, base, f in parts)


if __name__ == "__main__":
    main()
