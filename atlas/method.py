"""ATLAS as a Method: build the atlas from retained calibration data, inject the conditioned residual, train A and B."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from atlas.atlas import SiteAtlas, build_site_atlas, load_atlas, random_site_atlas, save_atlas
from atlas.layer import AtlasLinear, AtlasSite
from experiments.activations import Site, collect_inputs, discover_sites, target_linears
from experiments.backbones import check_target_modules
from experiments.methods import Method, RunContext, require
from experiments.prompts import apply_template, code_instruction_prompt, code_instruction_response, encode_pair

SOURCES = ("retained", "target", "random")
ATLAS_FILE = "atlas.safetensors"
ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "atlas_config.json"


class ATLAS(Method):
    """Input-conditioned plasticity from a retained-domain activation atlas (METHOD.md).

    Knobs: residual scale (post-hoc `scale`), `gate_temperature`, `gate_quantile`, training steps.
    Ablations are switches: `num_centers=1` (global), `use_filter=false`, `use_gate=false`,
    `source=target` (atlas of target activations), `source=random` (random geometry).
    """

    def __init__(
        self,
        name: str = "atlas",
        rank: int = 8,
        alpha: float = 16.0,
        target_modules: Optional[Sequence[str]] = None,
        num_centers: int = 16,
        max_tokens: int = 4096,
        filter_energy: float = 0.9,
        filter_rank: int = 8,
        gate_quantile: float = 0.9,
        gate_temperature: float = 1.0,
        assign: str = "hard",
        assign_temperature: float = 1.0,
        use_gate: bool = True,
        use_filter: bool = True,
        source: str = "retained",
        atlas_seed: Optional[int] = None,
        calibration_batch_size: int = 16,
    ) -> None:
        require("rank", rank, isinstance(rank, int) and rank > 0, "an integer > 0")
        require("alpha", alpha, alpha > 0, "> 0")
        require("num_centers", num_centers, isinstance(num_centers, int) and num_centers >= 1, "an integer >= 1")
        require("max_tokens", max_tokens, isinstance(max_tokens, int) and max_tokens >= num_centers,
                "an integer >= num_centers")
        require("filter_energy", filter_energy, 0.0 < filter_energy <= 1.0, "in (0, 1]")
        require("filter_rank", filter_rank, isinstance(filter_rank, int) and filter_rank >= 1, "an integer >= 1")
        require("gate_quantile", gate_quantile, 0.0 < gate_quantile < 1.0, "in (0, 1)")
        require("gate_temperature", gate_temperature, gate_temperature > 0, "> 0")
        require("assign", assign, assign in ("hard", "soft"), "one of ['hard', 'soft']")
        require("assign_temperature", assign_temperature, assign_temperature > 0, "> 0")
        require("source", source, source in SOURCES, f"one of {list(SOURCES)}")
        require("calibration_batch_size", calibration_batch_size, calibration_batch_size > 0, "> 0")
        hparams = dict(rank=rank, alpha=alpha, target_modules=target_modules, num_centers=num_centers,
                       max_tokens=max_tokens, filter_energy=filter_energy, filter_rank=filter_rank,
                       gate_quantile=gate_quantile, gate_temperature=gate_temperature, assign=assign,
                       assign_temperature=assign_temperature, use_gate=use_gate, use_filter=use_filter,
                       source=source, atlas_seed=atlas_seed, calibration_batch_size=calibration_batch_size)
        super().__init__(name, **hparams)
        self.__dict__.update(hparams)
        self.target_modules = list(target_modules) if target_modules else None
        self.atlas: dict[str, SiteAtlas] = {}
        self.sites: list[Site] = []
        self._costs: dict = {}

    # -- atlas -----------------------------------------------------------------------------
    def calibration_sequences(self, ctx: RunContext) -> list[dict]:
        """Encoded sequences the atlas is built from: retained calibration prompts + base responses, or target data."""
        if self.source == "target":
            chat = ctx.cfg.backbone.chat_template
            return [encode_pair(ctx.tokenizer, apply_template(ctx.tokenizer, code_instruction_prompt(i), chat),
                                code_instruction_response(i), ctx.cfg.backbone.max_length)
                    for i in ctx.benchmark.target_train]
        reference = ctx.reference()
        seqs = []
        for domain in reference.domains.values():
            split = domain.split("calibration")
            for p, r in zip(split.prompt_ids, split.response_ids):
                seqs.append({"input_ids": list(p) + list(r), "labels": [-100] * len(p) + list(r)})
        return seqs

    def build(self, model: torch.nn.Module, ctx: RunContext, sites: list[Site]) -> dict[str, SiteAtlas]:
        """Collect site inputs on the calibration sequences and build every site's atlas."""
        seed = ctx.seed if self.atlas_seed is None else self.atlas_seed
        seqs = self.calibration_sequences(ctx)
        inputs = collect_inputs(model, sites, seqs, pad_id=ctx.tokenizer.pad_token_id,
                                batch_size=self.calibration_batch_size, max_tokens=self.max_tokens, seed=seed,
                                device=ctx.device, progress=bool(ctx.cfg.train.get("progress", True)))
        dtype = next(model.parameters()).dtype
        atlas = {}
        from tqdm.auto import tqdm

        for i, site in enumerate(tqdm(sites, desc="build atlas", disable=not ctx.cfg.train.get("progress", True))):
            x = inputs[site.name].to(ctx.device)
            real = build_site_atlas(x, self.num_centers, self.filter_energy, self.filter_rank,
                                    self.gate_quantile, seed * 1009 + i, dtype)
            atlas[site.name] = random_site_atlas(real, x, self.gate_quantile, seed * 1009 + i + 7919) \
                if self.source == "random" else real
        return atlas

    def atlas_meta(self) -> dict:
        return {"sites": {s.name: s.modules for s in self.sites},
                "hparams": {k: v for k, v in self.hparams.items()}}

    # -- hooks -----------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        targets = self.target_modules or list(ctx.cfg.backbone.target_modules)
        check_target_modules(model, targets, key="method.target_modules")
        for p in model.parameters():
            p.requires_grad_(False)
        cached = Path(ctx.run_dir) / ATLAS_FILE
        t0 = time.perf_counter()
        if cached.exists():  # a resumed run reuses the atlas it built, bit for bit
            self.atlas, meta = load_atlas(cached)
            self.sites = [Site(n, m, 0) for n, m in meta["sites"].items()]
            print(f"[atlas] loaded {len(self.atlas)} site atlases from {cached}", flush=True)
        else:
            probe = torch.tensor([[ctx.tokenizer.eos_token_id or 0] * 4], device=ctx.device)
            self.sites = discover_sites(model, targets, probe)
            self.atlas = self.build(model, ctx, self.sites)
            save_atlas(self.atlas, cached, self.atlas_meta())
        self._costs["atlas_build_seconds"] = time.perf_counter() - t0
        self.inject(model)
        return model

    def inject(self, model: torch.nn.Module) -> None:
        """Replace every adapted Linear by an AtlasLinear sharing its site's AtlasSite."""
        modules = dict(model.named_modules())
        for site in self.sites:
            shared = AtlasSite(self.atlas[site.name], self.assign, self.gate_temperature, self.assign_temperature,
                               self.use_gate, self.use_filter).to(next(model.parameters()).device)
            for name in site.modules:
                parent_name, leaf = name.rsplit(".", 1)
                parent = modules[parent_name]
                setattr(parent, leaf, AtlasLinear(getattr(parent, leaf), shared, self.rank, self.alpha))

    def export(self, model: torch.nn.Module, out_dir: Path) -> int:
        """Save the atlas, the adapter (A, B) and the config; return atlas + adapter bytes."""
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atlas_bytes = save_atlas(self.atlas, out_dir / ATLAS_FILE, self.atlas_meta())
        state = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        save_file(state, str(out_dir / ADAPTER_FILE))
        (out_dir / CONFIG_FILE).write_text(json.dumps(self.describe(), indent=2))
        adapter_bytes = os.path.getsize(out_dir / ADAPTER_FILE)
        self._costs.update(atlas_bytes=atlas_bytes, adapter_bytes=adapter_bytes)
        return atlas_bytes + adapter_bytes

    @classmethod
    def from_export(cls, model: torch.nn.Module, export_dir: Path) -> "ATLAS":
        """Rebuild a trained ATLAS on a freshly loaded base `model` from `export` output (in place)."""
        from safetensors.torch import load_file

        export_dir = Path(export_dir)
        described = json.loads((export_dir / CONFIG_FILE).read_text())
        method = cls(**described)
        method.atlas, meta = load_atlas(export_dir / ATLAS_FILE)
        method.sites = [Site(n, m, 0) for n, m in meta["sites"].items()]
        for p in model.parameters():
            p.requires_grad_(False)
        method.inject(model)
        state = load_file(str(export_dir / ADAPTER_FILE))
        method.load_state_dict(model, state)
        return method

    def scale(self, model: torch.nn.Module, alpha: float) -> None:
        """Multiply the residual scale s by alpha (0 = the base model, 1 = as trained)."""
        for m in model.modules():
            if isinstance(m, AtlasLinear):
                m.scale_factor = alpha

    def costs(self) -> dict:
        return dict(self._costs)
