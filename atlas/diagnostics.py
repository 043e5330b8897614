"""Does the conditioning condition? Per site, on held-out retained and target tokens: the gate, the share of
input energy the filter passes, the residual's size, and how well each signal separates the two (AUROC).

Inputs are the adapted modules' inputs (the site tensors) on the evaluation split of the run's benchmark
(the dev split in a dev run): retained = each domain's evaluation prompts followed by the base model's own
responses (the reference cache), target = the code problems' prompts followed by their reference solutions.
Neither was seen while the atlas was built (it reads the calibration split) or while training.

Per site (the modules reading one tensor share its atlas):
- `gate_*`: mean g(x) = sigmoid((log delta(x) - log q) / T), delta(x) = min_k ||x - c_k||^2 / sigma_k^2;
- `filter_pass_*`: mean over tokens of ||Pi(x) x||^2 / ||x||^2, the share of the input's energy the residual
  reads (Pi removes the assigned cluster's retained directions);
- `residual_*`: mean over the site's modules and the tokens of ||s g B A Pi x|| / ||W x|| (0 before training);
- `auroc_gate`, `auroc_delta`, `auroc_filter`, `auroc_residual`: the probability that a random target token
  scores higher than a random retained one (0.5 = no separation, 1 = perfect), for the gate (whatever its
  `gate_signal`), log delta(x), the filter's pass share and the residual's relative norm;
- `rank_mean`, `at_cap_share`: the filter ranks of the site's clusters and the share of clusters whose rank
  is the cap (`filter_rank`): the energy target was not reached there;
- `plain_nearest_differs`: the share of retained tokens whose nearest center by plain distance (k-means' rule)
  is not the layer's k* (normalised distance): with `filter_members: kmeans` the filter applied to such a token
  was fitted on another center's cluster.
`mean` averages every figure over sites; `layer0` is the first site (the first block's attention input);
`by_domain` repeats the mean for each retained domain alone against the target (the pooled retained tokens
follow the domains' token shares: on micro, two thirds are math).
`by_domain_scored` repeats it at the scored positions only: on each side, the positions whose next-token
distribution the retained KL (and, on the target, the loss) scores, i.e. the last prompt token and every response
token but the last. Prompt tokens are most of a sequence (on micro's dev commonsense items 91%, math 53%), so
`by_domain` mostly describes the prompts; `by_domain_scored` describes the positions the retained KL is measured at.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from sklearn.metrics import roc_auc_score

from atlas.kmeans import pairwise_sq_dists
from atlas.layer import AtlasLinear, AtlasSite
from experiments.activations import Site, collect_inputs, collect_inputs_by_mask
from experiments.calibration import held_out_sequences
from experiments.progress import progress_bar

#: Tokens per side (retained, target) per site, a seeded subsample.
MAX_TOKENS = 4096


def auroc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """Area under the ROC curve of scores `positive` (target) against `negative` (retained), ties counted
    half: the Mann-Whitney U statistic over n_pos * n_neg (scikit-learn's roc_auc_score)."""
    pos, neg = positive.detach().double().cpu(), negative.detach().double().cpu()
    if not len(pos) or not len(neg):
        raise ValueError("AUROC needs scores on both sides")
    labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
    return float(roc_auc_score(labels.numpy(), torch.cat([pos, neg]).numpy()))


@torch.no_grad()
def site_signals(site: AtlasSite, modules: Sequence[AtlasLinear], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per token of `x` (n, d): log delta, gate, filter pass share and the residual's relative norm."""
    site.clear()
    gate, weights, z, kstar = site.condition(x)
    if kstar is None:  # conditioning 0 computes no assignment; the filter's pass share still reads k*
        kstar = site.nearest(x)
    xf = x.float()
    sq = pairwise_sq_dists(xf, site.centers.float())  # exact, from the differences: one pass for both uses
    delta = (sq * site.inv_sigma2).min(1).values  # site.distances(x)
    energy = xf.square().sum(1).clamp_min(1e-30)
    if site.use_filter:
        coords = site.filter_coords(xf).view(len(x), site.centers.shape[0], -1)  # (n, K, R): U_k^T x
        kept = coords[torch.arange(len(x), device=x.device), kstar]  # (n, R): the assigned cluster's
        passed = (energy - kept.square().sum(1)).clamp_min(0.0) / energy
    else:
        passed = torch.ones_like(energy)
    rel = torch.zeros_like(energy)
    for m in modules:
        base = m.base(x)
        rel += (m(x) - base).float().norm(dim=1) / base.float().norm(dim=1).clamp_min(1e-30)
    site.clear()
    plain = sq.argmin(1)  # k-means' rule: the nearest center by plain distance
    return {"log_delta": delta.clamp_min(1e-30).log(), "gate": gate.squeeze(1) if gate is not None else torch.ones_like(energy),
            "filter_pass": passed, "residual": rel / max(len(modules), 1), "plain_differs": (plain != kstar).float()}


def site_report(site: AtlasSite, modules: Sequence[AtlasLinear], retained: torch.Tensor, target: torch.Tensor,
                filter_rank: int) -> dict[str, float]:
    """The figures of one site (see the module docstring) from its inputs on retained and target tokens."""
    return site_figures(site, site_signals(site, modules, retained), site_signals(site, modules, target), filter_rank,
                        len(retained), len(target))


def site_figures(site: AtlasSite, r: dict[str, torch.Tensor], t: dict[str, torch.Tensor], filter_rank: int,
                 n_retained: int, n_target: int) -> dict[str, float]:
    """`site_report`'s figures from the `site_signals` of the retained (`r`) and target (`t`) tokens."""
    ranks = site.ranks.float()
    out = {
        "gate_retained": float(r["gate"].mean()), "gate_target": float(t["gate"].mean()),
        "filter_pass_retained": float(r["filter_pass"].mean()), "filter_pass_target": float(t["filter_pass"].mean()),
        "residual_retained": float(r["residual"].mean()), "residual_target": float(t["residual"].mean()),
        "auroc_gate": auroc(t["gate"], r["gate"]) if site.use_gate and site.conditioning else 0.5,
        "auroc_delta": auroc(t["log_delta"], r["log_delta"]),
        "auroc_filter": auroc(t["filter_pass"], r["filter_pass"]),
        "rank_mean": float(ranks.mean()), "at_cap_share": float((site.ranks >= filter_rank).float().mean()),
        "plain_nearest_differs": float(r["plain_differs"].mean()),
        "n_retained": int(n_retained), "n_target": int(n_target),
    }
    if float(t["residual"].abs().sum() + r["residual"].abs().sum()) > 0:
        out["auroc_residual"] = auroc(t["residual"], r["residual"])
    return out


def conditioning_report(model: torch.nn.Module, sites: Sequence[Site], ctx: Any, filter_rank: int,
                        max_tokens: Optional[int] = MAX_TOKENS, seed: int = 0, progress: bool = False) -> dict:
    """Every site's figures, their mean over sites, the first site's (`layer0`), and per retained domain
    (`by_domain`: that domain's tokens against the target's, each figure averaged over sites; `by_domain_scored`:
    the same at the scored positions of both sides).

    One forward pass per sequence set (the pooled retained sequences, the target's, each domain's) collects every
    token selection read from it, and each site's target signals are computed once per selection and shared by the
    reports that compare against them. `progress`: a bar per forward pass (`diagnostics <set>`) and one over the
    site figures."""
    by_domain_seqs, target_seqs = held_out_sequences(ctx)
    kw = dict(pad_id=ctx.tokenizer.pad_token_id, batch_size=16, max_tokens=max_tokens, seed=seed,
              device=ctx.device, progress=progress)
    both = ("attention_mask", "scored")
    retained = collect_inputs(model, sites, [s for seqs in by_domain_seqs.values() for s in seqs],
                              desc="diagnostics retained", **kw)
    target = collect_inputs_by_mask(model, sites, target_seqs, both, desc="diagnostics target", **kw)
    domains = {name: collect_inputs_by_mask(model, sites, seqs, both, desc=f"diagnostics {name}", **kw)
               for name, seqs in by_domain_seqs.items()}
    named = dict(model.named_modules())
    bar = progress_bar(total=len(sites) * (1 + 2 * len(domains)), desc="diagnostics sites", unit="site",
                       disable=not progress)
    signals: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def target_signals(key: str, s: Site, modules: list) -> dict[str, torch.Tensor]:
        if (key, s.name) not in signals:
            signals[key, s.name] = site_signals(modules[0].site, modules, target[key][s.name].to(ctx.device))
        return signals[key, s.name]

    def report(inputs: dict[str, torch.Tensor], key: str) -> dict[str, dict]:
        out = {}
        for s in sites:
            modules = [named[n] for n in s.modules]
            x = inputs[s.name].to(ctx.device)
            out[s.name] = site_figures(modules[0].site, site_signals(modules[0].site, modules, x),
                                       target_signals(key, s, modules), filter_rank, len(x),
                                       len(target[key][s.name]))
            bar.update(1)
        return out

    with bar:
        per_site = report(retained, "attention_mask")
        by_domain = {name: _mean(report(inputs["attention_mask"], "attention_mask"))
                     for name, inputs in domains.items()}
        by_domain_scored = {name: _mean(report(inputs["scored"], "scored")) for name, inputs in domains.items()}
    return {"sites": per_site, "mean": _mean(per_site), "layer0": per_site[sites[0].name], "by_domain": by_domain,
            "by_domain_scored": by_domain_scored, "split": getattr(ctx.benchmark, "split", None)}


def _mean(per_site: dict[str, dict]) -> dict[str, float]:
    keys = sorted({k for v in per_site.values() for k in v if not k.startswith("n_")})
    return {k: sum(v[k] for v in per_site.values() if k in v) / sum(1 for v in per_site.values() if k in v)
            for k in keys}
