"""What the LoRA-based baselines share: retained calibration data, deterministic per-step draws,
per-module access to peft's LoRA layers, site input statistics, and reloading an exported adapter.

Every method reads retained data only from the calibration split: the base model's own responses
(and log-probabilities) from the reference cache, or the benchmark's calibration items.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from experiments import prompts as P
from experiments.activations import Site, collect_inputs, discover_sites
from experiments.methods import RunContext

PEFT_PREFIX = "base_model.model."


# -- config access -------------------------------------------------------------------------------
def cfg_get(cfg, dotted: str, default=None):
    """`cfg.a.b` for an OmegaConf node or plain mapping, `default` when any level is missing or null."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part)
        except Exception:
            return default
    return default if node is None else node


def sequence_max_length(ctx: RunContext) -> int:
    """The training loop's sequence cap: `train.max_length`, else `backbone.max_length`."""
    return int(cfg_get(ctx.cfg, "train.max_length") or cfg_get(ctx.cfg, "backbone.max_length", 512))


def target_module_names(ctx: RunContext, configured: Optional[Sequence[str]]) -> list[str]:
    return list(configured) if configured else list(ctx.cfg.backbone.target_modules)


def show_progress(ctx: RunContext) -> bool:
    return bool(cfg_get(ctx.cfg, "train.progress", True))


# -- retained calibration data ------------------------------------------------------------------
@dataclass
class CalibrationPair:
    """One retained calibration prompt and the base's cached response to it (token ids)."""

    domain: str
    index: int
    prompt_ids: list[int]
    response_ids: list[int]


