"""Method names, their order in tables, and one fixed colour and marker per method for every figure.

Known methods have hand-picked styles (the ATLAS family in warm colours, baselines in cool and
neutral ones); any other name gets a style derived from a SHA-256 of the name, so an unknown
method looks the same in every figure, every run and on every machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

REFERENCE = "atlas"
BASE = "base"
BASELINES = ("lora", "olora", "replay", "ewc", "lwf", "corda", "inflora")
EXTENDED = ("milora", "pissa", "dora", "loranull", "fullft")  # beyond the paper (docs/baselines.md)
ABLATIONS = ("atlas_global", "atlas_nofilter", "atlas_nogate", "atlas_target", "atlas_random")
KNOWN_ORDER = (REFERENCE, *BASELINES, *EXTENDED, *ABLATIONS, BASE)

LABELS = {
    "atlas": "ATLAS",
    "lora": "LoRA",
    "olora": "O-LoRA",
    "replay": "Replay",
    "ewc": "EWC",
    "lwf": "LwF",
    "corda": "CorDA",
    "inflora": "InfLoRA",
    "milora": "MiLoRA",
    "pissa": "PiSSA",
    "dora": "DoRA",
    "loranull": "LoRA-Null",
    "fullft": "Full FT",
    "atlas_global": "ATLAS global",
    "atlas_nofilter": "ATLAS no filter",
    "atlas_nogate": "ATLAS no gate",
    "atlas_target": "ATLAS target atlas",
    "atlas_random": "ATLAS random atlas",
    "base": "Base model",
}


@dataclass(frozen=True)
class Style:
    color: str
    marker: str


STYLES = {
    "atlas": Style("#c62828", "o"),
    "lora": Style("#1f77b4", "s"),
    "olora": Style("#17becf", "D"),
    "replay": Style("#2ca02c", "^"),
    "ewc": Style("#9467bd", "v"),
    "lwf": Style("#8c564b", "P"),
    "corda": Style("#7f7f7f", "X"),
    "inflora": Style("#bcbd22", "h"),
    "milora": Style("#3949ab", "<"),
    "pissa": Style("#7b4173", ">"),
    "dora": Style("#e377c2", "d"),
    "loranull": Style("#00695c", "p"),
    "fullft": Style("#393b79", "8"),
    "atlas_global": Style("#ef6c00", "<"),
    "atlas_nofilter": Style("#ad1457", ">"),
    "atlas_nogate": Style("#f9a825", "p"),
    "atlas_target": Style("#6d4c41", "d"),
    "atlas_random": Style("#ff8a65", "8"),
    "base": Style("#000000", "*"),
}
# Styles for names not listed above, picked by a hash of the name (hues kept apart from the known ones).
EXTRA_COLORS = ("#393b79", "#637939", "#7b4173", "#e7969c", "#9c9ede", "#5254a3", "#b5cf6b", "#00695c")
EXTRA_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h", "<", ">", "p", "d")


def style(method: str) -> Style:
    """The colour and marker of `method`, the same in every figure."""
    if method in STYLES:
        return STYLES[method]
    h = int(hashlib.sha256(method.encode("utf-8")).hexdigest(), 16)
    return Style(EXTRA_COLORS[h % len(EXTRA_COLORS)], EXTRA_MARKERS[(h // len(EXTRA_COLORS)) % len(EXTRA_MARKERS)])


def label(method: str) -> str:
    """The display name of a method (its own name when unknown)."""
    return LABELS.get(method, method)


def is_atlas_family(method: str) -> bool:
    return method == REFERENCE or method.startswith(REFERENCE + "_")


def order_key(method: str) -> tuple:
    """Known methods in `KNOWN_ORDER`; unknown ATLAS variants after the known ablations; other unknown
    methods after the baselines; the base model last."""
    if method in KNOWN_ORDER and method != BASE:
        return (KNOWN_ORDER.index(method), "")
    if method == BASE:
        return (len(KNOWN_ORDER) + 2, "")
    if is_atlas_family(method):
        return (len(KNOWN_ORDER), method)
    return (len(BASELINES) + 0.5, method)


def ordered(methods) -> list[str]:
    return sorted(set(methods), key=order_key)


def main_methods(methods) -> list[str]:
    """ATLAS, the baselines and any other method outside the ATLAS family (the base model excluded)."""
    return [m for m in ordered(methods) if m != BASE and (m == REFERENCE or not is_atlas_family(m))]


def ablation_methods(methods) -> list[str]:
    """ATLAS and its variants (every method named atlas_*)."""
    return [m for m in ordered(methods) if is_atlas_family(m)]
