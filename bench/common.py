"""What the benchmarks share: backbones at a shape preset, adapters built through the project's own
methods, interleaved timing with CUDA synchronisation, and the result table / JSON.

Backbones (`--shape`):
- `micro`: the shipped pretrained 2M-parameter Qwen3 (assets/micro/backbone) with its tokenizer;
  training batches, atlas calibration data and KL sequences come from assets/micro/data.
- `qwen3-cpu`: a random-init Qwen3 sized for a 2-core CPU (hidden 1024, 8 layers, MLP 3072,
  16 heads / 8 KV heads of 64, vocabulary 32k).
- any conf/backbone/<name>.yaml with published `shapes` (qwen3-8b, qwen3-4b, qwen3-0.6b,
  llama-3.1-8b, mistral-7b-v0.3, gemma-2-9b): a random-init Qwen3 with those shapes;
  `--layers N` keeps only N decoder layers. Random presets use random token ids as data
  (speed does not depend on the values).

Adapters: LoRA is `baselines.lora.LoRA` (peft) and ATLAS is `atlas.method.ATLAS`, both with the
hyperparameters of conf/method/{lora,atlas}.yaml on the same target modules; the atlas is built
by `ATLAS.prepare` itself from calibration sequences. Variants of one backbone share its frozen
weight tensors (`shared_copy`), so several fit in memory at once.

`LegacyAtlasSite` / `LegacyAtlasLinear` are the conditioned residual exactly as `atlas/layer.py`
computed it before its fast path (all K filter coordinates by einsum, A U_k recomputed by every
module on every call); the benchmarks time it as `atlas_prev` next to the current code.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import peft
import torch
import transformers
from omegaconf import OmegaConf
from scipy.stats import binom
from transformers import AutoModelForCausalLM, Qwen3Config

from atlas.atlas import EPS
from atlas.footprint import ALL_MODULES
from atlas.kmeans import pairwise_sq_dists
from atlas.layer import AtlasLinear, AtlasSite
from experiments import prompts as P
from experiments.backbones import load_backbone
from experiments.config import BackboneConfig, BenchmarkConfig
from experiments.data.benchmark import build_benchmark
from experiments.methods import RunContext, build_named
from experiments.prompts import code_instruction_prompt, code_instruction_response, collate, encode_pair

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
TARGETS = list(ALL_MODULES)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Random-init presets besides the conf/backbone shapes. qwen3-cpu: Qwen3-0.6B's hidden and MLP
# widths with 8 layers, 64-wide heads and a 32k vocabulary, so one training step of 256 tokens
# stays around a second on 2 CPU cores.
RANDOM_PRESETS = {
    "qwen3-cpu": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000},
}
RANDOM_PAD_ID, RANDOM_EOS_ID = 0, 1


# -- command line ---------------------------------------------------------------------------------
def common_parser(description: str, shapes: str, repeats: int, warmup: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shape", default=shapes,
                    help="comma-separated presets: micro, qwen3-cpu or a conf/backbone name with shapes (e.g. qwen3-8b)")
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only this many decoder layers of a random-init preset (default: all)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="model dtype (default: float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=repeats, help="timed repeats per variant (median reported)")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed calls per variant first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atlas-tokens", type=int, default=None,
                    help="calibration tokens per site for building the atlas (default: conf/method/atlas.yaml max_tokens)")
    ap.add_argument("--atlas-cache", default=None,
                    help="folder to keep built atlases in, so later scripts reuse them (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="result JSON (default: bench/results/<script>.json)")
    return ap


@dataclass
class Settings:
    device: torch.device
    dtype: Optional[torch.dtype]
    seed: int
    layers: Optional[int]
    atlas_cache: Path
    atlas_tokens: Optional[int] = None


def selected_variants(spec: str, allowed: dict) -> list[str]:
    """The names in a comma-separated `--variants` value; exits with the allowed names on an unknown one."""
    names = [v for v in spec.split(",") if v]
    unknown = [v for v in names if v not in allowed]
    if unknown:
        raise SystemExit(f"error: --variants {unknown}: allowed {list(allowed)}")
    return names


def settings(args: argparse.Namespace, keep: list) -> Settings:
    """Device, dtype and threads from the common arguments; `keep` holds a temporary atlas folder alive."""
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"error: --device {args.device}: CUDA is not available to this torch")
        if device.index is not None:
            torch.cuda.set_device(device)
        # float32 matmuls keep torch's default precision (no TF32), as in the project's runs: the
        # atlas distances are computed in float32.
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.atlas_cache:
        cache = Path(args.atlas_cache)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="atlas-bench-")
        keep.append(tmp)
        cache = Path(tmp.name)
    return Settings(device, DTYPES[args.dtype] if args.dtype else None, args.seed, args.layers, cache,
                    args.atlas_tokens)


# -- backbones ------------------------------------------------------------------------------------
@dataclass
class Backbone:
    """A loaded backbone at one preset; `model` is frozen and in eval mode."""

    name: str
    model: torch.nn.Module
    tokenizer: Any
    pad_id: int
    eos_id: int
    vocab: int
    shapes: dict
    pretrained: bool
    device: torch.device
    dtype: torch.dtype
    extras: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"preset": self.name, "pretrained": self.pretrained, "dtype": str(self.dtype).replace("torch.", ""),
                "device": str(self.device), "params": sum(p.numel() for p in self.model.parameters()),
                "shapes": self.shapes}


def preset_shapes(name: str) -> dict:
    if name in RANDOM_PRESETS:
        return dict(RANDOM_PRESETS[name])
    path = REPO / "conf" / "backbone" / f"{name}.yaml"
    if not path.is_file() or "shapes" not in OmegaConf.load(path):
        known = ["micro", *RANDOM_PRESETS, *sorted(p.stem for p in (REPO / "conf" / "backbone").glob("*.yaml")
                                                   if "shapes" in OmegaConf.load(p) and p.stem != "micro")]
        raise SystemExit(f"error: --shape {name!r} is not a preset; allowed: {known}")
    return dict(OmegaConf.to_container(OmegaConf.load(path).shapes))


def micro_backbone_config():
    raw = OmegaConf.load(REPO / "conf" / "backbone" / "micro.yaml")
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(BackboneConfig), raw)


def micro_benchmark():
    return build_benchmark(OmegaConf.merge(OmegaConf.structured(BenchmarkConfig),
                                           OmegaConf.load(REPO / "conf" / "benchmark" / "micro.yaml")))


def load_preset(name: str, st: Settings) -> Backbone:
    """The backbone of a preset on `st.device`, frozen, in eval mode."""
    if name == "micro":
        model, tok = load_backbone(micro_backbone_config(), st.device)
        dtype = st.dtype or torch.float32
        model.to(dtype)
        c = model.config
        shapes = {k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}
        bb = Backbone(name, model, tok, tok.pad_token_id, tok.eos_token_id, c.vocab_size, shapes, True, st.device, dtype)
    else:
        shapes = preset_shapes(name)
        if st.layers:
            shapes["num_hidden_layers"] = st.layers
        dtype = st.dtype or (torch.bfloat16 if st.device.type == "cuda" else torch.float32)
        config = Qwen3Config(**shapes, max_position_embeddings=4096, tie_word_embeddings=False,
                             pad_token_id=RANDOM_PAD_ID, eos_token_id=RANDOM_EOS_ID, bos_token_id=None)
        torch.manual_seed(st.seed)
        with torch.device(st.device):  # initialised where it runs: an 8B model never passes through the CPU
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        model.eval()
        bb = Backbone(name, model, None, RANDOM_PAD_ID, RANDOM_EOS_ID, shapes["vocab_size"], shapes, False,
                      st.device, dtype)
    for p in bb.model.parameters():
        p.requires_grad_(False)
    return bb


def shared_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose parameters are the very same tensors (modules and buffers are copied).

    Only for frozen weights that nobody modifies in place: merging a LoRA needs a real `copy.deepcopy`.
    """
    memo = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


