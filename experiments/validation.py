"""One way to refuse a config value, for every key: `ConfigError("<key>=<value> is not allowed: <what is>")`, raised
before any compute and printed by `run.py` as `error: <key>=<value> is not allowed: <what is>` (exit code 2)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

#: How a key without a value is shown (OmegaConf's mark for a missing value).
MISSING_VALUE = "???"


class ConfigError(ValueError):
    """A config value is not allowed; the message names key, value and what is allowed."""


def not_allowed(key: str, value: Any, allowed: str, error: type[ConfigError] = ConfigError) -> ConfigError:
    """The error for `key=value`: `<key>=<value!r> is not allowed: <allowed>` (a missing value shows as `???`)."""
    shown = MISSING_VALUE if value is MISSING_VALUE else repr(value)
    return error(f"{key}={shown} is not allowed: {allowed}")


def require(key: str, value: Any, ok: bool, allowed: str, error: type[ConfigError] = ConfigError) -> None:
    """Raise `not_allowed(key, value, allowed)` unless `ok`."""
    if not ok:
        raise not_allowed(key, value, allowed, error)


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def non_finite_floats(data: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """`(key, value)` of every float in a nested mapping or list that is nan or +-inf, keys dotted from `prefix`
    (`train.lr`, `eval.scales[1]`)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from non_finite_floats(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            yield from non_finite_floats(value, f"{prefix}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        yield prefix, data


def require_finite(data: Any, prefix: str = "", error: type[ConfigError] = ConfigError) -> None:
    """Raise `not_allowed(key, value, "a finite number")` for the first nan or infinite float in `data`: no
    setting of the suite means anything at nan or infinity (a nan learning rate trains on nan, a nan clipping
    norm turns clipping off)."""
    for key, value in non_finite_floats(data, prefix):
        raise not_allowed(key, value, "a finite number", error)
