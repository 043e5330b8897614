"""The method registry: a method exists when `conf/method/<name>.yaml`, composed with the files its `defaults` list
names (as Hydra composes it), has a `_target_` (the `Method` subclass that runs it).

Besides its hyperparameters a method file may hold a `display` block (label, group, order, colour, marker, the data
it reads): how
analysis shows the method, never part of the run id, and read from the method's own file only (a method that
inherits another's values does not inherit how it looks). The groups sort the tables: `reference` (ATLAS),
`baseline` (the paper's seven, as their authors define them), `retained` (retained-data variants: a baseline
given the retained calibration data ATLAS and replay see), `extended` (beyond the paper), `ablation` (ATLAS's variants), `base` (no training).
Nothing here imports a method's code: analysis reads the registry without torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("reference", "baseline", "retained", "extended", "ablation", "base")
#: The key of a method config that holds how analysis shows it.
DISPLAY_KEY = "display"
DISPLAY_FIELDS = ("label", "group", "order", "color", "marker", "data")
#: What a method reads besides the target data (`display.data`), from least to most: nothing, only the target data,
#: the base's activations on retained calibration prompts, the prompts themselves (with the base's own responses or
#: log-probs), their gold answers.
DATA_ACCESS = ("none", "target only", "retained activations", "retained prompts", "retained answers")
#: Keys of a method file that are not hyperparameters of its `Method`.
NOT_HYPERPARAMETERS = ("_target_", DISPLAY_KEY)


class RegistryError(ValueError):
    """A config option that does not exist or a malformed method file; the message names it and what is allowed."""


def group_options(group: str, conf: Path = CONF) -> list[str]:
    """The option names of config group `group` (its `conf/<group>/*.yaml` files), sorted."""
    return sorted(p.stem for p in (Path(conf) / group).glob("*.yaml"))


def _load(path: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}


def group_values(group: str, name: str, conf: Path = CONF) -> dict:
    """The values of `conf/<group>/<name>.yaml` merged over those of the same-group files its `defaults` list names,
    as Hydra composes a group option (`_self_` last); interpolations are kept. `RegistryError` naming the allowed
    options when the file does not exist."""
    path = Path(conf) / group / f"{name}.yaml"
    if not path.is_file():
        raise RegistryError(f"{group}={name!r} is not allowed: one of {group_options(group, conf)}")
    raw = _load(path)
    merged = OmegaConf.create({})
    for parent in raw.pop("defaults", []):
        if isinstance(parent, str) and parent != "_self_":
            merged = OmegaConf.merge(merged, group_values(group, parent, conf))
    return OmegaConf.to_container(OmegaConf.merge(merged, raw), resolve=False)


@dataclass(frozen=True)
class MethodSpec:
    """One registered method: its option name, its `Method` class path, its hyperparameter values (`name` included;
    neither `_target_` nor `display`), and its own `display` block (None when its file has none)."""

    option: str
    target: str
    values: dict
    display: Optional[dict]

    @property
    def group(self) -> Optional[str]:
        """The display group, None for a method its file does not place in one."""
        return None if self.display is None else self.display["group"]


def _display(path: Path) -> Optional[dict]:
    shown = _load(path).get(DISPLAY_KEY)
    if shown is None:
        return None
    missing = [k for k in DISPLAY_FIELDS if k not in (shown or {})]
    if missing or shown["group"] not in GROUPS or shown["data"] not in DATA_ACCESS:
        raise RegistryError(f"{path}: display needs {list(DISPLAY_FIELDS)} with group one of {list(GROUPS)} and data "
                            f"one of {list(DATA_ACCESS)}; got {shown}")
    return dict(shown)


def _sort_key(spec: MethodSpec) -> tuple:
    group = GROUPS.index(spec.group) if spec.group else GROUPS.index("base") - 0.5
    return (group, spec.display["order"] if spec.display else 0, spec.option)


@functools.lru_cache(maxsize=None)
def _methods(conf: Path) -> tuple[MethodSpec, ...]:
    specs = []
    for option in group_options("method", conf):
        values = group_values("method", option, conf)
        target = values.pop("_target_", None)
        if target is None:
            continue  # a file other method files start from, not a method of its own
        values.pop(DISPLAY_KEY, None)
        specs.append(MethodSpec(option, target, values, _display(Path(conf) / "method" / f"{option}.yaml")))
    return tuple(sorted(specs, key=_sort_key))


def methods(conf: Path = CONF) -> dict[str, MethodSpec]:
    """Every registered method by option name, in table order (group, then `display.order`)."""
    return {spec.option: spec for spec in _methods(Path(conf).resolve())}


def method_names(conf: Path = CONF) -> list[str]:
    """Every registered method, in table order."""
    return list(methods(conf))


def members(*groups: str, conf: Path = CONF) -> list[str]:
    """The registered methods whose display group is one of `groups`, in table order."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"group {unknown[0]!r} is not allowed: one of {list(GROUPS)}")
    return [name for name, spec in methods(conf).items() if spec.group in groups]


def trained_methods(conf: Path = CONF) -> list[str]:
    """Every registered method but the base model (group `base`) and ATLAS's ablations (group `ablation`): the
    methods a comparison trains, in table order."""
    return [name for name, spec in methods(conf).items() if spec.group not in ("base", "ablation")]


def method_values(option: str, conf: Path = CONF) -> dict:
    """The hyperparameter values of registered method `option` (`RegistryError` naming the registered ones
    otherwise)."""
    found = methods(conf)
    if option not in found:
        raise RegistryError(f"method={option!r} is not allowed: one of {sorted(found)}")
    return dict(found[option].values)
