"""The method registry: every method is one `conf/method/<name>.yaml` (its `_target_`, hyperparameter
values and `display`), read here for tests, benchmarks and tools, and by `analysis.methods` for labels.

Adding a method is its module, its config file, its test file and a section in docs/baselines.md.
"""

from __future__ import annotations

from typing import Any

import yaml

from experiments.config import CONF, group_values
from experiments.methods import DISPLAY_KEY, Method, build_method

METHOD_CONF = CONF / "method"
#: Display groups, in table order: ATLAS, the paper's seven baselines, the extended ones, the ATLAS
#: ablations, the base model.
GROUPS = ("reference", "baseline", "extended", "ablation", "base")


def method_names() -> list[str]:
    """Every configured method, in display order (group, then its `display.order`)."""
    return sorted((p.stem for p in METHOD_CONF.glob("*.yaml")), key=_order)


def _order(name: str) -> tuple:
    d = display(name)
    return GROUPS.index(d["group"]), d["order"], name


def method_config(name: str) -> dict:
    """The composed `method` config of `name`: its file over the files its `defaults` list names."""
    return group_values("method", name)


def display(name: str) -> dict:
    """How analysis shows `name`: label, group (one of GROUPS), order within the group, colour, marker.
    Each file has its own (an ablation's is not its parent's)."""
    return dict((yaml.safe_load((METHOD_CONF / f"{name}.yaml").read_text()) or {})[DISPLAY_KEY])


def trained_methods(*groups: str) -> list[str]:
    """The methods of `groups` (all but the base when none are given) that train."""
    wanted = groups or tuple(g for g in GROUPS if g != "base")
    return [n for n in method_names() if display(n)["group"] in wanted]


def build(name: str, **overrides: Any) -> Method:
    """The method `conf/method/<name>.yaml` configures, with hyperparameter overrides."""
    return build_method({**method_config(name), **overrides})
