"""Training throughput of the suite's own loop, every method, as a share of plain full fine-tuning in the same process.

    python -m bench.throughput                              # micro, every method, 3 length groups and 1
    python -m bench.throughput --methods lora,atlas --groups 1,2,3,4 --repeats 5
    python -m bench.throughput --methods lora,atlas --groups 3 --atlas-parts --floor   # where ATLAS's step goes
    python -m bench.throughput --methods fullft,lora,atlas --groups 3 --shape qwen3-cpu --layers 4   # wider layers

Each method is what `python run.py method=<name>` trains: its config (conf/method/<name>.yaml), the backbone and
benchmark of `--backbone`, prepared by `experiments.job.Job.load_and_prepare` (an atlas, a Fisher, a replay pool,
a decomposition: whatever the method builds before training), then trained by `experiments.train.train` itself,
with its hooks (`mix_batches`, `extra_loss`, `after_step`). A method's tokens/s is the loop's own measure,
`tokens_seen / train_seconds` of the returned `TrainResult`: real tokens (replayed ones included) per second of
the step loop (checkpoint writes excluded).

`plain` is the reference the shares are taken of: plain full-parameter fine-tuning of the backbone in a minimal
loop, AdamW, gradient clipping at 1.0, batches of the same examples with no padding (each step's examples
concatenated and cut into `batch_size` rows of equal width, every token a target). It is the throughput the
hardware gives a dense batch of this model, with nothing a suite adds.

`frozen` (`--floor`): the frozen backbone through the loop's batching, forward and backward to the input
embeddings, no adapter, no optimizer: the floor under any method's step on these batches.

`--atlas-parts` adds three variants of `method=atlas` that take its step apart: `conditioning=0` (the same layer and
factors with neither gate nor filter computed: what the residual costs by itself), the full method with no
gradient through the conditioning (`DetachedConditioningSite`: the same forward, the gate and the filter
coordinates treated as constants in the backward), and the full method computed in another, equal order
(`SiteInputSite`: filter and gate applied once to each site's input, the site's A factors as one product).
atlas - detached = the backward through the conditioning; detached - conditioning=0 = its forward and the
residual's use of it; atlas - per site = what the per-module order costs against the per-site one.

`--shape` keeps the backbone's tokenizer, vocabulary and data but gives the model the widths of a preset
(`bench.common.preset_shapes`: qwen3-cpu, or a conf/backbone with `shapes` such as qwen3-8b; `--layers` keeps that
many decoder layers): a random-init Qwen3 saved to a scratch folder and used as `backbone.path` by every variant.
On micro the hidden size is 192, where every adapter's products are thin and a step is many small operations;
at qwen3-cpu's 1024 the same loop, methods and examples show what the wider matrices of a real backbone do to the
shares (speed does not depend on the weights' values).

Layouts: `--groups` values of `train.length_groups` (`experiments.batching`: a micro-batch as at most that many
right-padded groups of similar length; 1 = one right-padded batch). Every timed round runs `--steps` steps of
each (method, groups) in turn, the order rotated each round, after one untimed warm-up round; the median round
is reported. Every method starts each round from the same data position, so all see the same batches.

Uncertainty: a round's share is the method's tokens/s over plain's in that round. The JSON and the table give the
median of those per-round shares with a distribution-free interval for it (`bench.common.median_interval`, order
statistics, about 95%: with 21 rounds the 6th to the 16th of the sorted shares), and each target's verdict by that
interval: met (all of it at or above the target), missed (all of it below), or unresolved (it contains the target).
`share_of_plain` stays the ratio of the two median rounds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, Qwen3Config

from atlas.atlas import EPS
from atlas.layer import AtlasLinear, AtlasSite
from bench.common import (
    REPO,
    command_line,
    environment,
    interval_verdict,
    median_interval,
    preset_shapes,
    summary,
    table,
    write_json,
)
from experiments.backbones import load_backbone, load_tokenizer
from experiments.batching import sft_loss_sum, target_groups
from experiments.config import TrainConfig, validate_config
from experiments.data.benchmark import build_benchmark
from experiments.job import Job, encode_target
from experiments.methods import build_method
from experiments.train import DataStream, train
from suite_schema import registry, run_identity

SCRIPT = "throughput"
DEFAULT_METHODS = tuple(registry.trained_methods())  # every method a comparison trains (suite_schema.registry)
TARGETS = {"lora": 1.0, "atlas": 0.8}  # share of plain full fine-tuning's tokens/s


def compose(method: str, backbone: str, overrides: Sequence[str]):
    """The composed config of `python run.py method=<method> backbone=<backbone> <overrides>`."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose("config", overrides=[f"method={method}", f"backbone={backbone}", *overrides])


