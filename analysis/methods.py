"""Method names, their order in tables, and one fixed colour, marker and line style per method for every figure.

Known methods are the method registry (`suite_schema.registry`: `conf/method/*.yaml`); each method file's `display`
block gives its label, group (reference, baseline, extended, ablation, base), order within the group, colour and
marker. The line style follows the registry order (`LINESTYLES` in turn, skipping one that another known method with
the same marker has), so no two known methods share a marker and a line style and a figure reads in greyscale. A
registered method without a display block, and any name the registry does not know, is labelled by its name and gets
a style derived from a SHA-256 of the name (a line style no known method with its marker has), so it looks the same in
every figure, every run and on every machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from suite_schema import registry


@dataclass(frozen=True)
class Style:
    """How a method is drawn in every figure: a matplotlib colour, marker and line style (a `LINESTYLES` name)."""

    color: str
    marker: str
    linestyle: str

    @property
    def dashes(self):
        """The matplotlib line style of `linestyle`."""
        return LINESTYLES[self.linestyle]


_SPECS = registry.methods()
_DISPLAY = {name: spec.display for name, spec in _SPECS.items() if spec.display is not None}


def display(name: str) -> dict:
    """The `display` block of conf/method/<name>.yaml (label, group, order, color, marker)."""
    return dict(_DISPLAY[name])


REFERENCE = registry.members("reference")[0]
BASE = registry.members("base")[0]
BASELINES = tuple(registry.members("baseline"))
EXTENDED = tuple(registry.members("extended"))  # beyond the paper (docs/baselines.md)
ABLATIONS = tuple(registry.members("ablation"))
KNOWN_ORDER = tuple(_SPECS)
LABELS = {m: d["label"] for m, d in _DISPLAY.items()}
#: Frontier line styles by name (dotted is left out: it marks one training run's post-hoc scales in the figures).
LINESTYLES = {
    "solid": "-",
    "dashed": (0, (3.0, 1.5)),
    "dashdot": (0, (4.0, 1.2, 1.0, 1.2)),
    "longdash": (0, (5.0, 2.0)),
    "dashdotdot": (0, (4.0, 1.2, 1.0, 1.2, 1.0, 1.2)),
}


def _free_linestyle(marker: str, start: int, taken: set) -> str:
    """The first `LINESTYLES` name from position `start` on (cyclically) that no (marker, name) in `taken` has."""
    names = list(LINESTYLES)
    for k in range(len(names)):
        name = names[(start + k) % len(names)]
        if (marker, name) not in taken:
            return name
    return names[start % len(names)]  # every style of this marker taken: the marker's colour still tells it apart


def _known_styles() -> dict[str, Style]:
    """Line styles in turn within each family a figure shows together (ATLAS and the methods outside its family;
    ATLAS and its ablations), so the methods of one figure share as few line styles as the families' sizes allow."""
    out: dict[str, Style] = {}
    taken: set = set()
    shown = [m for m in KNOWN_ORDER if m in _DISPLAY]
    family = {m: [x for x in shown if is_atlas_family(x) == is_atlas_family(m) or x == REFERENCE] for m in shown}
    for m in shown:
        d = _DISPLAY[m]
        ls = _free_linestyle(d["marker"], family[m].index(m), taken)
        taken.add((d["marker"], ls))
        out[m] = Style(d["color"], d["marker"], ls)
    return out


# Styles for names not listed above, picked by a hash of the name (hues kept apart from the known ones).
EXTRA_COLORS = ("#393b79", "#637939", "#7b4173", "#e7969c", "#9c9ede", "#5254a3", "#b5cf6b", "#00695c")
EXTRA_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h", "<", ">", "p", "d")


def style(method: str) -> Style:
    """The colour, marker and line style of `method`, the same in every figure."""
    if method in STYLES:
        return STYLES[method]
    h = int(hashlib.sha256(method.encode("utf-8")).hexdigest(), 16)
    marker = EXTRA_MARKERS[(h // len(EXTRA_COLORS)) % len(EXTRA_MARKERS)]
    taken = {(s.marker, s.linestyle) for s in STYLES.values()}
    start = (h // (len(EXTRA_COLORS) * len(EXTRA_MARKERS))) % len(LINESTYLES)
    return Style(EXTRA_COLORS[h % len(EXTRA_COLORS)], marker, _free_linestyle(marker, start, taken))


def label(method: str) -> str:
    """The display name of a method (its own name when unknown)."""
    return LABELS.get(method, method)


def data_of(method: str) -> str:
    """What `method` reads besides the target data (`display.data` of its method file; `registry.DATA_ACCESS`). A
    record named with an earlier definition (`method[key=value,...]`, `analysis.schema.defined_method`) reads what the
    registered method of the same class with those values reads (an `lwf` record distilled on retained prompts: what
    `lwf_retained` reads), else what its method reads today; "" for a method the registry does not know."""
    base, _, rest = method.partition("[")
    if base not in _SPECS:
        return ""
    if rest:
        named = dict(part.split("=", 1) for part in rest.rstrip("]").split(","))
        for name, spec in _SPECS.items():
            if spec.target == _SPECS[base].target and name in _DISPLAY and all(
                    str(spec.values.get(k)).lower() == v.lower() or _same_number(spec.values.get(k), v)
                    for k, v in named.items()):
                return _DISPLAY[name]["data"]
    return _DISPLAY[base]["data"] if base in _DISPLAY else ""


def group_of(method: str) -> str:
    """The `display.group` of `method`'s registered method (reference, baseline, retained, extended, ablation, base;
    a record named with an earlier definition, `method[...]`, takes its method's); "" for one the registry lacks."""
    base = method.partition("[")[0]
    return _DISPLAY[base].get("group", "") if base in _DISPLAY else ""


def _same_number(value, text: str) -> bool:
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return False


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
    if method.partition("[")[0] in KNOWN_ORDER:  # under an earlier definition: right after its method
        return (KNOWN_ORDER.index(method.partition("[")[0]), method)
    return (len(BASELINES) + 0.5, method)


def ordered(methods) -> list[str]:
    return sorted(set(methods), key=order_key)


def main_methods(methods) -> list[str]:
    """ATLAS, the baselines and any other method outside the ATLAS family (the base model excluded)."""
    return [m for m in ordered(methods) if m != BASE and (m == REFERENCE or not is_atlas_family(m))]


def holm_family(method: str) -> str:
    """The Holm family of a comparison of ATLAS against `method`: "ablation" for ATLAS's own variants, "main" for
    every other method. The two are corrected apart, so a verdict on the baselines does not depend on how many
    ablation runs sit in the same folder."""
    return "ablation" if is_atlas_family(method) else "main"


def ablation_methods(methods) -> list[str]:
    """ATLAS and its variants (every method named atlas_* or atlas[...])."""
    return [m for m in ordered(methods) if is_atlas_family(m)]


STYLES = _known_styles()  # after `is_atlas_family`, which it reads
