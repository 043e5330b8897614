"""ATLAS as a Method: build the atlas from retained calibration data, inject the conditioned residual, train A and B."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from atlas.atlas import (
    FILTER_MEMBERS,
    GATE_FITS,
    GATE_SIGNALS,
    SiteAtlas,
    build_site_atlas,
    load_atlas,
    random_site_atlas,
    save_atlas,
)
from atlas.diagnostics import conditioning_report
from atlas.layer import AtlasLinear, AtlasSite
from experiments.activations import Site, collect_inputs, discover_sites
from experiments.calibration import pair_example, reference_pairs, target_examples
from experiments.methods import (
    AdapterParams,
    Method,
    RunContext,
    SiteStatisticsParams,
    is_int,
    require,
    require_rank_fits,
)
from experiments.log import timed_phase
from experiments.progress import progress_bar
from experiments.tensor_files import DamagedFile, load_tensors, save_tensors

log = logging.getLogger("suite.atlas")

SOURCES = ("retained", "target", "random")
#: Which calibration tokens the atlas is fitted on: every token of prompt and response, or only the positions whose
#: next-token distribution the loss and the retained KL score (`experiments.activations.TOKEN_MASKS`).
FIT_TOKENS = {"all": "attention_mask", "scored": "scored"}
ATLAS_FILE = "atlas.safetensors"
ADAPTER_FILE = "adapter.safetensors"


@dataclass(kw_only=True)
class ATLASParams(AdapterParams, SiteStatisticsParams):
    """ATLAS's hyperparameters (docs/method.md): the residual's rank and alpha (s = alpha / r), the atlas
    (`num_centers` K per site from `max_tokens` calibration tokens, filters keeping `filter_energy` of the
    energy up to `filter_rank` directions, each in the full input space or, with `filter_basis` P, inside the site's
    shared top-P directions, fitted on the center's k-means cluster or on the tokens the layer assigns to it,
    `filter_members`), the gate (the statistic `gate_signal`, its calibration quantile
    `gate_quantile` q, `gate_temperature` T, and how its threshold and slope are set, `gate_fit`: quantile of
    the retained signal or a logistic fit of retained vs target), the calibration tokens' split over the retained
    domains (`balance_domains`: an equal share per domain instead of their share of the tokens), how much the
    atlas conditions (`conditioning`: 0 = plain LoRA, 1 = full gate and filter), the center
    assignment (`assign` hard | soft at `assign_temperature`), the ablation switches (`use_gate`,
    `use_filter`, `source` retained | target | random), which calibration tokens it is fitted on (`fit_tokens`: all,
    or the scored positions only) and the atlas seed (null = the run's)."""

    rank: int
    alpha: float
    num_centers: int
    filter_energy: float
    filter_rank: int
    filter_basis: Optional[int]
    filter_members: str
    gate_quantile: float
    gate_temperature: float
    gate_signal: str
    gate_fit: str
    balance_domains: bool
    conditioning: float
    assign: str
    assign_temperature: float
    use_gate: bool
    use_filter: bool
    source: str
    fit_tokens: str
    atlas_seed: Optional[int]

    #: What an export written before these fields existed was built with (`Method.read_params`).
    EXPORT_DEFAULTS = {"gate_fit": "quantile", "balance_domains": False, "filter_basis": None,
                       "filter_members": "kmeans", "fit_tokens": "all"}

    def __post_init__(self) -> None:
        super().__post_init__()
        require("rank", self.rank, is_int(self.rank) and self.rank > 0, "an integer > 0")
        require("alpha", self.alpha, self.alpha > 0, "> 0")
        require("num_centers", self.num_centers, is_int(self.num_centers) and self.num_centers >= 1, "an integer >= 1")
        require("max_tokens", self.max_tokens, self.max_tokens >= self.num_centers, "an integer >= num_centers")
        require("filter_energy", self.filter_energy, 0.0 < self.filter_energy <= 1.0, "in (0, 1]")
        require("filter_rank", self.filter_rank, is_int(self.filter_rank) and self.filter_rank >= 1, "an integer >= 1")
        require("filter_basis", self.filter_basis, self.filter_basis is None or
                (is_int(self.filter_basis) and self.filter_basis >= 1), "null or an integer >= 1")
        require("filter_members", self.filter_members, self.filter_members in FILTER_MEMBERS,
                f"one of {list(FILTER_MEMBERS)}")
        require("gate_quantile", self.gate_quantile, 0.0 < self.gate_quantile < 1.0, "in (0, 1)")
        require("gate_temperature", self.gate_temperature, self.gate_temperature > 0, "> 0")
        require("gate_signal", self.gate_signal, self.gate_signal in GATE_SIGNALS, f"one of {list(GATE_SIGNALS)}")
        require("gate_fit", self.gate_fit, self.gate_fit in GATE_FITS, f"one of {list(GATE_FITS)}")
        require("balance_domains", self.balance_domains, isinstance(self.balance_domains, bool), "true or false")
        require("conditioning", self.conditioning, 0.0 <= self.conditioning <= 1.0,
                "in [0, 1] (0 = plain LoRA, 1 = full conditioning)")
        require("assign", self.assign, self.assign in ("hard", "soft"), "one of ['hard', 'soft']")
        require("assign_temperature", self.assign_temperature, self.assign_temperature > 0, "> 0")
        require("use_gate", self.use_gate, isinstance(self.use_gate, bool), "true or false")
        require("use_filter", self.use_filter, isinstance(self.use_filter, bool), "true or false")
        require("source", self.source, self.source in SOURCES, f"one of {list(SOURCES)}")
        require("fit_tokens", self.fit_tokens, self.fit_tokens in FIT_TOKENS, f"one of {list(FIT_TOKENS)}")
        require("atlas_seed", self.atlas_seed, self.atlas_seed is None or is_int(self.atlas_seed), "null or an integer")


class ATLAS(Method):
    """Input-conditioned plasticity from a retained-domain activation atlas (docs/method.md).

    Knobs: `conditioning` (0 = LoRA ... 1 = full conditioning) and the post-hoc residual scale (`scale`);
    the gate's `gate_quantile` / `gate_temperature` / `gate_fit` and the atlas's size are design choices (docs/method.md).
    Ablations are switches: `num_centers=1` (global), `use_filter=false`, `use_gate=false`,
    `source=target` (atlas of target activations), `source=random` (random geometry).
    """

    run_files = (ATLAS_FILE,)

    Params = ATLASParams
    params: ATLASParams

    def __init__(self, params: ATLASParams) -> None:
        super().__init__(params)
        self.atlas: dict[str, SiteAtlas] = {}
        self.sites: list[Site] = []

    # -- atlas -----------------------------------------------------------------------------
    def calibration_groups(self, ctx: RunContext) -> dict[str, list[dict]]:
        """Encoded sequences the atlas is built from, by group: each retained domain's calibration prompts + base
        responses (domains in the cache's order, every pair: the atlas reads prompt tokens too), or one group of
        target training data (`source=target`); cut at the run's `max_length` as training examples are.
        Without `balance_domains` all retained pairs form one group."""
        if self.params.source == "target":
            return {"target": target_examples(ctx)}
        return self.retained_groups(ctx)

    def retained_groups(self, ctx: RunContext) -> dict[str, list[dict]]:
        """The retained calibration pairs as encoded sequences, one group per domain with `balance_domains`
        (in the cache's order), else one group."""
        groups: dict[str, list[dict]] = {}
        for pair in reference_pairs(ctx.reference(), ctx.max_length, drop_empty=False, sort_domains=False):
            groups.setdefault(pair.domain if self.params.balance_domains else "retained", []).append(pair_example(pair))
        return groups

    def contrast_groups(self, ctx: RunContext) -> dict[str, list[dict]]:
        """What a logistic gate learns to open on: the target training data, or for an atlas of the target
        (`source=target`) the retained calibration pairs, by domain as `balance_domains` says."""
        return {"target": target_examples(ctx)} if self.params.source != "target" else self.retained_groups(ctx)

    def collect(self, model: torch.nn.Module, ctx: RunContext, sites: list[Site], groups: dict[str, list[dict]],
                seed: int) -> dict[str, torch.Tensor]:
        """Site name -> (n, d) inputs on `groups` at the tokens `fit_tokens` names: `max_tokens` in all, split equally
        over the groups (the first groups take the remainder; a group with fewer tokens gives all it has), each a
        seeded subsample."""
        p = self.params
        share, extra = divmod(p.max_tokens, len(groups))
        parts = []
        for j, seqs in enumerate(groups.values()):
            parts.append(collect_inputs(model, sites, seqs, pad_id=ctx.tokenizer.pad_token_id,
                                        batch_size=p.calibration_batch_size, max_tokens=share + (j < extra),
                                        seed=seed + j, device=ctx.device, progress=ctx.progress,
                                        token_mask_key=FIT_TOKENS[p.fit_tokens]))
        return {s.name: torch.cat([part[s.name] for part in parts]) for s in sites}

    def build(self, model: torch.nn.Module, ctx: RunContext, sites: list[Site]) -> dict[str, SiteAtlas]:
        """Collect site inputs on the calibration groups (and, for a logistic gate, `max_tokens` on the contrast
        groups) and build every site's atlas."""
        p = self.params
        seed = ctx.seed if p.atlas_seed is None else p.atlas_seed
        inputs = self.collect(model, ctx, sites, self.calibration_groups(ctx), seed)
        targets = self.collect(model, ctx, sites, self.contrast_groups(ctx), seed + 101) \
            if p.gate_fit == "logistic" else {}
        dtype = next(model.parameters()).dtype
        atlas = {}

        for i, site in enumerate(progress_bar(sites, desc="build atlas", disable=not ctx.progress)):
            x = inputs[site.name].to(ctx.device)
            t = targets[site.name].to(ctx.device) if targets else None
            gate = dict(gate_quantile=p.gate_quantile, gate_signal=p.gate_signal, gate_fit=p.gate_fit, target=t)
            real = build_site_atlas(x, num_centers=p.num_centers, filter_energy=p.filter_energy,
                                    filter_rank=p.filter_rank, seed=seed * 1009 + i, filter_basis=p.filter_basis,
                                    filter_members=p.filter_members, dtype=dtype, **gate)
            atlas[site.name] = random_site_atlas(real, x, seed=seed * 1009 + i + 7919, **gate) \
                if p.source == "random" else real
        return atlas

    def atlas_meta(self) -> dict:
        return {"sites": {s.name: s.modules for s in self.sites}, "hparams": self.describe()}

    # -- hooks -----------------------------------------------------------------------------
    def check_shapes(self, model: torch.nn.Module, targets: list[str]) -> None:
        """The residual's rank fits every adapted layer (`require_rank_fits`)."""
        require_rank_fits(model, targets, self.params.rank)

    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.resolve_targets(model, ctx)
        for p in model.parameters():
            p.requires_grad_(False)
        cached = Path(ctx.run_dir) / ATLAS_FILE
        with self.timed("atlas_build_seconds"):
            loaded = self.load_run_atlas(cached)
            if loaded:  # a resumed run reuses the atlas it built, bit for bit
                self.atlas, meta = loaded
                self.sites = [Site(n, m, 0) for n, m in meta["sites"].items()]
                log.info("loaded %d site atlases from %s", len(self.atlas), cached)
            else:
                probe = torch.tensor([[ctx.tokenizer.eos_token_id or 0] * 4], device=ctx.device)
                self.sites = discover_sites(model, targets, probe)
                what = (f"building the atlas: {self.params.num_centers} centers at each of {len(self.sites)} sites "
                        f"from up to {self.params.max_tokens} calibration tokens")
                with timed_phase(log, what):
                    self.atlas = self.build(model, ctx, self.sites)
                save_atlas(self.atlas, cached, self.atlas_meta())
        self.inject(model)
        return model

    @staticmethod
    def load_run_atlas(path: Path) -> Optional[tuple[dict[str, SiteAtlas], dict]]:
        """The atlas an earlier attempt of the run saved at `path`; None when there is none or it is damaged (said in
        one warning line; the caller builds it again)."""
        if not path.exists():
            return None
        try:
            return load_atlas(path)
        except DamagedFile as exc:
            log.warning("%s; building it again", exc)
            return None

    def inject(self, model: torch.nn.Module) -> None:
        """Replace every adapted Linear by an AtlasLinear sharing its site's AtlasSite."""
        modules = dict(model.named_modules())
        p = self.params
        for site in self.sites:
            shared = AtlasSite(self.atlas[site.name], assign=p.assign, gate_temperature=p.gate_temperature,
                               assign_temperature=p.assign_temperature, use_gate=p.use_gate, use_filter=p.use_filter,
                               gate_signal=p.gate_signal, conditioning=p.conditioning)
            shared.to(next(model.parameters()).device)
            for name in site.modules:
                parent_name, leaf = name.rsplit(".", 1)
                parent = modules[parent_name]
                setattr(parent, leaf, AtlasLinear(getattr(parent, leaf), shared, p.rank, p.alpha))

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save the atlas, the adapter (A, B) and the config; return atlas + adapter bytes."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atlas_bytes = save_atlas(self.atlas, out_dir / ATLAS_FILE, self.atlas_meta())
        state = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        adapter_bytes = save_tensors(out_dir / ADAPTER_FILE, state)
        self.write_params(out_dir)
        self._costs.update(atlas_bytes=atlas_bytes, adapter_bytes=adapter_bytes)
        return atlas_bytes + adapter_bytes

    @classmethod
    def load_export(cls, model: torch.nn.Module, export_dir: Path) -> torch.nn.Module:
        """A freshly loaded base `model` with the exported atlas and residual injected (in place); returns it."""
        cls.from_export(model, export_dir)
        return model

    @classmethod
    def from_export(cls, model: torch.nn.Module, export_dir: Path) -> "ATLAS":
        """The trained ATLAS rebuilt on a freshly loaded base `model` from `export` output (in place)."""
        export_dir = Path(export_dir)
        method = cls(cls.read_params(export_dir))
        method.atlas, meta = load_atlas(export_dir / ATLAS_FILE)
        method.sites = [Site(n, m, 0) for n, m in meta["sites"].items()]
        for p in model.parameters():
            p.requires_grad_(False)
        method.inject(model)
        state, _ = load_tensors(export_dir / ADAPTER_FILE)
        method.load_state_dict(model, state)
        return method

    def diagnostics(self, model: torch.nn.Module, ctx: RunContext) -> dict:
        """Gate, filter and residual on held-out retained vs target tokens, per site (`atlas.diagnostics`)."""
        what = f"diagnostics: gate, filter and residual at {len(self.sites)} sites on held-out tokens"
        with self.timed("diagnostics_seconds"), timed_phase(log, what):
            return conditioning_report(model, self.sites, ctx, self.params.filter_rank, seed=ctx.seed,
                                       progress=ctx.progress)

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Multiply the residual scale s by alpha (0 = the base model, 1 = as trained)."""
        for m in model.modules():
            if isinstance(m, AtlasLinear):
                m.scale_factor = alpha