def has_length_groups() -> bool:
    """Whether this checkout's loop has `train.length_groups` (code from before it ran one padded batch)."""
    return "length_groups" in {f.name for f in dataclasses.fields(TrainConfig)}


def widened_backbone(backbone: str, shape: str, layers: Optional[int], folder: Path) -> list[str]:
    """Save a random-init Qwen3 with the widths of preset `shape` (hidden, MLP, heads, layers; `layers` overrides the
    count) and the vocabulary and tokenizer of conf/backbone/`backbone` into `folder`; return the overrides that
    make it the backbone (`backbone.path`, `backbone.shapes`)."""

    cfg = compose("lora", backbone, []).backbone
    tokenizer = load_tokenizer(cfg)
    shapes = {k: v for k, v in preset_shapes(shape).items() if k != "vocab_size"}
    if layers:
        shapes["num_hidden_layers"] = layers
    shapes["vocab_size"] = len(tokenizer)
    config = Qwen3Config(**shapes, max_position_embeddings=max(4096, int(cfg.max_length)), tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return [f"backbone.path={folder}", *(f"backbone.shapes.{k}={v}" for k, v in shapes.items())]


class LoopVariant:
    """One method prepared as `run.py` prepares it, timed through `experiments.train.train`."""

    def __init__(self, method_name: str, backbone: str, overrides: Sequence[str], scratch: Path,
                 label: Optional[str] = None) -> None:

        typed = validate_config(compose(method_name, backbone, overrides))
        run_id = run_identity.run_id_of(OmegaConf.to_container(typed, resolve=True))
        method = build_method(typed.method)
        benchmark = build_benchmark(typed.benchmark)
        self.name, self.scratch, self.backbone_cfg = label or method_name, scratch, typed.backbone
        job = Job(typed, run_id, scratch / run_id, method, benchmark, logger=None, base_record={},
                  started=datetime.now(timezone.utc))
        t0 = time.perf_counter()
        self.model, self.ctx, self.train_cfg = job.load_and_prepare()
        self.prepare_s = time.perf_counter() - t0
        self.method = method
        self.examples = encode_target(benchmark, job.tokenizer, typed.backbone.chat_template, self.train_cfg.max_length)
        self.tokenizer, self.calls = job.tokenizer, 0

    def run(self, steps: int, groups: Optional[int]) -> tuple[int, float]:
        """(real tokens, seconds) of `steps` training steps from the data stream's start, in a fresh run folder."""
        self.calls += 1
        extra = {"length_groups": groups} if groups else {}
        cfg = dataclasses.replace(self.train_cfg, steps=steps, warmup_steps=0, checkpoint_every=10**9,
                                  keep_checkpoints=1, progress=False, **extra)
        self.ctx.run_dir = self.scratch / f"{self.name}-{self.calls}"
        result = train(self.model, self.method, self.examples, self.ctx, cfg)
        return result.tokens_seen, result.train_seconds


class DetachedConditioningSite(AtlasSite):
    """`atlas.layer.AtlasSite` whose conditioning (k*, gate, z) is computed without autograd: the same forward, but
    no gradient flows back through the gate and the filter coordinates to the site's input. A measurement device for
    what that backward costs (`--atlas-parts`), not a method: the trained method keeps the gradient."""

    def condition(self, x: torch.Tensor):
        with torch.no_grad():
            return super().condition(x)


def detach_conditioning(model: torch.nn.Module) -> int:
    """Switch every `AtlasSite` of `model` to `DetachedConditioningSite` in place; returns how many."""
    sites = [m for m in model.modules() if type(m) is AtlasSite]
    for m in sites:
        m.__class__ = DetachedConditioningSite
    return len(sites)


class SiteInputSite(AtlasSite):
    """`atlas.layer.AtlasSite` computing ATLAS's default conditioning (hard assignment, subspace gate, shared filter
    basis, conditioning 1) in another, mathematically equal order: the filter and the gate applied once to the site's
    input, x_c = g(x) (x - V (W z)) with (W z) the kept coordinates mapped back into the basis, and the A factors of
    every module reading the site concatenated into one product x_c [A_1; ..; A_m]^T. Per module only s B (.) is left,
    LoRA's own second product. A measurement device for whether fewer per-module operations (at the price of n x d
    work per site) make the step faster (`--atlas-parts`), not a method: the layer keeps its per-module form."""

    members: list

    def low_rank(self, x: torch.Tensor) -> torch.Tensor:
        """(n, m r): g(x) [A_1; ..; A_m] Pi(x) x for the site's m modules, cached for the most recent input."""
        if self._last is not None and self._last[0]() is x:
            return self._last[1]
        flat = x.reshape(-1, x.shape[-1])
        n, k = flat.shape[0], self.centers.shape[0]
        onehot = (self.nearest(flat).unsqueeze(1) == self.center_ids).to(flat.dtype)
        basis, coefs = self.basis.to(flat.dtype), self.coef_cols.to(flat.dtype)
        kept = ((flat @ basis) @ coefs).view(n, k, -1) * onehot.unsqueeze(2)  # U_k*^T x in block k*
        energy = flat.float().square().sum(1)  # the gate in float32, as the layer computes it
        signal = (energy - kept.view(n, -1).float().square().sum(1)).clamp_min(0.0) / energy.clamp_min(EPS)
        gate = torch.sigmoid((signal.clamp_min(EPS).log() - self.log_q) * self.gate_slope).unsqueeze(1)
        filtered = torch.addmm(flat, kept.view(n, -1) @ coefs.T, basis.T, alpha=-1.0)  # Pi(x) x
        factors = self.members[0].lora_A if len(self.members) == 1 else torch.cat([m.lora_A for m in self.members])
        out = (filtered * gate.to(flat.dtype)) @ factors.T
        self._last = (weakref.ref(x), out)
        return out


class SiteInputLinear(AtlasLinear):
    """`atlas.layer.AtlasLinear` that takes its r columns of its `SiteInputSite`'s shared product (see there)."""

    index: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        r = self.lora_A.shape[0]
        low = self.site.low_rank(x)[:, self.index * r:(self.index + 1) * r]
        out = torch.addmm(y.reshape(-1, self.out_features), low, self.lora_B.T, alpha=self.scaling * self.scale_factor)
        return out.view(y.shape)


def site_input_form(model: torch.nn.Module) -> int:
    """Switch every `AtlasLinear` of `model` and its site to `SiteInputLinear` / `SiteInputSite` in place (ATLAS's
    default conditioning only; anything else is refused); returns how many sites."""
    layers = [m for m in model.modules() if type(m) is AtlasLinear]
    for m in layers:  # every layer checked before any is switched
        site = m.site
        if not (site.assign == "hard" and site.use_gate and site.use_filter and site.gate_signal == "subspace"
                and site.gate_temperature == 1.0 and site.conditioning == 1.0 and site.basis is not None
                and m.lora_A.dtype == m.base.weight.dtype):
            raise ValueError("site_input_form times ATLAS's default conditioning only (hard assignment, subspace gate "
                             "at temperature 1, a shared filter basis, conditioning 1, factors in the backbone's dtype)")
    sites: dict[int, AtlasSite] = {}
    for m in layers:
        site = m.site
        if id(site) not in sites:
            sites[id(site)] = site
            site.members = []
        m.index = len(site.members)
        site.members.append(m)
        m.__class__ = SiteInputLinear
    for site in sites.values():
        site.clear()
        site.__class__ = SiteInputSite
    return len(sites)


#: `--atlas-parts`: ATLAS's step taken apart, each a variant of `method=atlas` (label -> overrides, what is done to
#: the prepared model)
ATLAS_PARTS = {"atlas, conditioning=0": (["method.conditioning=0"], None),
               "atlas, no gradient through the conditioning": ([], detach_conditioning),
               "atlas, filter and gate once per site input": ([], site_input_form)}


class PlainFullFT:
    """Plain full fine-tuning: every weight of a copy of the backbone, AdamW, dense rows of the same examples."""

    def __init__(self, model: torch.nn.Module, examples: list[dict], batch_size: int, lr: float, seed: int) -> None:
        self.model = copy.deepcopy(model).train()
        for p in self.model.parameters():
            p.requires_grad_(True)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=lr)
        self.examples, self.batch_size, self.seed, self.stream_cls = examples, batch_size, seed, DataStream

    def run(self, steps: int, groups: Optional[int]) -> tuple[int, float]:
        stream = self.stream_cls(len(self.examples), self.seed)
        tokens, seconds = 0, 0.0
        for _ in range(steps):
            ids = [t for i in stream.take(self.batch_size) for t in self.examples[i]["input_ids"]]
            width = len(ids) // self.batch_size
            batch = torch.tensor(ids[: width * self.batch_size]).view(self.batch_size, width)
            t0 = time.perf_counter()
            out = self.model(input_ids=batch, labels=batch, use_cache=False)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            seconds += time.perf_counter() - t0
            tokens += batch.numel()
        return tokens, seconds