def truncate_pair(prompt_ids: Sequence[int], response_ids: Sequence[int], max_length: int) -> tuple[list[int], list[int]]:
    """Cut like `prompts.encode_pair`: keep the prompt's end, cut the response's tail."""
    p, r = list(prompt_ids), list(response_ids)
    if len(p) >= max_length:
        p = p[-(max_length // 2):]
    return p, r[: max_length - len(p)]


def calibration_pairs(reference, max_length: Optional[int] = None) -> list[CalibrationPair]:
    """Every calibration prompt with the base's response, domains in name order, items in split order.

    Pairs whose (truncated) response is empty are dropped: they carry no response token.
    """
    out = []
    for name in sorted(reference.domains):
        split = reference.domains[name].split("calibration")
        for i, (p, r) in enumerate(zip(split.prompt_ids, split.response_ids)):
            if max_length is not None:
                p, r = truncate_pair(p, r, max_length)
            if len(p) and len(r):
                out.append(CalibrationPair(name, i, list(p), list(r)))
    if not out:
        raise ValueError("the reference cache holds no retained calibration responses")
    return out


def pair_example(pair: CalibrationPair) -> dict[str, list[int]]:
    """An encoded training example (loss on the response tokens) from a calibration pair."""
    return {"input_ids": pair.prompt_ids + pair.response_ids,
            "labels": [-100] * len(pair.prompt_ids) + pair.response_ids}


def labelled_calibration_examples(ctx: RunContext, max_length: int) -> list[dict[str, list[int]]]:
    """Calibration items of every protected retained domain with their gold answers, templated as everywhere else."""
    chat = bool(cfg_get(ctx.cfg, "backbone.chat_template", False))
    out = []
    for name in ctx.benchmark.protected:
        dom = ctx.benchmark.retained[name]
        for item in dom.calibration:
            prompt = P.apply_template(ctx.tokenizer, P.retained_prompt(dom.kind, item), chat)
            out.append(P.encode_pair(ctx.tokenizer, prompt, P.gold_response(dom.kind, item), max_length))
    if not out:
        raise ValueError("the benchmark has no retained calibration items")
    return out


def target_examples(ctx: RunContext, max_length: int, limit: Optional[int], seed: int) -> list[dict[str, list[int]]]:
    """Encoded target training examples (as the training loop sees them), a seeded subset of `limit`."""
    chat = bool(cfg_get(ctx.cfg, "backbone.chat_template", False))
    items = list(ctx.benchmark.target_train)
    if limit is not None and limit < len(items):
        keep = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()[:limit]
        items = [items[i] for i in sorted(keep)]
    return [P.encode_pair(ctx.tokenizer, P.apply_template(ctx.tokenizer, P.code_instruction_prompt(i), chat),
                          P.code_instruction_response(i), max_length) for i in items]


# -- determinism ---------------------------------------------------------------------------------
def step_generator(seed: int, step: int, index: int, salt: str) -> torch.Generator:
    """A CPU generator seeded from (salt, seed, step, index) alone: the same draw on resume, no global RNG."""
    digest = hashlib.sha256(f"{salt}|{seed}|{step}|{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


class MicroCounter:
    """Index of the current micro-batch within an optimizer step (hooks run once per micro-batch)."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.index = 0

    def next(self, step: int) -> int:
        if step != self.step:
            self.step, self.index = step, 0
        else:
            self.index += 1
        return self.index


# -- peft LoRA layers ----------------------------------------------------------------------------
def base_name(peft_name: str) -> str:
    """A module's name in the unwrapped backbone (peft prefixes `base_model.model.`)."""
    return peft_name[len(PEFT_PREFIX):] if peft_name.startswith(PEFT_PREFIX) else peft_name


def lora_layers(model: torch.nn.Module, adapter: str = "default") -> dict[str, torch.nn.Module]:
    """Backbone module name -> peft LoRA layer holding `adapter`, in module order."""
    from peft.tuners.lora import LoraLayer

    return {base_name(n): m for n, m in model.named_modules()
            if isinstance(m, LoraLayer) and adapter in getattr(m, "lora_A", {})}


def lora_delta(layer: torch.nn.Module, adapter: str = "default") -> torch.Tensor:
    """(out, in) update s * B A of one LoRA layer (differentiable)."""
    a = layer.lora_A[adapter].weight
    b = layer.lora_B[adapter].weight
    return layer.scaling[adapter] * (b @ a)


def load_peft_export(model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
    """The backbone `model` with an exported peft adapter (`export` output) loaded on top, for inference."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(export_dir))


# -- site statistics -----------------------------------------------------------------------------
def probe_ids(ctx: RunContext) -> torch.Tensor:
    return torch.tensor([[ctx.tokenizer.eos_token_id or 0] * 4], device=ctx.device)


def site_inputs(
    model: torch.nn.Module,
    ctx: RunContext,
    targets: Sequence[str],
    sequences: Sequence[dict],
    *,
    max_tokens: Optional[int],
    seed: int,
    batch_size: int,
    sites: Optional[list[Site]] = None,
) -> tuple[list[Site], dict[str, torch.Tensor]]:
    """Sites of the (unwrapped) backbone and each site's (n_tokens, dim) inputs over `sequences`."""
    sites = sites or discover_sites(model, targets, probe_ids(ctx))
    inputs = collect_inputs(model, sites, sequences, pad_id=ctx.tokenizer.pad_token_id, batch_size=batch_size,
                            max_tokens=max_tokens, seed=seed, device=ctx.device, progress=show_progress(ctx))
    return sites, inputs


def load_or_build_site_tensors(
    path: Path, build: Callable[[], tuple[dict[str, torch.Tensor], dict[str, list[str]]]]
) -> tuple[dict[str, torch.Tensor], dict[str, list[str]], bool]:
    """Per-site tensors saved at `path` by an earlier call of this run (a resumed run reuses them bit for
    bit), else built and saved. `build` returns (tensors keyed `<site>/<what>`, site -> module names).

    Returns (tensors, sites, loaded). One tensor per site, however many modules read it.
    """
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(path)
    if path.is_file():
        with safe_open(str(path), framework="pt") as fh:
            sites = json.loads(fh.metadata()["sites"])
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        return tensors, sites, True
    tensors, sites = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
              metadata={"sites": json.dumps(sites)})
    tmp.replace(path)
    return tensors, sites, False
