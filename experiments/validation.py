"""One way to refuse a config value, for every key: `ConfigError("<key>=<value> is not allowed: <what is>")`, raised
before any compute and printed by `run.py` as `error: <key>=<value> is not allowed: <what is>` (exit code 2)."""

from __future__ import annotations

import math
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
