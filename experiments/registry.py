"""The method registry: every method is one `conf/method/<name>.yaml` (its `_target_`, hyperparameter
values and `display`). Tests, benchmarks and tools read it here; the display blocks are read once, by
`analysis.methods` (which reads them as files, importing nothing from the runtime).

Adding a method is its module, its config file, its test file and a section in docs/baselines.md.
"""

from __future__ import annotations

from typing import Any

from analysis.methods import GROUPS, KNOWN_ORDER, display, group_members  # noqa: F401  (re-exported)
from experiments.config import group_values
from experiments.methods import Method, build_method


def method_names() -> list[str]:
    """Every configured method, in display order (group, then its `display.order`)."""
    return list(KNOWN_ORDER)


def method_config(name: str) -> dict:
    """The composed `method` config of `name`: its file over the files its `defaults` list names."""
    return group_values("method", name)


def trained_methods(*groups: str) -> list[str]:
    """The methods of `groups` (all but the base when none are given), in display order."""
    return group_members(*(groups or tuple(g for g in GROUPS if g != "base")))


def build(name: str, **overrides: Any) -> Method:
    """The method `conf/method/<name>.yaml` configures, with hyperparameter overrides."""
    return build_method({**method_config(name), **overrides})
