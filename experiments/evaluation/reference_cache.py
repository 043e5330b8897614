"""The reference cache: everything about the frozen BASE model that retained metrics compare against.

For one backbone x benchmark x decoding setup x reference seed, and for every retained domain and
both of its splits (calibration and evaluation):

- the base's reference responses (sampled at `reference_temperature` with `reference_seed`, or
  greedy), as text and token ids, with the templated prompts and their ids;
- the base's log-probabilities at every response token: the full vocabulary in
  `logprob_dtype` when that split's vocab x response tokens x bytes fits half of `logprob_budget_mb`
  (so both splits together fit it), else the top-k log-probs, their indices and the tail log-mass
  (see `retained_kl.CachedLogprobs`). Each split's storage depends on that split alone: what a
  method reads from the calibration split is the same whichever split a run evaluates on
  (`experiments.reuse` relies on it);

and, on the evaluation split only (the split answer-level metrics are reported on):

- math: the base's greedy responses and their extracted answers (when the reference responses
  are greedy they are reused, otherwise one extra greedy pass runs on the evaluation prompts);
- choice: each choice's log-likelihood and the base's raw and normalised choices.

It is stored under `cache_dir/ref-<backbone>-<key>/` (manifest.json, written last with the sha256 of
every file and of its own other fields, + one safetensors file per split; a load verifies the checksums and
rebuilds an entry whose files or manifest are missing, truncated or altered), written into a temporary folder
and moved into place with `os.replace`, and built under an exclusive `fcntl` lock so concurrent runs of a sweep
build it once (`experiments.disk_cache`'s protocol). The key hashes everything the contents depend on (see
`reference_key`): a later call with the same key loads it and runs no base forward pass at all; `base_model` may
be a zero-argument callable so that a cache hit does not even load the base.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from safetensors.torch import load_file

from experiments import prompts as P
from experiments.disk_cache import (
    exclusive_lock,
    file_checksums,
    is_complete,
    remove_dead_builds,
    usable,
    write_manifest,
)
from experiments.evaluation.answers import extract_math_answer
from experiments.evaluation.config import EvalConfig, require_eval_config
from experiments.evaluation.generation import encode_prompts, generate, pad_token_id
from experiments.evaluation.retained_kl import (
    LOGPROB_TORCH_DTYPES,
    CachedLogprobs,
    cache_logprobs,
)
from experiments.evaluation.scoring import score_choices
from experiments.log import timed_phase
from experiments.tensor_files import save_tensors

log = logging.getLogger("suite.eval")

CACHE_FORMAT_VERSION = 2  # 2: log-prob storage chosen per split (1: over both splits together)
SPLITS = ("calibration", "evaluation")
#: The split of a domain's far items (`benchmark.far`), cached like `evaluation` where a domain has them.
FAR = "far"
#: Splits whose answer-level reference (greedy answers, choices) is cached: the evaluated ones.
EVALUATED = ("evaluation", FAR)


def domain_splits(dom: Any) -> tuple[str, ...]:
    """The cached splits of a retained domain: calibration, evaluation, and `far` where it has far items."""
    return SPLITS + ((FAR,) if getattr(dom, FAR, None) else ())


@dataclass
class SplitReference:
    """The base's reference data on one split of one retained domain (lists in item order)."""

    items: list[dict]
    prompts: list[str]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_texts: list[str]
    logprobs: CachedLogprobs
    greedy_texts: Optional[list[str]] = None
    greedy_answers: Optional[list[Optional[str]]] = None
    choice_loglik: Optional[list[list[float]]] = None
    choice: Optional[list[int]] = None
    choice_norm: Optional[list[int]] = None

    def metadata(self) -> dict:
        return {
            "prompts": self.prompts,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_texts": self.response_texts,
            "greedy_texts": self.greedy_texts,
            "greedy_answers": self.greedy_answers,
            "choice_loglik": self.choice_loglik,
            "choice": self.choice,
            "choice_norm": self.choice_norm,
        }


@dataclass
class DomainReference:
    name: str
    kind: str
    calibration: SplitReference
    evaluation: SplitReference
    far: Optional[SplitReference] = None

    def split(self, name: str) -> SplitReference:
        return getattr(self, name)