# -- data -----------------------------------------------------------------------------------------
def encoded_pairs(tokenizer, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
    return [P.encode_prompt(tokenizer, p) for p, _ in pairs], [P.encode_response(tokenizer, p, r) for p, r in pairs]


def retained_pairs(bb: Backbone, split: str) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, response ids) of the micro retained domains' `split` with gold responses."""
    bench = bb.extras.setdefault("benchmark", micro_benchmark())
    pairs = [(P.retained_prompt(dom.kind, item), P.gold_response(dom.kind, item))
             for _, dom in sorted(bench.retained.items()) for item in getattr(dom, split)]
    return encoded_pairs(bb.tokenizer, pairs)


def random_pairs(bb: Backbone, n: int, prompt_len: int, response_len: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, bb.vocab, (n, prompt_len + response_len), generator=g).tolist()
    return [r[:prompt_len] for r in ids], [r[prompt_len:] for r in ids]


def calibration_reference(bb: Backbone, max_tokens: int, seed: int):
    """What `ATLAS.calibration_groups` reads from a reference cache: calibration prompts + responses."""
    if bb.pretrained:
        prompts, responses = retained_pairs(bb, "calibration")
    else:
        n = max(1, max_tokens // 128)
        prompts, responses = random_pairs(bb, n, 64, 64, seed + 17)
    split = SimpleNamespace(prompt_ids=prompts, response_ids=responses)
    return SimpleNamespace(domains={"calibration": SimpleNamespace(split=lambda name: split)})


def train_batch(bb: Backbone, batch_size: int, seq_len: int, seed: int) -> dict[str, torch.Tensor]:
    """One SFT batch: micro code-instruction examples (their own lengths), or random ids of `seq_len`."""
    if bb.pretrained:
        items = bb.extras.setdefault("benchmark", micro_benchmark()).target_train
        order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()[:batch_size]
        examples = [encode_pair(bb.tokenizer, code_instruction_prompt(items[i]), code_instruction_response(items[i]),
                                seq_len) for i in order]
        batch = collate(examples, bb.pad_id)
    else:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, bb.vocab, (batch_size, seq_len), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return {k: v.to(bb.device) for k, v in batch.items()}


# -- adapters -------------------------------------------------------------------------------------
def run_context(bb: Backbone, run_dir: Path, seed: int, reference: Any = None):
    """A RunContext with what ATLAS.prepare and LoRA.prepare read, outside the run harness."""
    tok = SimpleNamespace(pad_token_id=bb.pad_id, eos_token_id=bb.eos_id)
    return RunContext(tokenizer=tok, benchmark=SimpleNamespace(target_train=[], protect=None), run_dir=Path(run_dir),
                      device=bb.device, seed=seed, target_modules=list(TARGETS), progress=False,
                      reference_fn=(lambda: reference) if reference is not None else None)


def add_lora(model: torch.nn.Module, bb: Backbone, seed: int, **overrides):
    """`baselines.lora.LoRA` (peft) on `model` in place, B drawn non-zero so the residual is not trivially 0."""
    method = build_named("lora", target_modules=TARGETS, **overrides)
    model = method.prepare(model, run_context(bb, Path(tempfile.gettempdir()), seed))
    randomize_b(model, seed)
    return model, method


def atlas_dir(bb: Backbone, st: Settings, hp: dict) -> Path:
    key = (f"{bb.name}-L{bb.shapes['num_hidden_layers']}-{str(bb.dtype).replace('torch.', '')}-{bb.device.type}"
           f"-K{hp['num_centers']}-R{hp['filter_rank']}-e{hp['filter_energy']}-t{hp['max_tokens']}-s{st.seed}"
           f"-P{hp['filter_basis']}-{hp['filter_members']}")
    return st.atlas_cache / key


#: The `atlas_kmeans` variant of the step and decoding benchmarks: the filters before the defaults changed, each fitted
#: on its k-means cluster in the full input space (docs/method.md, "Which tokens fit a filter, and a shared filter basis").
EARLIER_FILTERS = {"filter_basis": None, "filter_members": "kmeans"}


def add_atlas(model: torch.nn.Module, bb: Backbone, st: Settings, **overrides):
    """`atlas.method.ATLAS` on `model` in place; the atlas is built once per settings and reused (loaded)."""
    if st.atlas_tokens:
        overrides["max_tokens"] = st.atlas_tokens
    method = build_named("atlas", target_modules=TARGETS, **overrides)
    hp = method.describe()
    reference = calibration_reference(bb, hp["max_tokens"], st.seed)
    t0 = time.perf_counter()
    model = method.prepare(model, run_context(bb, atlas_dir(bb, st, hp), st.seed, reference))
    bb.extras.setdefault("atlas_prepare_s", []).append(time.perf_counter() - t0)
    randomize_b(model, st.seed)
    return model, method


def randomize_b(model: torch.nn.Module, seed: int, std: float = 0.01) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)


