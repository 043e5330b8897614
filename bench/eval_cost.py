"""Evaluation cost: (a) retained KL vs one plain forward of the adapted model over the same tokens;
(b) reference-cache reuse across an N-run sweep on micro, one shared cache vs one cache per run.

    python -m bench.eval_cost                                   # (a) on micro + qwen3-cpu, (b) on micro
    python -m bench.eval_cost --parts a --shape qwen3-8b --device cuda --dtype bfloat16

(a) The adapted model is ATLAS (conf/method/atlas.yaml) on the backbone. The base side comes from
a cache: `retained_kl.cache_logprobs` run by the base over the same (prompt, response) sequences,
in both storage modes (`full`: every log-prob in float16; `topk`: the top 64 + tail), and the mode
the reference cache would pick under the default 1 GiB budget is named. Timed, interleaved:
`retained_kl(...)` (teacher-forced forward with `logits_to_keep`, log-softmax, KL against the
cache, per-response sums) and a plain `model(input_ids, attention_mask)` over the very same
padded batches (built outside the timing). Sequences: micro's retained evaluation prompts with
their gold responses (`--kl-max-seqs N`: N of them, evenly spaced over both domains); random presets: `--kl-seqs`
random sequences of `--kl-prompt` + `--kl-response` tokens.
The target ratio is also taken per round and judged by the interval of those ratios' median
(`bench.common.paired_target`: met, missed, or unresolved).

(b) N adapted micro models (ATLAS, different factors) are evaluated with `evaluate.evaluate_run`
(the whole run evaluation: retained KL, math answers, choices, code pass@1 in the sandbox) once
with one shared cache folder and once with a fresh folder per run, alternating which goes first.
The separately loaded base counts its forward calls, so the output shows the base reference
built once (shared) vs N times (separate).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import torch
from omegaconf import OmegaConf

from bench.common import (
    REPO,
    add_atlas,
    command_line,
    common_parser,
    environment,
    interleaved,
    load_preset,
    micro_backbone_config,
    micro_benchmark,
    paired_target,
    paired_target_line,
    random_pairs,
    randomize_b,
    retained_pairs,
    settings,
    shared_copy,
    summary,
    synchronize,
    table,
    write_json,
)
from experiments.backbones import backbone_key, load_model
from experiments.evaluation.config import EvalConfig, as_eval_config
from experiments.evaluation.evaluate import evaluate_run
from experiments.evaluation.reference_cache import _choose_mode
from experiments.evaluation.retained_kl import cache_logprobs, retained_kl
from experiments.evaluation.scoring import length_order

SCRIPT = "eval_cost"
TARGET_A = 1.3


def padded_batches(prompt_ids, response_ids, pad_id: int, batch_size: int, device) -> list[tuple]:
    """The batches `scoring.iter_response_logprobs` forms (length order, right padding), as tensors on device."""
    order = length_order(prompt_ids, response_ids)
    out = []
    for start in range(0, len(order), batch_size):
        rows = [list(prompt_ids[i]) + list(response_ids[i]) for i in order[start:start + batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, :len(r)] = torch.tensor(r)
            mask[b, :len(r)] = 1
        out.append((ids.to(device), mask.to(device)))
    return out


def part_a(shape: str, st, args) -> dict:
    bb = load_preset(shape, st)
    if bb.pretrained:
        prompts, responses = retained_pairs(bb, "evaluation")
        if args.kl_max_seqs is not None and args.kl_max_seqs < len(prompts):
            picked = torch.linspace(0, len(prompts) - 1, args.kl_max_seqs).round().long().tolist()
            prompts, responses = [prompts[i] for i in picked], [responses[i] for i in picked]
    else:
        prompts, responses = random_pairs(bb, args.kl_seqs, args.kl_prompt, args.kl_response, st.seed + 5)
    n_tokens = sum(len(r) for r in responses)
    model, _ = add_atlas(shared_copy(bb.model), bb, st)
    model.eval()
    bs = args.kl_batch
    print(f"[{shape}] {len(prompts)} sequences, {n_tokens} response tokens, "
          f"{sum(len(p) for p in prompts) + n_tokens} tokens, batch {bs}", flush=True)
    cfg = EvalConfig.from_group()
    cached = {mode: cache_logprobs(bb.model, prompts, responses, mode=mode, dtype=cfg.logprob_dtype, top_k=cfg.top_k,
                                   pad_id=bb.pad_id, batch_size=bs) for mode in ("full", "topk")}
    auto = _choose_mode(bb.vocab, n_tokens, cfg)
    batches = padded_batches(prompts, responses, bb.pad_id, bs, bb.device)

    def forward():
        with torch.no_grad():
            for ids, mask in batches:
                model(input_ids=ids, attention_mask=mask)

    def kl(mode):
        return lambda: retained_kl(model, prompts, responses, cached[mode], pad_id=bb.pad_id, batch_size=bs)

    calls = {"forward": forward, "kl_full": kl("full"), "kl_topk": kl("topk")}
    times = interleaved(calls, args.repeats, args.warmup, bb.device, label=f"{shape} KL")
    variants = {n: summary(times[n]) for n in calls}
    med = {n: variants[n]["median_s"] for n in calls}
    ratios = {"kl_full/forward": med["kl_full"] / med["forward"], "kl_topk/forward": med["kl_topk"] / med["forward"]}
    value = ratios[f"kl_{auto}/forward"]
    result = {"shape": shape, "backbone": bb.describe(), "sequences": len(prompts), "response_tokens": n_tokens,
              "batch_size": bs, "reference_mode_at_default_budget": auto, "variants": variants, "ratios": ratios,
              "target": {"ratio": f"kl_{auto}/forward", "limit": TARGET_A, "value": value, "met": value <= TARGET_A,
                         **paired_target(times, f"kl_{auto}/forward", TARGET_A)}}
    print(f"\n{shape}: retained KL vs a plain forward, median of {args.repeats} ({len(prompts)} sequences, "
          f"{n_tokens} response tokens; the reference cache would store `{auto}`)")
    print(table(["call", "ms", "min ms", "IQR", "x forward"],
                [[n, med[n] * 1e3, variants[n]["min_s"] * 1e3, f"{variants[n]['iqr_rel'] * 100:.1f}%",
                  med[n] / med["forward"]] for n in calls]) + "\n", flush=True)
    if paired_target_line(result["target"]):
        print(paired_target_line(result["target"]), flush=True)
    return result


class ForwardCounter:
    def __init__(self, model: torch.nn.Module):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args) -> None:
        self.n += 1


def part_b(st, args) -> dict:
    st = dataclasses.replace(st, dtype=None)  # micro in its own float32, like the separately loaded base
    bb = load_preset("micro", st)
    bench = micro_benchmark()
    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "eval" / "micro.yaml"))
    raw.update(max_items_per_domain=args.max_items, max_target_problems=args.max_problems)
    cfg_micro = micro_backbone_config()
    key = backbone_key(cfg_micro)
    base = load_model(cfg_micro, st.device)  # the separately loaded frozen base, as experiments.job does
    for p in base.parameters():
        p.requires_grad_(False)
    counter = ForwardCounter(base)
    models = []
    for i in range(args.runs):
        model, _ = add_atlas(shared_copy(bb.model), bb, st)
        randomize_b(model, st.seed + 100 + i, std=0.05)
        models.append(model.eval())
    records = {"shared": [], "separate": []}
    with tempfile.TemporaryDirectory(prefix="atlas-bench-refcache-") as tmp:
        shared_dir = Path(tmp) / "shared"
        for i, model in enumerate(models):
            order = ["shared", "separate"] if i % 2 == 0 else ["separate", "shared"]
            for mode in order:
                cache_dir = shared_dir if mode == "shared" else Path(tmp) / f"run{i}"
                cfg = as_eval_config({**raw, "cache_dir": str(cache_dir)})
                before = counter.n
                t0 = _now(st.device)
                out = evaluate_run(model, lambda: base, bb.tokenizer, bench, cfg, key, False, progress=False)
                seconds = _now(st.device) - t0
                timing = out["timing"]
                records[mode].append({"run": i, "seconds": seconds, "base_forward_calls": counter.n - before,
                                      "reference_hit": timing["reference_hit"],
                                      "reference_build_s": timing["reference_build_s"],
                                      "kl_s": timing["kl_s"], "generation_s": timing["generation_s"],
                                      "retained_kl_mean": out["retained_kl_mean"]})
                print(f"  [sweep] run {i} {mode}: {seconds:.1f} s, reference "
                      f"{'hit' if timing['reference_hit'] else 'built'}, base forward calls {counter.n - before}",
                      flush=True)
    counter.handle.remove()
    sweep = {}
    for mode, recs in records.items():
        sweep[mode] = {"total_s": sum(r["seconds"] for r in recs),
                       "reference_builds": sum(not r["reference_hit"] for r in recs),
                       "base_forward_calls": sum(r["base_forward_calls"] for r in recs), "runs": recs}
    same_kl = all(abs(a["retained_kl_mean"] - b["retained_kl_mean"]) < 1e-9
                  for a, b in zip(records["shared"], records["separate"]))
    result = {"runs": args.runs, "max_items_per_domain": args.max_items, "max_target_problems": args.max_problems,
              "device": str(st.device), "modes": sweep, "same_metrics": same_kl,
              "ratio_separate_over_shared": sweep["separate"]["total_s"] / sweep["shared"]["total_s"]}
    print(f"\nmicro sweep of {args.runs} runs' evaluation (evaluate_run): one shared reference cache vs one per run")
    print(table(["cache", "total s", "per run s", "reference builds", "base forward calls"],
                [[m, s["total_s"], s["total_s"] / args.runs, s["reference_builds"], s["base_forward_calls"]]
                 for m, s in sweep.items()]))
    print(f"separate / shared: {result['ratio_separate_over_shared']:.2f}x; same metrics either way: {same_kl}\n",
          flush=True)
    return result


def _now(device) -> float:
    synchronize(device)
    return time.perf_counter()


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = common_parser(__doc__.splitlines()[0], "micro,qwen3-cpu", repeats=5, warmup=1)
    ap.add_argument("--parts", default="a,b", help="a (KL vs forward), b (reference-cache reuse on micro), or both")
    ap.add_argument("--kl-batch", type=int, default=32, help="sequences per forward (eval scoring_batch_size: 32)")
    ap.add_argument("--kl-seqs", type=int, default=32, help="random presets: number of sequences")
    ap.add_argument("--kl-max-seqs", type=int, default=None,
                    help="micro: at most this many retained sequences, evenly spaced (default: all)")
    ap.add_argument("--kl-prompt", type=int, default=64, help="random presets: prompt tokens per sequence")
    ap.add_argument("--kl-response", type=int, default=64, help="random presets: response tokens per sequence")
    ap.add_argument("--runs", type=int, default=4, help="(b) runs in the sweep")
    ap.add_argument("--max-items", type=int, default=None, help="(b) eval.max_items_per_domain (default: all)")
    ap.add_argument("--max-problems", type=int, default=None, help="(b) eval.max_target_problems (default: all)")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"a", "b"}:
        raise SystemExit(f"error: --parts {args.parts!r}: allowed a, b, a,b")
    if args.kl_max_seqs is not None and args.kl_max_seqs < 1:
        raise SystemExit(f"error: --kl-max-seqs {args.kl_max_seqs}: must be >= 1")
    keep: list = []
    st = settings(args, keep)
    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(st.device),
               "target_a": f"retained KL / plain forward <= {TARGET_A}", "kl_vs_forward": [], "sweep": None,
               "complete": False}
    if "a" in parts:
        for shape in [s for s in args.shape.split(",") if s]:
            payload["kl_vs_forward"].append(part_a(shape, st, args))
            write_json(args.out, SCRIPT, payload)
    if "b" in parts:
        payload["sweep"] = part_b(st, args)
    payload["complete"] = True
    write_json(args.out, SCRIPT, payload)
    return payload


if __name__ == "__main__":
    main()