class FrozenFloor:
    """The frozen backbone through the loop's own batching (`experiments.batching`): forward and backward down to the
    input embeddings, no adapter and no optimizer. No method that trains on these batches can be faster."""

    def __init__(self, model: torch.nn.Module, examples: list[dict], batch_size: int, pad_id: int, seed: int) -> None:
        self.model = copy.deepcopy(model).train()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.enable_input_require_grads()
        self.examples, self.batch_size, self.pad_id, self.seed, self.stream_cls = examples, batch_size, pad_id, seed, DataStream

    def run(self, steps: int, groups: Optional[int]) -> tuple[int, float]:
        stream = self.stream_cls(len(self.examples), self.seed)
        tokens, seconds = 0, 0.0
        for _ in range(steps):
            micro = [self.examples[i] for i in stream.take(self.batch_size)]
            t0 = time.perf_counter()
            out = target_groups(micro, self.pad_id, groups, torch.device("cpu"))
            batches, targets = out[0], out[1]  # (batches, targets[, tokens]) in every version of the loop
            for b in batches:
                (sft_loss_sum(self.model, b) / targets).backward()
                tokens += int(b["attention_mask"].sum())
            seconds += time.perf_counter() - t0
        return tokens, seconds


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="micro", help="conf/backbone/<name> (default micro)")
    ap.add_argument("--shape", default=None,
                    help="a random-init model with this preset's widths (qwen3-cpu, or a conf/backbone name with shapes) "
                         "and the backbone's tokenizer and data (default: the backbone itself)")
    ap.add_argument("--layers", type=int, default=None, help="with --shape: keep this many decoder layers")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported; default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--out", default=None, help="result JSON (default: bench/results/throughput.json)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated conf/method names")
    ap.add_argument("--groups", default="3,1", help="comma-separated train.length_groups values (default 3,1)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per method and round (default 10)")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override for every method (repeatable)")
    ap.add_argument("--floor", action="store_true",
                    help="also time `frozen`: the frozen backbone through the loop's batching, the floor of any method")
    ap.add_argument("--atlas-parts", action="store_true",
                    help="also time ATLAS at conditioning=0 (its layer without the conditioning), with no gradient "
                         "through the conditioning, and with filter and gate applied once per site input: where "
                         "ATLAS's step goes beyond LoRA's")
    args = ap.parse_args(argv)
    for key, least in (("repeats", 1), ("steps", 1), ("warmup", 0), ("layers", 1)):
        if getattr(args, key) is not None and getattr(args, key) < least:
            raise SystemExit(f"error: --{key} {getattr(args, key)}: must be >= {least}")
    try:
        group_counts = [int(x) for x in args.groups.split(",") if x]
    except ValueError:
        raise SystemExit(f"error: --groups {args.groups!r}: comma-separated integers >= 1") from None
    if not group_counts or min(group_counts) < 1:
        raise SystemExit(f"error: --groups {args.groups!r}: comma-separated integers >= 1")
    if not has_length_groups():  # code from before length groups: one right-padded batch per micro-batch
        group_counts = [None]
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in registry.method_names()]
    if unknown:
        raise SystemExit(f"error: --methods: {unknown} not in conf/method (registered: {registry.method_names()})")
    if args.layers and not args.shape:
        raise SystemExit("error: --layers needs --shape (the backbone's own model keeps its layers)")
    if args.shape:
        preset_shapes(args.shape)  # an unknown preset stops here, with the allowed ones

    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(torch.device("cpu")),
               "backbone": args.backbone, "shape": args.shape, "layers": args.layers, "steps_per_round": args.steps,
               "rounds": args.repeats, "complete": False}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:  # run folders and their checkpoints
        if args.shape:
            args.override = [*widened_backbone(args.backbone, args.shape, args.layers, Path(tmp) / "backbone"),
                             *args.override]
        payload = _measure(args, methods, group_counts, Path(tmp), payload)
    write_json(args.out, SCRIPT, payload)
    return payload


