"""Inputs of the adapted linear layers on calibration data: sites, collection, second moments.

A *site* is one distinct tensor that adapted modules read: q/k/v projections read the attention
input, gate/up read the MLP input, o_proj and down_proj read their own. Sites are found by a probe
forward pass (modules that receive the very same tensor object share a site), so the grouping
holds for any architecture. ATLAS (atlas building) and the subspace baselines (O-LoRA, InfLoRA,
LoRA-Null, EWC) all read retained inputs through this module.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from experiments.progress import progress_bar
from experiments.prompts import collate
from experiments.tensor_files import DamagedFile, load_tensors, save_tensors

log = logging.getLogger("suite.train")


@dataclass
class Site:
    """One distinct input tensor: the modules that read it and its width."""

    name: str
    modules: list[str]
    dim: int


def target_linears(model: torch.nn.Module, target_modules: Sequence[str]) -> dict[str, torch.nn.Linear]:
    """Full name -> Linear for every Linear whose last name component is in `target_modules`."""
    wanted = set(target_modules)
    return {
        name: m for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in wanted
    }


def _site_name(modules: list[str]) -> str:
    parent = modules[0].rsplit(".", 1)[0]
    leaves = "+".join(m.rsplit(".", 1)[-1] for m in modules)
    return f"{parent}:{leaves}"


def discover_sites(model: torch.nn.Module, target_modules: Sequence[str], probe_ids: torch.Tensor) -> list[Site]:
    """Group the target Linears by the tensor they read in one probe forward pass (order of first use)."""
    linears = target_linears(model, target_modules)
    seen: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}  # keep inputs alive so ids cannot be reused within the pass
    order: list[int] = []

    def hook_for(name: str):
        def hook(module, args):
            x = args[0]
            key = id(x)
            if key not in seen:
                seen[key] = []
                tensors[key] = x
                order.append(key)
            seen[key].append(name)
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in linears.items()]
    try:
        with torch.no_grad():
            model(input_ids=probe_ids)
    finally:
        for h in handles:
            h.remove()
    sites = []
    for key in order:
        modules = seen[key]
        sites.append(Site(_site_name(modules), modules, linears[modules[0]].in_features))
    missing = set(linears) - {m for s in sites for m in s.modules}
    if missing:
        raise RuntimeError(f"target modules never ran in a forward pass: {sorted(missing)[:5]}")
    return sites


def token_selection(lengths_mask: torch.Tensor, max_tokens: Optional[int], seed: int) -> torch.Tensor:
    """Indices (sorted) into the flattened non-padding tokens, at most `max_tokens`, drawn with `seed`.

    Every site sees the same tokens, so one selection serves them all.
    """
    n = int(lengths_mask.sum())
    if max_tokens is None or max_tokens >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:max_tokens].sort().values


def collect_inputs(
    model: torch.nn.Module,
    sites: Sequence[Site],
    sequences: Sequence[dict],
    *,
    pad_id: int,
    batch_size: int = 16,
    max_tokens: Optional[int] = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: Optional[torch.dtype] = None,
    progress: bool = True,
    token_mask_key: str = "attention_mask",
    desc: str = "collect inputs",
) -> dict[str, torch.Tensor]:
    """Site name -> (n_tokens, dim) inputs over the non-padding tokens of `sequences`, subsampled with `seed`.

    `sequences` are encoded pairs (`input_ids`, `labels`) as `experiments.prompts.encode_pair` makes;
    with `token_mask_key="labels"` only response tokens are kept; with `"scored"` only the positions whose
    next-token distribution the loss and the retained KL score (each one before a response token: the last prompt
    token and every response token but the last). `progress`: a progress bar over the batches, labelled `desc`.
    """
    return collect_inputs_by_mask(model, sites, sequences, (token_mask_key,), pad_id=pad_id, batch_size=batch_size,
                                  max_tokens=max_tokens, seed=seed, device=device, dtype=dtype,
                                  progress=progress, desc=desc)[token_mask_key]


def collect_inputs_by_mask(
    model: torch.nn.Module,
    sites: Sequence[Site],
    sequences: Sequence[dict],
    token_mask_keys: Sequence[str],
    *,
    pad_id: int,
    batch_size: int = 16,
    max_tokens: Optional[int] = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: Optional[torch.dtype] = None,
    progress: bool = True,
    desc: str = "collect inputs",
) -> dict[str, dict[str, torch.Tensor]]:
    """Token mask key -> `collect_inputs(..., token_mask_key=key)` for each of `token_mask_keys`, from one forward
    pass over `sequences` instead of one per key: each key's tokens are selected and subsampled exactly as its own
    call would select them (the same batches, the same `seed`), so the result is the same tensors."""
    keys = list(dict.fromkeys(token_mask_keys))
    if not keys:
        raise ValueError("token_mask_keys: at least one of " + str(list(TOKEN_MASKS)))
    batches = [collate(sequences[i:i + batch_size], pad_id) for i in range(0, len(sequences), batch_size)]
    masks = {key: [_token_mask(b, key) for b in batches] for key in keys}
    chosen = {key: token_selection(torch.cat([m.flatten() for m in masks[key]]).bool(), max_tokens, seed)
              for key in keys}
    modules = dict(model.named_modules())
    store: dict[str, dict[str, list[torch.Tensor]]] = {key: {s.name: [] for s in sites} for key in keys}
    state: dict[str, tuple] = {}  # key -> (mask, take) of the current batch

    def hook_for(site: Site):
        def hook(module, args):
            x = args[0].detach()
            for key, (mask, take) in state.items():
                rows = x[mask]  # (n_valid, dim) in row-major token order
                store[key][site.name].append(rows[take].to(dtype or x.dtype).cpu())
        return hook

    handles = [modules[s.modules[0]].register_forward_pre_hook(hook_for(s)) for s in sites]
    offsets = dict.fromkeys(keys, 0)
    try:
        with torch.no_grad():
            for i, batch in enumerate(progress_bar(batches, desc=desc, disable=not progress)):
                for key in keys:
                    mask = masks[key][i]
                    n_valid = int(mask.sum())
                    lo = torch.searchsorted(chosen[key], offsets[key])
                    hi = torch.searchsorted(chosen[key], offsets[key] + n_valid)
                    state[key] = (mask.bool().to(device), (chosen[key][lo:hi] - offsets[key]).to(device))
                    offsets[key] += n_valid
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    finally:
        for h in handles:
            h.remove()
    return {key: {name: torch.cat(parts) for name, parts in store[key].items()} for key in keys}


TOKEN_MASKS = ("attention_mask", "labels", "scored")


def _token_mask(batch: dict, key: str) -> torch.Tensor:
    if key not in TOKEN_MASKS:
        raise ValueError(f"token_mask_key {key!r}: one of {list(TOKEN_MASKS)}")
    if key == "attention_mask":
        return batch["attention_mask"]
    labelled = (batch["labels"] != -100).long()
    if key == "labels":
        return labelled
    return torch.cat([labelled[:, 1:], torch.zeros_like(labelled[:, :1])], dim=1)  # the position before each label


def second_moment_basis(x: torch.Tensor, energy: float, max_rank: Optional[int] = None,
                        total: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(dim, r) top eigenvectors of the uncentered second moment x^T x / n, fewest reaching `energy` of `total`
    (default: x's own energy; when x is the projection of some data onto a subspace, the data's whole energy).

    Computed from the SVD of `x` (no dim x dim matrix is formed when n < dim).
    """
    if x.shape[0] == 0:
        return x.new_zeros(x.shape[1], 0)
    _, s, vh = torch.linalg.svd(x.float(), full_matrices=False)
    power = s.square()
    total = power.sum() if total is None else total
    if total <= 0:
        return x.new_zeros(x.shape[1], 0)
    frac = torch.cumsum(power, 0) / total
    r = int(torch.searchsorted(frac, torch.tensor(energy, dtype=frac.dtype)).item()) + 1
    r = min(r, len(s), max_rank or len(s))
    return vh[:r].T.contiguous()


def load_or_build_site_tensors(
    path: Path, build: Callable[[], tuple[dict[str, torch.Tensor], dict[str, list[str]]]]
) -> tuple[dict[str, torch.Tensor], dict[str, list[str]], bool]:
    """Per-site tensors saved at `path` by an earlier call of this run (a resumed run reuses them bit for
    bit), else built and saved; a damaged file (`experiments.tensor_files`) is said in one warning line and built
    again. `build` returns (tensors keyed `<site>/<what>`, site -> module names).

    Returns (tensors, sites, loaded). One tensor per site, however many modules read it.
    """

    path = Path(path)
    if path.exists():
        try:
            tensors, metadata = load_tensors(path)
            return tensors, json.loads(metadata["sites"]), True
        except DamagedFile as exc:
            log.warning("%s; building it again", exc)
    tensors, sites = build()
    save_tensors(path, tensors, {"sites": json.dumps(sites)})
    return tensors, sites, False