# -- ATLAS before its fast path (bench comparison only) ---------------------------------------------
class LegacyAtlasSite(AtlasSite):
    """`AtlasSite.condition` as computed before the fast path: weights (n, K), coords U_k^T x for every k (n, K, R)."""

    def condition(self, x: torch.Tensor):
        if self._last is not None and self._last[0]() is x:
            return self._last[1]
        flat = x.reshape(-1, x.shape[-1])
        delta_k = pairwise_sq_dists(flat.float(), self.centers.float()) * self.inv_sigma2  # (n, K)
        delta, kstar = delta_k.min(1)
        gate = None
        if self.use_gate:
            gate = torch.sigmoid((delta.clamp_min(EPS).log() - self.log_q) / self.gate_temperature).unsqueeze(1)
        weights = coords = None
        if self.use_filter:
            if self.assign == "soft":
                weights = torch.softmax(-delta_k / self.assign_temperature, dim=1)
            else:
                weights = torch.nn.functional.one_hot(kstar, delta_k.shape[1]).to(delta_k.dtype)
            coords = torch.einsum("nd,kdr->nkr", flat, self.filters.to(flat.dtype))
        out = (gate, weights, coords, kstar)
        self._last = (weakref.ref(x), out)
        return out


class LegacyAtlasLinear(AtlasLinear):
    """`AtlasLinear` as computed before the fast path (A U_k by einsum in every call)."""

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        gate, weights, coords, _ = self.site.condition(x)
        flat = x.reshape(-1, x.shape[-1]).to(self.lora_A.dtype)
        ax = flat @ self.lora_A.T  # (n, r)
        if coords is not None:
            a_u = torch.einsum("rd,kdR->krR", self.lora_A, self.site.filters.to(self.lora_A.dtype))
            ax = ax - torch.einsum("nk,nkR,krR->nr", weights.to(ax.dtype), coords.to(ax.dtype), a_u)
        out = (ax @ self.lora_B.T) * (self.scaling * self.scale_factor)
        if gate is not None:
            out = out * gate.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.residual(x)


