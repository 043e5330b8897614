"""Decoding speed with `generate` (greedy, a fixed number of new tokens, no stop at EOS), as ratios.

    python -m bench.decode                                       # micro + qwen3-cpu, batch 1 and 32
    python -m bench.decode --shape qwen3-8b --device cuda --dtype bfloat16

Variants, all sharing the backbone's frozen weights except the merged LoRA:
- base: the backbone alone;
- lora_merged: `baselines.lora.LoRA` (peft) merged into a copy of the weights (`merge_and_unload`);
- lora: the same adapter unmerged (what LoRA costs when adapters are swapped at serving time);
- atlas / atlas_soft: `atlas.method.ATLAS` with hard / soft assignment (its residual cannot be
  merged: it depends on the input);
- atlas_batched: `atlas` without its one-row route (`AtlasSite.condition_row`): at batch 1 every new token goes
  through the batched forms, as before that route existed (`bench.common.use_batched_forms`); the output says
  whether it generates the same tokens as `atlas`;
- atlas_prev: hard assignment with the layer code before its fast path (bench/common.py); the
  script checks it generates the same tokens as `atlas`;
- atlas_kmeans: hard assignment, the filters before the defaults changed (`bench.common.EARLIER_FILTERS`): each
  fitted on its k-means cluster in the full input space, so the filter coordinates are one product, d K R per row
  (`atlas`'s are two, d P + P K R).

Every call generates exactly `--new-tokens` tokens after a `--prompt-len` token prompt (random
ids, no padding); the time includes the prompt's prefill. Reported per batch size: ms per
generated position (call time / new tokens), tokens/s (batch x new tokens / call time) and the
latency ratios. Interleaved rounds, median of `--repeats`, after `--warmup` calls per variant. The target ratio
(atlas/lora at batch 1) is also taken per round, both variants' calls of one round paired, with the
distribution-free interval of the median of those ratios (`bench.common.median_interval`) and the target's
verdict by that interval: met, missed, or unresolved where the interval contains the limit.
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from transformers import GenerationConfig

from bench.common import (
    EARLIER_FILTERS,
    add_atlas,
    add_lora,
    command_line,
    common_parser,
    environment,
    interleaved,
    load_preset,
    paired_target,
    paired_target_line,
    selected_variants,
    settings,
    shared_copy,
    summary,
    table,
    use_batched_forms,
    use_legacy_atlas,
    write_json,
)

SCRIPT = "decode"
VARIANTS = {
    "base": "the backbone alone",
    "lora_merged": "peft LoRA merged into a copy of the weights (merge_and_unload)",
    "lora": "peft LoRA, unmerged",
    "atlas": "ATLAS, hard assignment",
    "atlas_soft": "ATLAS, soft assignment",
    "atlas_batched": "ATLAS, hard assignment, one row through the batched forms (no one-row route)",
    "atlas_prev": "ATLAS, hard assignment, layer code before the fast path (bench/common.py)",
    "atlas_kmeans": "ATLAS, hard assignment, the earlier filters: k-means clusters, full input space "
                    "(bench.common.EARLIER_FILTERS)",
}
TARGET = ("atlas/lora", 1.15, 1)  # ratio, limit, at batch size


def build_variant(name: str, bb, st):
    if name == "base":
        model = shared_copy(bb.model)
    elif name == "lora_merged":
        model, _ = add_lora(copy.deepcopy(bb.model), bb, st.seed)  # merging writes into the weights: a real copy
        model = model.merge_and_unload()
    elif name == "lora":
        model, _ = add_lora(shared_copy(bb.model), bb, st.seed)
    else:
        extra = EARLIER_FILTERS if name == "atlas_kmeans" else {}
        model, _ = add_atlas(shared_copy(bb.model), bb, st, assign="soft" if name == "atlas_soft" else "hard", **extra)
        if name == "atlas_prev":
            use_legacy_atlas(model)
        elif name == "atlas_batched":
            use_batched_forms(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def generation_config(bb, new_tokens: int) -> GenerationConfig:
    # min_new_tokens = max_new_tokens: EOS is never generated, every call produces the same length.
    return GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                            repetition_penalty=1.0, pad_token_id=bb.pad_id, eos_token_id=bb.eos_id, use_cache=True)


def bench_shape(shape: str, st, args, names: list[str], payload: dict) -> dict:
    bb = load_preset(shape, st)
    print(f"[{shape}] {bb.describe()['params'] / 1e6:.1f}M params, {bb.dtype}, {bb.device}", flush=True)
    models = {n: build_variant(n, bb, st) for n in names}
    src = dict(models["atlas"].named_parameters()) if "atlas" in models else {}
    for other in ("atlas_prev", "atlas_batched"):  # identical factors, so each must decode as `atlas` does
        if src and other in models:
            with torch.no_grad():
                for n, p in models[other].named_parameters():
                    if "lora_" in n:
                        p.copy_(src[n])
    config = generation_config(bb, args.new_tokens)
    result = {"shape": shape, "backbone": bb.describe(), "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
              "atlas_prepare_s": bb.extras.get("atlas_prepare_s"), "batches": []}
    payload["results"].append(result)
    for batch_size in [int(b) for b in args.batch_sizes.split(",") if b]:
        g = torch.Generator().manual_seed(st.seed + batch_size)
        ids = torch.randint(2, bb.vocab, (batch_size, args.prompt_len), generator=g).to(bb.device)
        mask = torch.ones_like(ids)
        outputs = {}

        def call(name, model):
            def run():
                with torch.no_grad():
                    outputs[name] = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            return run

        calls = {n: call(n, m) for n, m in models.items()}
        times = interleaved(calls, args.repeats, args.warmup, bb.device, label=f"{shape} batch {batch_size}")
        for n, out in outputs.items():
            if out.shape != (batch_size, args.prompt_len + args.new_tokens):
                raise RuntimeError(f"{n}: generate returned shape {tuple(out.shape)}, expected "
                                   f"{(batch_size, args.prompt_len + args.new_tokens)}")
        same, same_batched = (bool(torch.equal(outputs["atlas"], outputs[o])) if {"atlas", o} <= set(outputs) else None
                              for o in ("atlas_prev", "atlas_batched"))
        variants = {}
        for n in names:
            s = summary(times[n])
            variants[n] = {**s, "ms_per_token": s["median_s"] / args.new_tokens * 1e3,
                           "tokens_per_s": batch_size * args.new_tokens / s["median_s"]}
        med = {n: variants[n]["median_s"] for n in names}
        ratios = {f"{a}/{b}": med[a] / med[b] for a, b in
                  [("atlas", "lora"), ("atlas", "base"), ("lora", "base"), ("lora_merged", "base"),
                   ("atlas_soft", "lora"), ("atlas_kmeans", "lora"), ("atlas", "atlas_kmeans"), ("atlas_prev", "lora"),
                   ("atlas", "atlas_prev"), ("atlas", "lora_merged"),
                   ("atlas_batched", "lora"), ("atlas", "atlas_batched")]
                  if a in med and b in med}
        entry = {"batch_size": batch_size, "variants": variants, "ratios": ratios, "atlas_prev_same_tokens": same,
                 "atlas_batched_same_tokens": same_batched}
        if batch_size == TARGET[2] and TARGET[0] in ratios:
            entry["target"] = {"ratio": TARGET[0], "limit": TARGET[1], "value": ratios[TARGET[0]],
                               "met": ratios[TARGET[0]] <= TARGET[1], **paired_target(times, TARGET[0], TARGET[1])}
            line = paired_target_line(entry["target"])
            if line:
                print(f"{line} (batch {batch_size})", flush=True)
        result["batches"].append(entry)
        rows = [[n, variants[n]["ms_per_token"], variants[n]["tokens_per_s"], f"{variants[n]['iqr_rel'] * 100:.1f}%",
                 med[n] / med["base"] if "base" in med else "-", med[n] / med["lora"] if "lora" in med else "-"]
                for n in names]
        print(f"\n{shape}: generate, batch {batch_size}, {args.prompt_len} prompt + {args.new_tokens} new tokens, "
              f"median of {args.repeats} ({bb.dtype}, {bb.device})"
              + ("" if same is None else f"; atlas_prev same tokens as atlas: {same}")
              + ("" if same_batched is None else f"; atlas_batched same tokens as atlas: {same_batched}"))
        print(table(["variant", "ms/token", "tokens/s", "IQR", "x base", "x lora"], rows) + "\n", flush=True)
        write_json(args.out, SCRIPT, payload)
    del models
    return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = common_parser(__doc__.splitlines()[0], "micro,qwen3-cpu", repeats=5, warmup=1)
    ap.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes (default 1,32)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per call (default 32)")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row (default 32)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    args = ap.parse_args(argv)
    names = selected_variants(args.variants, VARIANTS)
    keep: list = []
    st = settings(args, keep)
    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(st.device),
               "variants": {n: VARIANTS[n] for n in names}, "target": f"{TARGET[0]} <= {TARGET[1]} at batch {TARGET[2]}",
               "results": [], "complete": False}
    for shape in [s for s in args.shape.split(",") if s]:
        bench_shape(shape, st, args, names, payload)
    payload["complete"] = True
    write_json(args.out, SCRIPT, payload)
    return payload


if __name__ == "__main__":
    main()
