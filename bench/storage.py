"""Storage: atlas + adapter bytes vs a LoRA adapter of the same rank, at micro and the paper backbones' shapes.

    python -m bench.storage
    python -m bench.storage --settings 16:8,8:2,16:8:32 --backbones qwen3-8b

Per backbone (conf/backbone/*.yaml `shapes` and `target_modules`, no weights) and per atlas
setting K:R or K:R:P (num_centers : filter_rank cap [: filter_basis, the width of a shared filter basis];
conf/method/atlas.yaml gives the default), from
`atlas.footprint.footprint` with every cluster at the cap (the upper bound; filter_energy can
only keep fewer columns):

- same dtype: atlas and adapter values at the same width (footprint's `ratio_to_lora`);
- as stored: the atlas in the backbone's dtype, the trainable factors in float32 — what
  `ATLAS.export` and peft's `save_pretrained` write for a half-precision backbone, whose
  factors both methods keep in float32.

At micro the script also builds the real atlases (ATLAS.prepare on the shipped backbone and its
calibration data) and measures the exported files against peft's adapter_model.safetensors, so
the bound can be compared with the filter ranks filter_energy actually keeps.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch

from atlas.footprint import footprint
from bench.common import (
    Settings,
    add_atlas,
    add_lora,
    command_line,
    environment,
    load_preset,
    shared_copy,
    table,
    write_json,
)
from suite_schema import registry

SCRIPT = "storage"
PAPER = ["qwen3-8b", "qwen3-4b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-2-9b"]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FACTOR_BYTES = 4  # trainable factors stay float32 for half-precision backbones (atlas/layer.py, peft)
TARGET = ("qwen3-8b", 2.0)


def parse_settings(text: str) -> list[tuple[int, int, Optional[int]]]:
    """`K:R` or `K:R:P` items, comma-separated, as (K, R, P or None)."""
    out = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) not in (2, 3) or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise SystemExit(f"error: --settings item {part!r}: K:R or K:R:P with positive integers")
        out.append((int(fields[0]), int(fields[1]), int(fields[2]) if len(fields) == 3 else None))
    return out


def label(k: int, r: int, p: Optional[int]) -> str:
    return f"K={k} R={r}" + (f" P={p}" if p else "")


def estimate(backbone: str, rank: int, k: int, r: int, p: Optional[int] = None) -> dict:
    """Atlas and adapter sizes of `backbone` (its conf/backbone shapes, no weights) at rank `rank` and setting K:R[:P],
    every filter at its cap: parameter counts, bytes in the backbone's dtype and as stored, ratios to LoRA."""
    cfg = registry.group_values("backbone", backbone)
    est = footprint(cfg["shapes"], rank, k, r, list(cfg["target_modules"]), bytes_per_value=1, filter_basis=p)
    atlas_bytes = est["atlas_params"] * DTYPE_BYTES[cfg["dtype"]]
    adapter_bytes = est["lora_params"] * FACTOR_BYTES
    return {"backbone": backbone, "dtype": cfg["dtype"], "num_centers": k, "filter_rank": r, "filter_basis": p,
            "rank": rank,
            "layers": est["layers"], "lora_params": est["lora_params"], "atlas_params": est["atlas_params"],
            "ratio_same_dtype": est["ratio_to_lora"],
            "atlas_bytes": atlas_bytes, "adapter_bytes": adapter_bytes,
            "lora_bytes": adapter_bytes, "atlas_plus_adapter_bytes": atlas_bytes + adapter_bytes,
            "ratio_as_stored": (atlas_bytes + adapter_bytes) / adapter_bytes,
            "atlas_extra_flops_per_token": est["atlas_extra_flops_per_token"],
            "extra_flops_vs_projections": est["extra_flops_vs_projections"]}


def measure_micro(settings_list, rank: int, seed: int) -> list[dict]:
    """Real exported bytes at micro: ATLAS.export (atlas + adapter) vs LoRA.export (peft adapter)."""
    with tempfile.TemporaryDirectory(prefix="atlas-bench-storage-") as tmp:
        st = Settings(torch.device("cpu"), None, seed, None, Path(tmp) / "atlas")
        bb = load_preset("micro", st)
        lora, lora_method = add_lora(shared_copy(bb.model), bb, seed, rank=rank)
        lora_bytes = lora_method.export(lora, Path(tmp) / "lora")
        out = []
        for k, r, p in settings_list:
            model, method = add_atlas(shared_copy(bb.model), bb, st, rank=rank, num_centers=k, filter_rank=r,
                                      filter_basis=p)
            stored = method.export(model, Path(tmp) / f"atlas-{k}-{r}-{p}")
            costs = method.costs()
            sites = list(method.atlas.values())
            mean_rank = sum(s.centers.shape[1] * int(s.ranks.sum()) for s in sites) / \
                (k * sum(s.centers.shape[1] for s in sites))
            out.append({"backbone": "micro (measured)", "num_centers": k, "filter_rank": r, "filter_basis": p,
                        "rank": rank,
                        "atlas_bytes": costs["atlas_bytes"], "adapter_bytes": costs["adapter_bytes"],
                        "atlas_plus_adapter_bytes": stored, "lora_bytes": lora_bytes,
                        "ratio_as_stored": stored / lora_bytes, "mean_filter_rank": mean_rank})
        return out