def _measure(args: argparse.Namespace, methods: list[str], group_counts: list, scratch: Path, payload: dict) -> dict:
    """Prepare every variant, time the interleaved rounds, and return `payload` with the results."""
    rounds = args.repeats
    variants: dict[str, object] = {}
    prepare_s = {}
    for m in methods:
        print(f"[prepare] {m}", flush=True)
        variants[m] = LoopVariant(m, args.backbone, args.override, scratch)
        prepare_s[m] = variants[m].prepare_s
    for label, (overrides, transform) in (ATLAS_PARTS.items() if args.atlas_parts else ()):
        print(f"[prepare] {label}", flush=True)
        variants[label] = LoopVariant("atlas", args.backbone, [*args.override, *overrides], scratch, label=label)
        prepare_s[label] = variants[label].prepare_s
        if transform is not None:
            transform(variants[label].model)

    first = next(iter(variants.values()))
    backbone_model, _ = load_backbone(first.backbone_cfg, torch.device("cpu"))
    reference = {"plain": PlainFullFT(backbone_model, first.examples, first.train_cfg.batch_size, first.train_cfg.lr,
                                      first.ctx.seed)}
    if args.floor and has_length_groups():
        reference["frozen"] = FrozenFloor(backbone_model, first.examples, first.train_cfg.batch_size,
                                          first.tokenizer.pad_token_id, first.ctx.seed)
    variants = {**reference, **variants}
    runs = [(name, groups) for name in variants for groups in ([None] if name == "plain" else group_counts)]
    times: dict[tuple, list[float]] = {r: [] for r in runs}
    tokens: dict[tuple, int] = {}
    for rnd in range(args.warmup + rounds):
        order = runs[rnd % len(runs):] + runs[: rnd % len(runs)]
        for name, groups in order:
            n, sec = variants[name].run(args.steps, groups)
            if rnd >= args.warmup:
                times[(name, groups)].append(sec)
                tokens[(name, groups)] = n
        print(f"[round {rnd + 1}/{args.warmup + rounds}]{' (warm-up)' if rnd < args.warmup else ''} done", flush=True)

    plain_tps = tokens[("plain", None)] / statistics.median(times[("plain", None)])
    plain_rounds = times[("plain", None)]
    rows, results = [], []
    for name, groups in runs:
        s = summary(times[(name, groups)])
        tps = tokens[(name, groups)] / s["median_s"]
        share = tps / plain_tps
        # Paired by round: the method's tokens/s over plain's in the same round, so a slow stretch of the machine
        # that falls on one round moves both; the interval is that of the median of these ratios.
        per_round = [(tokens[(name, groups)] / t) / (tokens[("plain", None)] / p)
                     for t, p in zip(times[(name, groups)], plain_rounds)]
        interval = median_interval(per_round)
        label = "dense" if name == "plain" else (f"{groups} groups" if groups else "padded (before groups)")
        if name == "frozen":
            label += ", frozen"
        entry = {"method": name, "groups": label, "length_groups": groups, **s,
                 "tokens": tokens[(name, groups)], "tokens_per_s": tps, "share_of_plain": share,
                 "rounds_s": times[(name, groups)], "share_per_round": per_round,
                 "share_median_of_rounds": statistics.median(per_round),
                 "share_interval": interval, "prepare_s": prepare_s.get(name)}
        if name in TARGETS:
            entry["target"] = {"share_of_plain": TARGETS[name], "met": share >= TARGETS[name],
                               "by_rounds": interval_verdict(interval, TARGETS[name], at_least=True)}
        results.append(entry)
        paired = f"{entry['share_median_of_rounds'] * 100:.0f}%"
        if interval is not None:
            paired += f" [{interval['low'] * 100:.0f}-{interval['high'] * 100:.0f}%]"
        rows.append([name, entry["groups"], tokens[(name, groups)], s["median_s"] * 1e3 / args.steps,
                     f"{s['iqr_rel'] * 100:.1f}%", tps, f"{share * 100:.0f}%", paired])
    payload.update(results=results, complete=True)
    where = f"{args.backbone} at {args.shape}'s widths" + (f", {args.layers} layers" if args.layers else "") \
        if args.shape else args.backbone
    print(f"\n{where}: training loop, {args.steps} steps per round, median of {rounds} rounds")
    print(table(["method", "groups", "tokens/round", "ms/step", "IQR", "tokens/s", "of plain", "per round [interval]"],
                rows) + "\n", flush=True)
    coverages = {round(r["share_interval"]["coverage"], 3) for r in results if r["share_interval"]}
    if coverages:
        print(f"per round: the median over rounds of each round's share, in brackets the distribution-free interval of "
              f"that median (coverage {', '.join(f'{c:.1%}' for c in sorted(coverages))})")
    for r in results:
        if "target" in r and r["target"]["by_rounds"] is not None:
            print(f"target {r['method']} ({r['groups']}) >= {r['target']['share_of_plain']:.0%} of plain: "
                  f"{r['target']['by_rounds']} by the rounds' interval", flush=True)
    return payload


if __name__ == "__main__":
    main()