class BatchedFormsAtlasSite(AtlasSite):
    """`AtlasSite` without its one-row route: a single row without autograd takes the batched forms, as every
    input did before `AtlasSite.condition_row` existed (bench comparison only)."""

    row_path = False


def use_batched_forms(model: torch.nn.Module) -> torch.nn.Module:
    """Switch every `AtlasSite` of `model` to `BatchedFormsAtlasSite`, in place (same buffers and factors)."""
    sites = [m for m in model.modules() if type(m) is AtlasSite]
    if not sites:
        raise ValueError("the model has no AtlasSite modules")
    for m in sites:
        m.__class__ = BatchedFormsAtlasSite
        m.clear()
    return model


def use_legacy_atlas(model: torch.nn.Module) -> torch.nn.Module:
    """Switch every ATLAS module of `model` to the pre-fast-path code, in place (same buffers and factors)."""
    n = 0
    for m in model.modules():
        if type(m) is AtlasSite:
            m.__class__ = LegacyAtlasSite
            m.clear()
        elif type(m) is AtlasLinear:
            m.__class__ = LegacyAtlasLinear
            n += 1
    if not n:
        raise ValueError("the model has no AtlasLinear modules")
    return model


def clear_atlas_caches(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, AtlasSite):
            m.clear()


# -- timing ---------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of fn(), with the device's queued work finished before the start and before the stop."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def interleaved(variants: dict[str, Callable[[], Any]], repeats: int, warmup: int, device: torch.device,
                label: str = "") -> dict[str, list[float]]:
    """Seconds per call of every variant, `warmup` untimed rounds first, then `repeats` timed rounds.

    Each round runs every variant once, the order rotated by one per round, so slow drifts of the
    machine (thermal, other load) fall on all variants alike.
    """
    names = list(variants)
    for _ in range(warmup):
        for n in names:
            variants[n]()
    synchronize(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names)
        for n in names[shift:] + names[:shift]:
            times[n].append(timed(variants[n], device))
        if label:
            print(f"  [{label}] round {r + 1}/{repeats}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.1f} ms" for n in names),
                  flush=True)
    return times


