"""The method table of docs/baselines.md is the registry, line for line: every registered method (and no other) with
its display group and the module of its `_target_`, so adding a method means adding its line there."""

from __future__ import annotations

import re

from suite_schema import registry
from tests.conftest import REPO

ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<group>[a-z]+) \| `(?P<module>[^`]+)` \| (?P<what>[^|]+) \|$")


def table_rows() -> dict[str, dict]:
    """The rows of the table under `## Adding a method` in docs/baselines.md, by method name."""
    text = (REPO / "docs" / "baselines.md").read_text()
    section = text.split("## Adding a method", 1)[1].split("\n## ", 1)[0]
    return {m["name"]: m.groupdict() for m in map(ROW.match, section.splitlines()) if m}


def test_the_method_table_lists_every_registered_method_with_its_group_and_module():
    rows = table_rows()
    methods = registry.methods()
    assert sorted(rows) == sorted(methods), f"docs/baselines.md lacks {sorted(set(methods) - set(rows))}, " \
                                            f"lists unregistered {sorted(set(rows) - set(methods))}"
    for name, spec in methods.items():
        module = spec.target.rsplit(".", 1)[0].replace(".", "/") + ".py"
        assert (rows[name]["group"], rows[name]["module"]) == (spec.group or "none", module), name
        assert (REPO / module).is_file() and rows[name]["what"].strip(), name


def test_the_readme_points_to_the_method_table_instead_of_listing_methods():
    readme = (REPO / "README.md").read_text()
    group_row = next(line for line in readme.splitlines() if line.startswith("| `method/` |"))
    assert "docs/baselines.md" in group_row
    assert not [name for name in registry.method_names() if f"`{name}`" in group_row and name != "atlas"], group_row