def main(argv: Optional[Sequence[str]] = None) -> dict:
    defaults = registry.method_values("atlas")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbones", default=",".join(["micro", *PAPER]))
    first = ":".join(str(defaults[k]) for k in ("num_centers", "filter_rank", "filter_basis") if defaults[k] is not None)
    others = ["16:8", "16:4", "16:2", "8:8", "8:4", "8:2", "4:4", "4:2", "1:8", "16:8:16", "16:8:24", "16:8:32"]
    ap.add_argument("--settings", default=",".join(dict.fromkeys([first, *others])),
                    help="comma-separated num_centers:filter_rank[:filter_basis] (the first is conf/method/atlas.yaml's)")
    ap.add_argument("--rank", type=int, default=defaults["rank"])
    ap.add_argument("--no-measure", action="store_true", help="skip building real atlases at micro")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    settings_list = parse_settings(args.settings)
    backbones = [b for b in args.backbones.split(",") if b]
    rows = [estimate(b, args.rank, k, r, p) for b in backbones for k, r, p in settings_list]
    measured = [] if args.no_measure or "micro" not in backbones else measure_micro(settings_list, args.rank, args.seed)

    default = settings_list[0]
    key = lambda e: (e["num_centers"], e["filter_rank"], e["filter_basis"])  # noqa: E731
    meets = [label(*key(e)) for e in rows if e["backbone"] == TARGET[0] and e["ratio_same_dtype"] <= TARGET[1]]
    meets_stored = [label(*key(e)) for e in rows if e["backbone"] == TARGET[0] and e["ratio_as_stored"] <= TARGET[1]]
    at_default = next((e for e in rows if e["backbone"] == TARGET[0] and key(e) == default), None)
    payload = {"script": SCRIPT, "command": command_line(f"bench.{SCRIPT}"), "environment": environment(torch.device("cpu")),
               "rank": args.rank,
               "default_setting": {"num_centers": default[0], "filter_rank": default[1], "filter_basis": default[2]},
               "estimates": rows, "measured_micro": measured,
               "target": {"backbone": TARGET[0], "limit": TARGET[1],
                          "default_ratio_same_dtype": at_default and at_default["ratio_same_dtype"],
                          "default_ratio_as_stored": at_default and at_default["ratio_as_stored"],
                          "settings_meeting_same_dtype": meets, "settings_meeting_as_stored": meets_stored}}
    mb = lambda b: b / 2**20  # noqa: E731
    print(f"\natlas + adapter vs LoRA adapter, rank {args.rank}, every filter at its cap (upper bound)")
    print(table(["backbone", "K", "R", "P", "atlas MiB", "adapter MiB", "x LoRA (as stored)", "x LoRA (same dtype)"],
                [[e["backbone"], e["num_centers"], e["filter_rank"], e["filter_basis"] or "-", mb(e["atlas_bytes"]),
                  mb(e["adapter_bytes"]),
                  e["ratio_as_stored"], e["ratio_same_dtype"]] for e in rows]))
    if measured:
        print("\nmicro, exported files (filters at the ranks filter_energy keeps)")
        print(table(["K", "R", "P", "mean r_k", "atlas MiB", "adapter MiB", "LoRA MiB", "x LoRA"],
                    [[e["num_centers"], e["filter_rank"], e["filter_basis"] or "-", e["mean_filter_rank"], mb(e["atlas_bytes"]),
                      mb(e["adapter_bytes"]), mb(e["lora_bytes"]), e["ratio_as_stored"]] for e in measured]))
    print(f"\n{TARGET[0]} target x LoRA <= {TARGET[1]}: default {label(*default)} gives "
          f"{at_default['ratio_as_stored']:.2f} as stored, {at_default['ratio_same_dtype']:.2f} same dtype; "
          f"settings meeting it as stored: {meets_stored or 'none'}; same dtype: {meets or 'none'}\n"
          if at_default else "")
    write_json(args.out, SCRIPT, payload)
    return payload


if __name__ == "__main__":
    main()
