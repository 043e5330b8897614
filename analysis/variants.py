"""Option studies: the records of a method whose chosen knobs differ from the method's defaults become a method of
their own, `METHOD[KNOB=VALUE,...]`, so each option gets its own rows, per-seed fronts, matched values and paired
difference to the method at its defaults in every table (`python -m analysis report --variants KNOB ...`).

Without it the report pools every record of a method into one front per seed, which is right for a trade-off knob
(ATLAS `conditioning`, LoRA `train.steps`) and wrong for a design option whose settings should be compared. A
record without the knob (made before the knob existed) counts as made at the value that computes what runs did
then (`run_identity.LATER_KEYS`), not at today's default, so a changed default never renames old records. Defaults are
the method registry's (`suite_schema.registry`).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from analysis import schema
from suite_schema import registry


def method_defaults(method: str) -> dict:
    """The knob values of registered method `method` but its `name` (empty for a method the registry lacks)."""
    spec = registry.methods().get(method)
    return {} if spec is None else {k: v for k, v in spec.values.items() if k != "name"}


def variant_name(method: str, row: pd.Series, keys: Sequence[str]) -> str:
    """`method` when every key in `keys` the method has is at its default, else `method[key=value,...]` naming the
    keys away from it, in the order given (a null value is named `null`).

    A missing or null knob is null, except for a key in `run_identity.LATER_KEYS`, where it is the value runs computed
    before the key existed."""
    return schema.named_away(method, method_defaults(method), keys, lambda key: row.get(schema.KNOB_PREFIX + key))


def split_variants(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`table` with each record's method renamed by `variant_name` (a copy; unchanged when `keys` is empty).

    Raises ValueError, before any analysis, when a key is a knob of none of the table's methods."""
    keys = list(keys)
    if not keys or table.empty:
        return table
    methods = sorted(set(table["method"]))
    unknown = [k for k in keys if not any(k in method_defaults(m) for m in methods)]
    if unknown:
        known = sorted({k for m in methods for k in method_defaults(m)})
        raise ValueError(f"--variants {' '.join(unknown)}: not a knob of any method among the records "
                         f"({', '.join(methods)}); their knobs: {', '.join(known)}")
    out = table.copy()
    out["method"] = [variant_name(m, row, keys) for m, (_, row) in zip(table["method"], table.iterrows())]
    return out
