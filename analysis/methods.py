"""Method names, their order in tables, and one fixed colour and marker per method for every figure.

Known methods are the method registry, `conf/method/*.yaml`: each file's `display` block gives its
label, group (reference, baseline, extended, ablation, base), order within the group, colour and
marker (read as YAML files; analysis imports nothing from the runtime). Any other name gets a style
derived from a SHA-256 of the name, so an unknown method looks the same in every figure, every run
and on every machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

METHOD_CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
GROUPS = ("reference", "baseline", "extended", "ablation", "base")


@dataclass(frozen=True)
class Style:
    color: str
    marker: str


def _registry() -> dict[str, dict]:
    out = {}
    for path in sorted(METHOD_CONF.glob("*.yaml")):
        shown = (yaml.safe_load(path.read_text()) or {}).get("display")
        if shown:
            out[path.stem] = shown
    return dict(sorted(out.items(), key=lambda kv: (GROUPS.index(kv[1]["group"]), kv[1]["order"], kv[0])))


_DISPLAY = _registry()


def _group(name: str) -> tuple[str, ...]:
    return tuple(m for m, d in _DISPLAY.items() if d["group"] == name)


def display(name: str) -> dict:
    """The `display` block of conf/method/<name>.yaml (label, group, order, color, marker)."""
    return dict(_DISPLAY[name])


def group_members(*groups: str) -> list[str]:
    """The registry's methods of `groups`, in table order."""
    return [m for m, d in _DISPLAY.items() if d["group"] in groups]


REFERENCE = _group("reference")[0]
BASE = _group("base")[0]
BASELINES = _group("baseline")
EXTENDED = _group("extended")  # beyond the paper (docs/baselines.md)
ABLATIONS = _group("ablation")
KNOWN_ORDER = tuple(_DISPLAY)
LABELS = {m: d["label"] for m, d in _DISPLAY.items()}
STYLES = {m: Style(d["color"], d["marker"]) for m, d in _DISPLAY.items()}
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
    """ATLAS, its ablations (atlas_*) and its option variants (atlas[...], `analysis.variants`)."""
    return method == REFERENCE or method.startswith((REFERENCE + "_", REFERENCE + "["))


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
    """ATLAS and its variants (every method named atlas_* or atlas[...])."""
    return [m for m in ordered(methods) if is_atlas_family(m)]
