"""The data-access table of docs/baselines.md says what each trained method reads exactly as its method file's
`display.data` does (the value the report's main table prints), for every trained method but ATLAS's ablations."""

from __future__ import annotations

import re

from suite_schema import registry
from tests.conftest import REPO

ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<data>[^|]+) \| (?P<stores>[^|]+) \| (?P<knob>[^|]+) \|$")


def test_the_data_table_matches_every_method_file():
    text = (REPO / "docs" / "baselines.md").read_text()
    section = text.split("## Data each method reads", 1)[1].split("\n## ", 1)[0]
    rows = {m["name"]: m["data"].strip() for m in map(ROW.match, section.splitlines()) if m}
    methods = registry.methods()
    assert sorted(rows) == sorted(registry.trained_methods())
    for name, data in rows.items():
        assert data == methods[name].display["data"], name
        assert data in registry.DATA_ACCESS, name