@dataclass
class ReferenceCache:
    """A loaded reference cache. `modes`: each split's log-prob storage (`full` or `topk`). `stats`: `hit` (bool),
    `build_s` (the cold build's seconds, recorded at build time), `load_s`, `lock_wait_s`, `n_tokens`, `bytes`."""

    key: str
    path: Path
    modes: dict[str, str]
    components: dict
    domains: dict[str, DomainReference]
    stats: dict = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """The evaluation split's log-prob storage: what the retained KL is computed against."""
        return self.modes["evaluation"]


ModelOrFactory = Union[Any, Callable[[], Any]]


def retained_items(items: list[dict], cfg: EvalConfig) -> list[dict]:
    """The items a split contributes: the first `max_items_per_domain` (all when null)."""
    return list(items) if cfg.max_items_per_domain is None else list(items[: cfg.max_items_per_domain])


def _sha(obj: Any) -> str:
    data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def model_fingerprint(model: Any) -> str:
    """A cheap checksum of a model's weights: per tensor its name, dtype, shape, float64 sum and
    absolute sum, and the exact values of an evenly strided sample of up to 4096 entries.

    Hashing every byte of an 8B model would read 16 GB; this reads each tensor once on its own
    device and moves only the sample, and still changes when any weight is rewritten (e.g. by a
    PiSSA-style initialisation of a supposedly frozen base) or when the dtype changes.
    """
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in sorted(model.state_dict().items()):
            flat = t.detach().reshape(-1)
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            if flat.numel() == 0:
                continue
            total = torch.zeros(2, dtype=torch.float64, device=flat.device)
            for chunk in flat.split(1 << 24):  # bounded temporary memory on large embeddings
                chunk = chunk.double() if chunk.is_floating_point() else chunk.long().double()
                total += torch.stack([chunk.sum(), chunk.abs().sum()])
            h.update(total.cpu().numpy().tobytes())
            step = max(1, flat.numel() // 4096)
            sample = flat[::step][:4096]
            sample = sample.float() if sample.is_floating_point() else sample.long()
            h.update(sample.cpu().numpy().tobytes())
    return h.hexdigest()


def model_config_hash(model: Any) -> str:
    """Hash of the model config, without the fields that name where it was loaded from."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "none"
    d = cfg.to_dict()
    for k in ("_name_or_path", "transformers_version", "_commit_hash"):
        d.pop(k, None)
    return _sha(d)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of the tokenizer's full definition (fast tokenizers) or vocabulary, special tokens and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = {
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "chat_template_kwargs": getattr(tokenizer, "chat_template_kwargs", None),
    }
    return _sha(body.encode() + _sha(extra).encode())


def _split_prompts(tokenizer: Any, kind: str, items: list[dict], chat_template: bool) -> list[str]:
    return [P.apply_template(tokenizer, P.retained_prompt(kind, item), chat_template) for item in items]


def reference_key(
    base_model: Any, tokenizer: Any, benchmark: Any, cfg: EvalConfig, backbone_key: str, chat_template: bool
) -> tuple[str, dict]:
    """(key, components): the sha256 of everything a reference cache's contents depend on."""
    domains = {}
    for name, dom in sorted(benchmark.retained.items()):
        entry = {"kind": dom.kind}
        for split in domain_splits(dom):
            items = retained_items(getattr(dom, split), cfg)
            texts = _split_prompts(tokenizer, dom.kind, items, chat_template)
            entry[split] = {
                "n": len(items),
                "items": _sha(items),
                "prompts": _sha(texts),
                "prompt_ids": _sha(encode_prompts(tokenizer, texts)),
            }
        domains[name] = entry
    components = {
        "format_version": CACHE_FORMAT_VERSION,
        "backbone": backbone_key,
        "weights": model_fingerprint(base_model),
        "model_config": model_config_hash(base_model),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "chat_template": bool(chat_template),
        "domains": domains,
        "decoding": {
            "sampling": cfg.reference_sampling,
            "temperature": cfg.reference_temperature if cfg.reference_sampling else None,
            "seed": cfg.reference_seed if cfg.reference_sampling else None,
            "max_new_tokens_math": cfg.max_new_tokens_math,
            "max_new_tokens_choice": cfg.max_new_tokens_choice,
        },
        "logprobs": {"budget_mb": cfg.logprob_budget_mb, "dtype": cfg.logprob_dtype, "top_k": cfg.top_k},
    }
    return _sha(components), components


def cache_path(cfg: EvalConfig, backbone_key: str, key: str) -> Path:
    """`<cache_dir>/ref-<backbone slug>-<key[:24]>`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", backbone_key).strip("._")[-48:] or "backbone"
    return cfg.resolved_cache_dir() / f"ref-{slug}-{key[:24]}"


def _resolve(model_or_factory: ModelOrFactory) -> Any:
    if callable(model_or_factory) and not isinstance(model_or_factory, torch.nn.Module):
        return model_or_factory()
    return model_or_factory


def get_reference(
    base_model: ModelOrFactory,
    tokenizer: Any,
    benchmark: Any,
    cfg: EvalConfig,
    backbone_key: str,
    chat_template: bool,
    progress: bool = False,
) -> ReferenceCache:
    """Load the reference cache for this setup, building it first (under a lock) if it does not exist.

    `base_model` is the separately loaded frozen base (never the adapted model with its adapter
    disabled), or a zero-argument callable returning it. The key needs the base's weights
    fingerprint, so the callable is always called; on a hit no forward pass runs.
    """
    require_eval_config(cfg)
    base = _resolve(base_model)
    key, components = reference_key(base, tokenizer, benchmark, cfg, backbone_key, chat_template)
    path = cache_path(cfg, backbone_key, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if usable(path, key, "reference cache"):
        return _load(path, key, benchmark, cfg, hit=True, lock_wait_s=0.0, t0=t0)
    remove_dead_builds(path.parent)
    with exclusive_lock(path.parent / f"{path.name}.lock") as lock_wait_s:
        if is_complete(path, key):  # another process built it while we waited
            return _load(path, key, benchmark, cfg, hit=True, lock_wait_s=lock_wait_s, t0=time.perf_counter())
        with timed_phase(log, f"reference cache: the base model's responses and log-probs, built once into {path}"):
            _build(base, tokenizer, benchmark, cfg, chat_template, key, components, path, progress)
    return _load(path, key, benchmark, cfg, hit=False, lock_wait_s=lock_wait_s, t0=time.perf_counter())


def _choose_mode(vocab: int, n_tokens: int, cfg: EvalConfig, n_splits: int = len(SPLITS)) -> str:
    """`full` when one split's `n_tokens` x `vocab` log-probs fit its share (1 / `n_splits`) of the budget."""
    itemsize = torch.empty((), dtype=LOGPROB_TORCH_DTYPES[cfg.logprob_dtype]).element_size()
    return "full" if vocab * n_tokens * itemsize <= cfg.logprob_budget_mb * 2**20 / n_splits else "topk"


def output_vocab_size(model: Any) -> int:
    """Width of the model's next-token distribution (its output embedding rows)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def _build(base, tokenizer, benchmark, cfg, chat_template, key, components, path: Path, progress: bool) -> None:
    t_start = time.perf_counter()
    pad_id = pad_token_id(tokenizer)
    was_training = base.training
    base.eval()
    splits: dict[tuple[str, str], dict] = {}
    for name, dom in sorted(benchmark.retained.items()):
        for split in domain_splits(dom):
            items = retained_items(getattr(dom, split), cfg)
            texts = _split_prompts(tokenizer, dom.kind, items, chat_template)
            gen = generate(
                base, tokenizer, texts,
                max_new_tokens=cfg.max_new_tokens(dom.kind),
                do_sample=cfg.reference_sampling,
                temperature=cfg.reference_temperature,
                seed=cfg.reference_seed,
                batch_size=cfg.generation_batch_size,
                progress=progress,
                desc=f"reference {name}/{split}",
            )
            splits[(name, split)] = {
                "kind": dom.kind, "items": items, "prompts": texts,
                "prompt_ids": encode_prompts(tokenizer, texts),
                "response_ids": gen.token_ids, "response_texts": gen.texts,
            }
    n_tokens = sum(len(r) for s in splits.values() for r in s["response_ids"])
    vocab = output_vocab_size(base)
    names = sorted({sp for _, sp in splits}, key=(SPLITS + (FAR,)).index)
    modes = {split: _choose_mode(vocab, sum(len(r) for (_, sp), s in splits.items() if sp == split
                                            for r in s["response_ids"]), cfg, len(names)) for split in names}

    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    manifest_domains: dict[str, dict] = {}
    try:
        for number, ((name, split), s) in enumerate(sorted(splits.items())):
            cached = cache_logprobs(
                base, s["prompt_ids"], s["response_ids"], mode=modes[split], dtype=cfg.logprob_dtype, top_k=cfg.top_k,
                pad_id=pad_id, batch_size=cfg.scoring_batch_size, progress=progress,
                desc=f"base log-probs {name}/{split}",
            )
            ref = SplitReference(
                items=s["items"], prompts=s["prompts"], prompt_ids=s["prompt_ids"],
                response_ids=s["response_ids"], response_texts=s["response_texts"], logprobs=cached,
            )
            if split in EVALUATED and s["kind"] == "math":
                if cfg.reference_sampling:
                    greedy = generate(
                        base, tokenizer, s["prompts"], max_new_tokens=cfg.max_new_tokens_math,
                        batch_size=cfg.generation_batch_size, progress=progress, desc=f"base greedy {name}/{split}",
                    ).texts
                else:
                    greedy = list(s["response_texts"])
                ref.greedy_texts = greedy
                ref.greedy_answers = [extract_math_answer(t) for t in greedy]
            if split in EVALUATED and s["kind"] == "choice":
                scores = score_choices(base, tokenizer, s["items"], chat_template=chat_template,
                                       batch_size=cfg.scoring_batch_size, progress=progress)
                ref.choice_loglik, ref.choice, ref.choice_norm = scores.loglik, scores.choice, scores.choice_norm
            tensor_file = f"logprobs-{number:03d}.safetensors"
            save_tensors(tmp / tensor_file, cached.tensors())
            manifest_domains.setdefault(name, {"kind": s["kind"], "splits": {}})["splits"][split] = {
                "tensors": tensor_file, **ref.metadata(),
            }
        build_s = time.perf_counter() - t_start
        write_manifest(tmp, {
            "key": key,
            "format_version": CACHE_FORMAT_VERSION,
            "components": components,
            "modes": modes,
            "logprob_dtype": cfg.logprob_dtype,
            "n_tokens": n_tokens,
            "build_s": build_s,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "domains": manifest_domains,
            "files": file_checksums(tmp),  # verified on every load (experiments.disk_cache.check_entry)
        })
        if path.exists():  # a stale or partial folder under this name: replace it
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        base.train(was_training)


def _load(path: Path, key: str, benchmark: Any, cfg: EvalConfig, *, hit: bool, lock_wait_s: float, t0: float) -> ReferenceCache:
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest["key"] != key:
        raise RuntimeError(f"reference cache {path} holds key {manifest['key']}, expected {key}")
    domains: dict[str, DomainReference] = {}
    n_bytes = 0
    for name, dom in benchmark.retained.items():
        entry = manifest["domains"][name]
        refs = {}
        for split in domain_splits(dom):
            meta = entry["splits"][split]
            tensors = load_file(str(path / meta["tensors"]))  # its checksum was verified (`usable`)
            n_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
            refs[split] = SplitReference(
                items=retained_items(getattr(dom, split), cfg),
                prompts=meta["prompts"],
                prompt_ids=meta["prompt_ids"],
                response_ids=meta["response_ids"],
                response_texts=meta["response_texts"],
                logprobs=CachedLogprobs.from_tensors(manifest["modes"][split], manifest["logprob_dtype"], tensors),
                greedy_texts=meta["greedy_texts"],
                greedy_answers=meta["greedy_answers"],
                choice_loglik=meta["choice_loglik"],
                choice=meta["choice"],
                choice_norm=meta["choice_norm"],
            )
        domains[name] = DomainReference(name=name, kind=entry["kind"], **refs)
    stats = {
        "hit": hit,
        "build_s": manifest["build_s"],
        "load_s": time.perf_counter() - t0,
        "lock_wait_s": lock_wait_s,
        "n_tokens": manifest["n_tokens"],
        "bytes": n_bytes,
    }
    return ReferenceCache(key=key, path=path, modes=manifest["modes"], components=manifest["components"],
                          domains=domains, stats=stats)
