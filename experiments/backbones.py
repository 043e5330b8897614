"""Loading a backbone (model + tokenizer) through `from_pretrained`, for the micro and real backbones alike."""

from __future__ import annotations

import hashlib
import resource
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import HfApi, try_to_load_from_cache
from huggingface_hub import constants as hub_constants
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from experiments.progress import library_bars_on_terminal_only
from experiments.validation import ConfigError, not_allowed

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class BackboneError(ConfigError):
    """A backbone cannot be loaded as configured (`<key>=<value> is not allowed: ...`)."""


def resolve_path(path: str) -> str:
    """A local folder (relative paths against the repo root) if it exists, else the hub id unchanged."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        candidate = REPO_ROOT / p
        if candidate.exists():
            return str(candidate)
    if p.exists():
        return str(p.resolve())
    if path.startswith(("/", "./", "../", "~")) or path.startswith("assets/"):
        raise not_allowed("backbone.path", path, "an existing local folder or a hub id", BackboneError)
    return path


def backbone_key(cfg: Any) -> str:
    """Identity of a backbone's weights, for cache keys: the hub id + revision, or a hash of a local folder's files."""
    path = resolve_path(cfg.path)
    local = Path(path)
    if local.is_dir():
        h = hashlib.sha256()
        for f in sorted(local.iterdir()):
            if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".model", ".txt"):
                h.update(f.name.encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
        return f"{cfg.name}-local-{h.hexdigest()[:16]}"
    return f"{cfg.name}-{path.replace('/', '--')}-{cfg.revision or 'main'}"


def check_target_modules(model: torch.nn.Module, target_modules: list[str], key: str = "backbone.target_modules") -> None:
    """Raise `BackboneError` unless every name in `target_modules` is the suffix of some Linear in `model`."""
    linear_names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [t for t in target_modules if t not in linear_names]
    if missing:
        raise not_allowed(key, list(target_modules), f"names of the model's Linear modules ({missing} not found; "
                          f"allowed: {sorted(linear_names)})", BackboneError)


def load_tokenizer(cfg: Any):
    """The backbone's tokenizer, with a pad token and the backbone's chat-template options attached."""
    tok = AutoTokenizer.from_pretrained(
        resolve_path(cfg.path), revision=cfg.revision, trust_remote_code=cfg.trust_remote_code
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.chat_template_kwargs = dict(cfg.get("chat_template_kwargs") or {}) if hasattr(cfg, "get") else {}
    return tok


def load_model(cfg: Any, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The backbone's causal LM in its configured dtype, in eval mode, with its target modules checked."""
    if cfg.dtype not in DTYPES:
        raise not_allowed("backbone.dtype", cfg.dtype, f"one of {sorted(DTYPES)}", BackboneError)
    kwargs = {"dtype": DTYPES[cfg.dtype], "revision": cfg.revision, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    with library_bars_on_terminal_only():
        model = AutoModelForCausalLM.from_pretrained(resolve_path(cfg.path), **kwargs)
    model.to(device)
    model.eval()
    check_target_modules(model, list(cfg.target_modules))
    return model


def load_backbone(cfg: Any, device: str | torch.device = "cpu"):
    """(model, tokenizer) for a backbone config (see `experiments.config.BackboneConfig`)."""
    return load_model(cfg, device), load_tokenizer(cfg)


def model_summary(model: torch.nn.Module) -> dict:
    """Parameter counts of a model (total and trainable)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"params_total": total, "params_trainable": trainable}


#: Seconds the one network check of a hub backbone may take (instead of the hub client's retries).
HUB_CHECK_TIMEOUT_S = 10.0
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def require_available(bb: Any) -> None:
    """Raise `BackboneError` in one line when the backbone's weights can be neither read locally nor fetched: a local
    folder needs its config and weights; a hub id needs them in the local hub cache, or (unless HF_HUB_OFFLINE is
    set) a hub that answers within `HUB_CHECK_TIMEOUT_S`. Called before any job starts, so a sweep over a missing
    backbone stops once instead of failing every job after the hub client's retries."""
    path = resolve_path(bb.path)
    local = Path(path)
    if local.is_dir():
        missing = [f for f in ("config.json",) if not (local / f).is_file()]
        if missing or not any((local / f).is_file() for f in WEIGHT_FILES):
            lacks = "config.json" if missing else f"model weights ({', '.join(WEIGHT_FILES)})"
            raise not_allowed("backbone.path", bb.path, f"a folder holding config.json and model weights ({local} "
                              f"lacks {lacks})", BackboneError)
        return

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(path, name, revision=bb.revision), str)

    if cached("config.json") and any(cached(f) for f in WEIGHT_FILES):
        return
    how = (f"download it first (`huggingface-cli download {path}` where the hub is reachable, then copy the hub "
           "cache here) or set backbone.path to a local folder holding it")
    if hub_constants.HF_HUB_OFFLINE:  # read at call time: the hub client sets it from the environment
        raise not_allowed("backbone.path", path, f"a backbone in the local hub cache while HF_HUB_OFFLINE is set; {how}",
                          BackboneError)

    try:
        HfApi().model_info(path, revision=bb.revision, timeout=HUB_CHECK_TIMEOUT_S)
    except Exception as exc:  # no network, unknown repo, gated repo without a token: all end the same way
        raise not_allowed("backbone.path", path, f"a backbone in the local hub cache or on a hub that answers (it did "
                          f"not: {type(exc).__name__}); {how}", BackboneError) from None


def preflight_backbone(bb: Any) -> torch.nn.Module:
    """A weightless (meta-device) model built from the backbone's config, its target modules checked: what a method
    checks its hyperparameters against before any weight is loaded (`Method.check_model`)."""
    config = AutoConfig.from_pretrained(resolve_path(bb.path), revision=bb.revision, trust_remote_code=bb.trust_remote_code)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=bb.trust_remote_code)
    check_target_modules(skeleton, list(bb.target_modules))
    return skeleton


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else the process's peak resident set size, in bytes."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
