"""Training step time: full fine-tuning, LoRA, ATLAS and the frozen base on one batch, as ratios and throughput shares.

    python -m bench.train_step                                  # micro + qwen3-cpu on this CPU
    python -m bench.train_step --shape qwen3-8b --device cuda --dtype bfloat16 --batch 2 --seq 1024

One step is what `experiments.train.train` does per optimizer step with grad_accum 1: forward
with labels, backward, gradient clipping at 1.0, AdamW step, zero_grad. Variants:

- fullft: plain full-parameter fine-tuning of a private copy of the backbone (every weight trained, AdamW): the
  throughput every adapter is compared with (`x fullft`, and tokens/s as a share of full FT's).
- base: the frozen backbone, forward + backward down to the input embeddings, no optimizer; the
  activation-gradient work any adapter pays, so `lora/base` and `atlas/base` are adapter overheads.
- lora: `baselines.lora.LoRA` (peft), conf/method/lora.yaml, on all seven projections.
- atlas: `atlas.method.ATLAS`, conf/method/atlas.yaml (hard assignment), same rank and modules.
- atlas_soft: the same with soft assignment.
- atlas_prev: hard assignment with the layer code before its fast path (bench/common.py), same
  atlas and factors; the script checks its logits equal `atlas`'s before timing.
- atlas_kmeans: hard assignment, the filters before the defaults changed (`bench.common.EARLIER_FILTERS`): each
  fitted on its k-means cluster in the full input space, so its filter coordinates are one product, d K R per row
  (`atlas`'s are two, d P + P K R).

All variants share the backbone's frozen weight tensors and the same batch; they are timed in
interleaved rounds (order rotated each round) after warm-up, and the median is reported. The target ratio
(atlas/lora) is also taken per round and judged by the interval of those ratios' median
(`bench.common.paired_target`: met, missed, or unresolved).
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch

from bench.common import (
    EARLIER_FILTERS,
    add_atlas,
    add_lora,
    clear_atlas_caches,
    command_line,
    common_parser,
    environment,
    interleaved,
    load_preset,
    paired_target,
    paired_target_line,
    peak_memory,
    reset_peak_memory,
    selected_variants,
    settings,
    shared_copy,
    summary,
    table,
    timed,
    train_batch,
    use_legacy_atlas,
    write_json,
)

SCRIPT = "train_step"
VARIANTS = {
    "fullft": "full-parameter fine-tuning of a private copy (every weight trained); AdamW step",
    "base": "frozen backbone: forward + backward to the input embeddings, no optimizer step",
    "lora": "peft LoRA (conf/method/lora.yaml) on q,k,v,o,gate,up,down; AdamW step",
    "atlas": "ATLAS, hard assignment (conf/method/atlas.yaml), same rank and modules; AdamW step",
    "atlas_soft": "ATLAS, soft assignment; AdamW step",
    "atlas_prev": "ATLAS, hard assignment, layer code before the fast path (bench/common.py); AdamW step",
    "atlas_kmeans": "ATLAS, hard assignment, the earlier filters: k-means clusters, full input space "
                    "(bench.common.EARLIER_FILTERS); AdamW step",
}
TARGET = ("atlas/lora", 1.25)


def build_variant(name: str, bb, st):
    if name == "fullft":
        model = copy.deepcopy(bb.model)  # its own weights: the AdamW step changes them, the others share bb's
        for p in model.parameters():
            p.requires_grad_(True)
        model.train()
        return model, list(model.parameters())
    model = shared_copy(bb.model)
    if name == "base":
        model.enable_input_require_grads()  # backward runs through every layer, as under an adapter
    elif name == "lora":
        model, _ = add_lora(model, bb, st.seed)
    else:
        extra = EARLIER_FILTERS if name == "atlas_kmeans" else {}
        model, _ = add_atlas(model, bb, st, assign="soft" if name == "atlas_soft" else "hard", **extra)
        if name == "atlas_prev":
            use_legacy_atlas(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params


def make_step(model, params, batch):
    optimizer = torch.optim.AdamW(params, lr=1e-4) if params else None

    def step():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                    use_cache=False)
        out.loss.backward()
        if optimizer is not None:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def same_factors(dst, src) -> None:
    """Copy the trainable factors of one ATLAS model into another with the same module names."""
    src_params = dict(src.named_parameters())
    with torch.no_grad():
        for n, p in dst.named_parameters():
            if p.requires_grad:
                p.copy_(src_params[n])


def bench_shape(shape: str, st, args, names: list[str]) -> dict:
    bb = load_preset(shape, st)
    batch_size = args.batch or (16 if bb.pretrained else 1)
    batch = train_batch(bb, batch_size, args.seq, st.seed)
    tokens = int(batch["attention_mask"].sum())
    real_share = tokens / batch["attention_mask"].numel()  # the rest is padding the step computes anyway
    print(f"[{shape}] {bb.describe()['params'] / 1e6:.1f}M params, {batch_size} x {batch['input_ids'].shape[1]} "
          f"({tokens} tokens), {bb.dtype}, {bb.device}", flush=True)
    models, params = {}, {}
    for n in names:
        models[n], params[n] = build_variant(n, bb, st)
    check = None
    if "atlas" in models and "atlas_prev" in models:
        same_factors(models["atlas_prev"], models["atlas"])
        with torch.no_grad():
            a = models["atlas"](input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
            b = models["atlas_prev"](input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        check = float((a.float() - b.float()).abs().max())
        del a, b
        for n in ("atlas", "atlas_prev"):
            clear_atlas_caches(models[n])
        print(f"[{shape}] atlas vs atlas_prev: max |logit difference| {check:.3g}", flush=True)
    steps = {n: make_step(models[n], params[n], batch) for n in names}
    times = interleaved(steps, args.repeats, args.warmup, bb.device, label=shape)
    memory = {}
    if bb.device.type == "cuda":
        for n in names:
            reset_peak_memory(bb.device)
            timed(steps[n], bb.device)
            memory[n] = peak_memory(bb.device)
    variants = {}
    for n in names:
        s = summary(times[n])
        variants[n] = {**s, "ms_per_step": s["median_s"] * 1e3, "tokens_per_s": tokens / s["median_s"],
                       "trainable_params": sum(p.numel() for p in params[n]), "peak_memory_bytes": memory.get(n)}
    med = {n: variants[n]["median_s"] for n in names}
    ratios = {f"{a}/{b}": med[a] / med[b] for a, b in
              [("lora", "fullft"), ("atlas", "fullft"), ("atlas", "lora"), ("atlas_kmeans", "lora"), ("atlas", "atlas_kmeans"), ("atlas", "base"), ("lora", "base"), ("atlas_soft", "lora"), ("atlas_prev", "lora"),
               ("atlas_prev", "base"), ("atlas", "atlas_prev")] if a in med and b in med}
    result = {"shape": shape, "backbone": bb.describe(), "batch": {"sequences": batch_size,
              "length": int(batch["input_ids"].shape[1]), "tokens": tokens,
                                       "real_token_share": real_share},
              "atlas_prepare_s": bb.extras.get("atlas_prepare_s"), "atlas_vs_prev_max_abs_logit_diff": check,
              "variants": variants, "ratios": ratios}
    if TARGET[0] in ratios:
        result["target"] = {"ratio": TARGET[0], "limit": TARGET[1], "value": ratios[TARGET[0]],
                            "met": ratios[TARGET[0]] <= TARGET[1], **paired_target(times, TARGET[0], TARGET[1])}
    if "fullft" in med:
        for n in names:  # throughput as a share of plain full fine-tuning's, on the same batch
            variants[n]["share_of_fullft_throughput"] = med["fullft"] / med[n]
    rows = [[n, variants[n]["ms_per_step"], variants[n]["min_s"] * 1e3, f"{variants[n]['iqr_rel'] * 100:.1f}%",
             variants[n]["tokens_per_s"],
             f"{variants[n]['share_of_fullft_throughput'] * 100:.0f}%" if "fullft" in med else "-",
             med[n] / med["base"] if "base" in med else "-", med[n] / med["lora"] if "lora" in med else "-"]
            for n in names]
    print(f"\n{shape}: training step, median of {args.repeats} ({batch_size} x {batch['input_ids'].shape[1]}, "
          f"{tokens} tokens = {real_share * 100:.0f}% of the padded positions, {bb.dtype}, {bb.device})")
    print(table(["variant", "ms/step", "min ms", "IQR", "tokens/s", "of fullft", "x base", "x lora"], rows) + "\n",
          flush=True)
    if "target" in result and paired_target_line(result["target"]):
        print(paired_target_line(result["target"]), flush=True)
    del models, steps
    return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = common_parser(__doc__.splitlines()[0], "micro,qwen3-cpu", repeats=7, warmup=2)
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16 on micro, else 1)")
    ap.add_argument("--seq", type=int, default=256,
                    help="tokens per sequence for random presets; the truncation length on micro (default 256)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    args = ap.parse_args(argv)
    names = selected_variants(args.variants, VARIANTS)
    keep: list = []
    st = settings(args, keep)
    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(st.device),
               "variants": {n: VARIANTS[n] for n in names}, "target": f"{TARGET[0]} <= {TARGET[1]}",
               "results": [], "complete": False}
    for shape in [s for s in args.shape.split(",") if s]:
        payload["results"].append(bench_shape(shape, st, args, names))
        write_json(args.out, SCRIPT, payload)
    payload["complete"] = True
    write_json(args.out, SCRIPT, payload)
    return payload


if __name__ == "__main__":
    main()