def summary(seconds: list[float]) -> dict:
    """Median, min, max and the relative spread (IQR / median) of timed repeats."""
    s = sorted(seconds)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    med = statistics.median(s)
    return {"median_s": med, "min_s": s[0], "max_s": s[-1], "iqr_rel": (q[2] - q[0]) / med if med else 0.0,
            "repeats": len(s), "all_s": s}


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Optional[dict]:
    """Distribution-free interval for the median of the population `values` were drawn from: the order statistics
    x_(k) and x_(n+1-k) (1-based, ascending) with the largest k whose coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) is at
    least `confidence`, or the range (k = 1) with its smaller coverage where n is too small for that (n <= 5 at 0.95).

    Returns {"low", "high", "coverage", "k"}; None for fewer than 2 values. It assumes only that the values are
    independent draws (here: timed rounds), not their distribution.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"median_interval: confidence={confidence}; must be in (0, 1)")
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n < 2:
        return None

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k)) = 1 - 2 P(Bin(n, 1/2) <= k - 1)
        return 1.0 - 2.0 * float(binom.cdf(k - 1, n, 0.5))

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"low": xs[k - 1], "high": xs[n - k], "coverage": coverage(k), "k": k}


def interval_verdict(interval: Optional[dict], target: float, at_least: bool) -> Optional[str]:
    """A target judged by a whole `median_interval`: 'met' where all of it satisfies the target (>= target when
    `at_least`, else <= target), 'missed' where none of it does, 'unresolved' where it contains the target (the
    rounds' spread cannot tell); None without an interval."""
    if interval is None:
        return None
    low, high = interval["low"], interval["high"]
    if at_least:
        return "met" if low >= target else ("missed" if high < target else "unresolved")
    return "met" if high <= target else ("missed" if low > target else "unresolved")


def paired_target(times: dict[str, list[float]], ratio: str, limit: float) -> dict:
    """The fields a latency-ratio target `ratio` ("a/b", at most `limit`) gets from paired rounds of `interleaved`:
    each round's time of a over b's in the same round, their median, the `median_interval` of that median and
    the target's verdict by it (`interval_verdict`)."""
    a, b = ratio.split("/")
    per_round = [ta / tb for ta, tb in zip(times[a], times[b])]
    interval = median_interval(per_round)
    return {"per_round": per_round, "median_of_rounds": statistics.median(per_round), "interval": interval,
            "by_rounds": interval_verdict(interval, limit, at_least=False)}


def paired_target_line(target: dict) -> Optional[str]:
    """One printed line for a target with `paired_target`'s fields; None without an interval."""
    iv = target["interval"]
    if iv is None:
        return None
    return (f"target {target['ratio']} <= {target['limit']}: median of the rounds' ratios "
            f"{target['median_of_rounds']:.2f}x, interval {iv['low']:.2f}-{iv['high']:.2f}x "
            f"(coverage {iv['coverage']:.1%}): {target['by_rounds']}")


def peak_memory(device: torch.device) -> Optional[int]:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# -- output ---------------------------------------------------------------------------------------
def _run(cmd: list[str]) -> Optional[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO, timeout=20).stdout.strip()
    except Exception:
        return None


def cpu_model() -> str:
    out = _run(["lscpu"]) or ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    status = _run(["git", "status", "--porcelain", "--", "atlas", "baselines", "experiments", "bench"])
    env = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": str(device),
        "git_commit": _run(["git", "rev-parse", "HEAD"]),
        "git_dirty": None if status is None else bool(status),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def command_line(module: str) -> str:
    return " ".join(["python", "-m", module, *sys.argv[1:]])


def default_out(script: str) -> Path:
    return RESULTS_DIR / f"{script}.json"


def write_json(path: Optional[str], script: str, payload: dict) -> Path:
    out = Path(path) if path else default_out(script)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(out)
    print(f"wrote {out}", flush=True)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (also valid Markdown)."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda items: "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in cells)])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)
