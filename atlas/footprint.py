"""Storage and per-token compute of ATLAS against LoRA at a backbone's shapes, from its config alone (no weights).

    python -m atlas.footprint --backbone qwen3-8b            # defaults from conf/method/atlas.yaml
    python -m atlas.footprint --backbone qwen3-8b --num-centers 8 --filter-rank 2
    python -m atlas.footprint --backbone qwen3-8b --filter-basis 32     # filters inside a shared top-32 basis

Counts (per decoder layer, times the number of layers):
- LoRA adapter: r * (d_in + d_out) per adapted module.
- Atlas, per site (one distinct input, width d): K * d centers + K radii + d * sum_k r_k filter
  columns + 1 gate quantile; the bound uses r_k = filter_rank for every cluster. With a shared filter
  basis of width P (`filter_basis`) the filter columns are d * P for the basis + P * sum_k r_k.
- Extra FLOPs per token over LoRA (a multiply-add = 2 FLOPs), as `atlas.layer` computes them:
  distances 2 K d per site, filter coordinates U_k^T x for every k 2 K d R per site (with a basis
  2 d P + 2 P K R), and per module the correction sum_k w_k (A U_k)(U_k^T x): 2 K R r.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Modules that read the same tensor share a site (the grouping `experiments.activations.discover_sites` finds).
SITE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def module_shapes(shapes: dict) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each projection of one decoder layer of a Llama/Qwen/Mistral/Gemma-style model."""
    h, i = shapes["hidden_size"], shapes["intermediate_size"]
    nh, nkv = shapes["num_attention_heads"], shapes["num_key_value_heads"]
    hd = shapes.get("head_dim") or h // nh
    return {"q_proj": (h, nh * hd), "k_proj": (h, nkv * hd), "v_proj": (h, nkv * hd), "o_proj": (nh * hd, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def footprint(
    shapes: dict,
    rank: int,
    num_centers: int,
    filter_rank: int,
    target_modules: Sequence[str] = ALL_MODULES,
    bytes_per_value: int = 2,
    mean_filter_rank: Optional[float] = None,
    filter_basis: Optional[int] = None,
) -> dict:
    """Parameter counts, bytes and extra FLOPs/token of atlas + adapter vs a LoRA adapter of the same rank."""
    mods = module_shapes(shapes)
    layers = shapes["num_hidden_layers"]
    targets = [m for m in ALL_MODULES if m in set(target_modules)]
    r_bar = filter_rank if mean_filter_rank is None else mean_filter_rank
    k = num_centers
    lora = sum(rank * (mods[m][0] + mods[m][1]) for m in targets)
    atlas = flops_sites = flops_mods = 0.0
    for group in SITE_GROUPS:
        members = [m for m in group if m in targets]
        if not members:
            continue
        d = mods[members[0]][0]
        if filter_basis is None:
            atlas += k * d + k + d * k * r_bar + 1
            flops_sites += 2 * k * d + 2 * k * d * filter_rank
        else:
            p = min(filter_basis, d)
            atlas += k * d + k + d * p + p * k * r_bar + 1
            flops_sites += 2 * k * d + 2 * d * p + 2 * p * k * filter_rank
        flops_mods += len(members) * 2 * k * filter_rank * rank
    lora_flops = sum(2 * rank * (mods[m][0] + mods[m][1]) for m in targets)
    base_flops = sum(2 * mods[m][0] * mods[m][1] for m in ALL_MODULES)
    out = {
        "layers": layers,
        "lora_params": lora * layers,
        "atlas_params": atlas * layers,
        "lora_bytes": lora * layers * bytes_per_value,
        "atlas_bytes": atlas * layers * bytes_per_value,
        "atlas_plus_adapter_bytes": (atlas + lora) * layers * bytes_per_value,
        "ratio_to_lora": (atlas + lora) / lora,
        "lora_flops_per_token": lora_flops * layers,
        "atlas_extra_flops_per_token": (flops_sites + flops_mods) * layers,
        "projection_flops_per_token": base_flops * layers,
    }
    out["extra_flops_vs_projections"] = out["atlas_extra_flops_per_token"] / out["projection_flops_per_token"]
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    defaults = OmegaConf.load(REPO / "conf" / "method" / "atlas.yaml")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="qwen3-8b", help="a conf/backbone name with `shapes`")
    ap.add_argument("--rank", type=int, default=defaults.rank)
    ap.add_argument("--num-centers", type=int, default=defaults.num_centers)
    ap.add_argument("--filter-rank", type=int, default=defaults.filter_rank)
    ap.add_argument("--mean-filter-rank", type=float, default=None, help="measured mean r_k (default: the cap)")
    ap.add_argument("--filter-basis", type=int, default=defaults.filter_basis,
                    help="width P of a shared filter basis (default: conf/method/atlas.yaml's; none = full-space filters)")
    ap.add_argument("--bytes", type=int, default=2, help="bytes per stored value (bf16 = 2)")
    args = ap.parse_args(argv)
    cfg = OmegaConf.load(REPO / "conf" / "backbone" / f"{args.backbone}.yaml")
    if "shapes" not in cfg:
        raise SystemExit(f"error: backbone {args.backbone!r} has no `shapes` in conf/backbone/{args.backbone}.yaml")
    result = footprint(OmegaConf.to_container(cfg.shapes), args.rank, args.num_centers, args.filter_rank,
                       list(cfg.target_modules), args.bytes, args.mean_filter_rank, args.filter_basis)
    print(json.dumps({"backbone": args.backbone, "rank": args.rank, "num_centers": args.num_centers,
                      "filter_rank": args.filter_rank, "filter_basis": args.filter_basis, **result}, indent=2))


if __name__ == "__main__":
    main()
