"""Retained-output KL: forward KL(base || adapted), teacher-forced on the base's own responses.

For a retained prompt x and the base's cached response y, at every response token t

    KL_t = sum_v p_base(v | x, y_<t) * (log p_base(v | x, y_<t) - log p_adapted(v | x, y_<t))

(`torch.nn.functional.kl_div(input, target)` computes KL(target || input): the adapted
log-probs are the *input*, the base log-probs the *target*). Reported: `kl_token_mean` (mean of
KL_t over all response tokens of a split), `kl_seq_mean` (mean over prompts of sum_t KL_t),
`n_tokens`, `n`.

Base log-probabilities come from the reference cache in one of two forms (`CachedLogprobs`):

- `full`: the whole next-token distribution, stored in `float16` or `float32`. Both models'
  distributions go through the same storage rounding and are renormalised in float32 before the
  KL (`quantize_logprobs`), so a model compared with itself gives exactly 0 and the rounding is
  applied symmetrically.
- `topk`: the base's k most likely tokens (log-probs in float32 and indices) plus the log of the
  remaining mass. KL is then taken between the (k + 1)-outcome distributions
  [p_1..p_k, 1 - sum p] and [q_1..q_k, 1 - sum q] (same k indices, the base's); merging outcomes
  can only lower KL (log-sum inequality), so this is a lower bound of the exact value.
  `model_kl` measures the gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from experiments.evaluation.scoring import iter_response_logprobs

LOGPROB_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32}
#: Values (rows x vocabulary) per chunk of the full-mode KL: 4M float32 values, 16 MB per temporary.
KL_CHUNK_ELEMENTS = 1 << 22


def quantize_logprobs(logprobs: torch.Tensor, dtype: str) -> torch.Tensor:
    """Log-probs rounded to the storage dtype, then renormalised in float32 (a proper distribution)."""
    return torch.log_softmax(logprobs.to(LOGPROB_TORCH_DTYPES[dtype]).float(), dim=-1)


def tail_logmass(logprobs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """log(sum of probability outside `indices`) per row; -inf when `indices` cover the vocabulary."""
    rest = logprobs.float().scatter(-1, indices.long(), float("-inf"))
    return torch.logsumexp(rest, dim=-1)


def per_token_kl_full(base_logprobs: torch.Tensor, adapted_logprobs: torch.Tensor) -> torch.Tensor:
    """[T] KL(base || adapted) per row of two [T, V] log-prob tensors (base first)."""
    base = base_logprobs.float()
    terms = F.kl_div(adapted_logprobs.float(), base, reduction="none", log_target=True)
    # Outcomes the base gives probability 0 contribute 0 (kl_div would give 0 * -inf = nan).
    terms = torch.where(torch.isneginf(base), torch.zeros_like(terms), terms)
    return terms.sum(-1)


def per_token_kl_topk(
    base_topk_logprobs: torch.Tensor,
    topk_indices: torch.Tensor,
    base_tail_logmass: torch.Tensor,
    adapted_logprobs: torch.Tensor,
) -> torch.Tensor:
    """[T] KL between the (k+1)-outcome coarsenings of base and adapted (the base's top-k + one tail bucket)."""
    adapted = adapted_logprobs.float()
    idx = topk_indices.long()
    head_base = base_topk_logprobs.float()
    head_adapted = adapted.gather(-1, idx)
    tail_adapted = tail_logmass(adapted, idx)
    base = torch.cat([head_base, base_tail_logmass.float().unsqueeze(-1)], dim=-1)
    adapted_coarse = torch.cat([head_adapted, tail_adapted.unsqueeze(-1)], dim=-1)
    return per_token_kl_full(base, adapted_coarse)


def summarize_kl(per_response: Sequence[torch.Tensor]) -> dict:
    """`kl_token_mean`, `kl_seq_mean`, `n_tokens`, `n` from per-response per-token KL tensors, and `per_item`:
    each response's summed KL (`kl_sum`, nats) and token count (`n_tokens`), in item order, so a statistic over
    items (a bootstrap) can recompute the means."""
    n = len(per_response)
    sums = [float(t.double().sum()) for t in per_response]
    lengths = [int(t.numel()) for t in per_response]
    n_tokens = sum(lengths)
    return {
        "kl_token_mean": (sum(sums) / n_tokens) if n_tokens else float("nan"),
        "kl_seq_mean": (sum(sums) / n) if n else float("nan"),
        "n_tokens": n_tokens,
        "n": n,
        "per_item": {"kl_sum": sums, "n_tokens": lengths},
    }


@dataclass
class CachedLogprobs:
    """The base's log-probabilities at every response token of one split, rows concatenated in item order.

    Response i owns rows `offsets[i]:offsets[i+1]`. `mode == "full"`: `full` [T, V] in `dtype`.
    `mode == "topk"`: `topk_logprobs` [T, k] float32, `topk_indices` [T, k] int32, `tail_logmass` [T]
    float32.
    """

    mode: str
    dtype: str
    offsets: torch.Tensor
    full: Optional[torch.Tensor] = None
    topk_logprobs: Optional[torch.Tensor] = None
    topk_indices: Optional[torch.Tensor] = None
    tail_logmass: Optional[torch.Tensor] = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The named tensors to store (safetensors)."""
        names = ("offsets", "full") if self.mode == "full" else ("offsets", "topk_logprobs", "topk_indices", "tail_logmass")
        return {name: getattr(self, name).contiguous() for name in names}

    @classmethod
    def from_tensors(cls, mode: str, dtype: str, tensors: dict[str, torch.Tensor]) -> "CachedLogprobs":
        return cls(mode=mode, dtype=dtype, **tensors)

    def rows(self, indices: Sequence[int]) -> torch.Tensor:
        """Row numbers of the responses `indices`, concatenated in that order."""
        parts = [torch.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indices]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def per_token_kl(self, rows: torch.Tensor, adapted_logprobs: torch.Tensor) -> torch.Tensor:
        """[len(rows)] KL(base || adapted) at the given cached rows, `adapted_logprobs` [len(rows), V]."""
        if self.mode == "full":
            # In row chunks of about KL_CHUNK_ELEMENTS values: every step below makes a float32 temporary of
            # the chunk's size, and one of all rows x vocabulary costs more to allocate than to compute.
            step = max(1, KL_CHUNK_ELEMENTS // max(1, adapted_logprobs.shape[-1]))
            out = []
            for lo in range(0, len(rows), step):
                # Host-to-device moves do not wait for the device's queue (non_blocking; the host rows are
                # staged at once), so a training step's KL term (LwF) does not stall on them.
                rows_here = self.full[rows[lo:lo + step]].to(adapted_logprobs.device, non_blocking=True)
                base = torch.log_softmax(rows_here.float(), dim=-1)
                out.append(per_token_kl_full(base, quantize_logprobs(adapted_logprobs[lo:lo + step], self.dtype)))
            return torch.cat(out) if out else adapted_logprobs.new_zeros(0, dtype=torch.float32)
        dev = adapted_logprobs.device
        return per_token_kl_topk(
            self.topk_logprobs[rows].to(dev, non_blocking=True), self.topk_indices[rows].to(dev, non_blocking=True),
            self.tail_logmass[rows].to(dev, non_blocking=True), adapted_logprobs,
        )


def cache_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    mode: str,
    dtype: str,
    top_k: int,
    pad_id: int,
    batch_size: int,
    progress: bool = False,
    desc: str = "base log-probs",
) -> CachedLogprobs:
    """Run the (base) model teacher-forced over the responses and keep what `mode` stores."""
    if mode not in ("full", "topk"):
        raise ValueError(f"mode {mode!r}; allowed: full, topk")
    lengths = torch.tensor([len(r) for r in response_ids], dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    total = int(offsets[-1])
    store: Optional[CachedLogprobs] = None
    for batch in iter_response_logprobs(
        model, prompt_ids, response_ids, pad_id=pad_id, batch_size=batch_size, progress=progress, desc=desc
    ):
        vocab = batch.logprobs.shape[-1]
        if store is None:
            k = min(top_k, vocab)
            store = CachedLogprobs(mode=mode, dtype=dtype, offsets=offsets)
            if mode == "full":
                store.full = torch.empty((total, vocab), dtype=LOGPROB_TORCH_DTYPES[dtype])
            else:
                store.topk_logprobs = torch.empty((total, k), dtype=torch.float32)
                store.topk_indices = torch.empty((total, k), dtype=torch.int32)
                store.tail_logmass = torch.empty((total,), dtype=torch.float32)
        rows = store.rows(batch.indices)
        if mode == "full":
            store.full[rows] = batch.logprobs.to(LOGPROB_TORCH_DTYPES[dtype]).cpu()
        else:
            values, idx = batch.logprobs.topk(store.topk_logprobs.shape[1], dim=-1)
            store.topk_logprobs[rows] = values.cpu()
            store.topk_indices[rows] = idx.to(torch.int32).cpu()
            store.tail_logmass[rows] = tail_logmass(batch.logprobs, idx).cpu()
    if store is None:  # no responses at all
        store = CachedLogprobs(mode=mode, dtype=dtype, offsets=offsets)
        if mode == "full":
            store.full = torch.empty((0, 0), dtype=LOGPROB_TORCH_DTYPES[dtype])
        else:
            store.topk_logprobs = torch.empty((0, 0), dtype=torch.float32)
            store.topk_indices = torch.empty((0, 0), dtype=torch.int32)
            store.tail_logmass = torch.empty((0,), dtype=torch.float32)
    return store


def retained_kl(
    adapted_model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    cached: CachedLogprobs,
    *,
    pad_id: int,
    batch_size: int,
    progress: bool = False,
    desc: str = "retained KL",
) -> dict:
    """KL(base || adapted) summary on one split, against the base log-probs in `cached`."""
    per_response: list[Optional[torch.Tensor]] = [None] * len(prompt_ids)
    for batch in iter_response_logprobs(
        adapted_model, prompt_ids, response_ids, pad_id=pad_id, batch_size=batch_size, progress=progress, desc=desc
    ):
        kl = cached.per_token_kl(cached.rows(batch.indices), batch.logprobs)
        for i, part in zip(batch.indices, batch.split(kl)):
            per_response[i] = part.cpu()
    return {**summarize_kl(per_response), "mode": cached.mode}  # type: ignore[arg-type]


def model_kl(
    base_model: Any,
    adapted_model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    batch_size: int,
    top_k: Optional[int] = None,
) -> dict:
    """Exact KL(base || adapted) with both models live (float32), and with `top_k` its top-k+tail bound and the gap.

    Returns `{"exact": summary}` plus, with `top_k`, `"topk": summary`, `"gap_token_mean"` and
    `"gap_seq_mean"` (exact minus bound, >= 0 up to rounding).
    """
    exact: list[Optional[torch.Tensor]] = [None] * len(prompt_ids)
    bound: list[Optional[torch.Tensor]] = [None] * len(prompt_ids)
    kw = dict(pad_id=pad_id, batch_size=batch_size)
    for b_base, b_adapted in zip(
        iter_response_logprobs(base_model, prompt_ids, response_ids, **kw),
        iter_response_logprobs(adapted_model, prompt_ids, response_ids, **kw),
    ):
        assert b_base.indices == b_adapted.indices
        full = per_token_kl_full(b_base.logprobs, b_adapted.logprobs.to(b_base.logprobs.device))
        for i, part in zip(b_base.indices, b_base.split(full)):
            exact[i] = part.cpu()
        if top_k is not None:
            values, idx = b_base.logprobs.topk(min(top_k, b_base.logprobs.shape[-1]), dim=-1)
            coarse = per_token_kl_topk(values, idx, tail_logmass(b_base.logprobs, idx), b_adapted.logprobs)
            for i, part in zip(b_base.indices, b_base.split(coarse)):
                bound[i] = part.cpu()
    out = {"exact": summarize_kl(exact)}  # type: ignore[arg-type]
    if top_k is not None:
        out["topk"] = summarize_kl(bound)  # type: ignore[arg-type]
        out["gap_token_mean"] = out["exact"]["kl_token_mean"] - out["topk"]["kl_token_mean"]
        out["gap_seq_mean"] = out["exact"]["kl_seq_mean"] - out["topk"]["kl_seq_mean"]
    return out
