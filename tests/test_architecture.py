"""The import structure the layout promises, checked on the source: the module graph has no cycle (imports inside
functions included), each package imports only the layers below it, and an import left inside a function says why
in a comment on the line above (start-up time is the only reason)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("atlas", "baselines", "experiments", "analysis", "hydra_plugins", "sandbox", "suite_schema", "bench", "tools")
# What each package may import of the suite (besides itself): the contract and the sandbox sit below everything,
# analysis reads records only, the runtime never reads analysis.
MAY_IMPORT = {
    "suite_schema": set(),
    "sandbox": set(),
    "analysis": {"suite_schema"},
    "experiments": {"suite_schema", "sandbox"},
    "atlas": {"experiments", "suite_schema"},
    "baselines": {"experiments", "suite_schema"},
    "hydra_plugins": {"experiments", "suite_schema"},
    "run": {"experiments", "hydra_plugins"},
    "tools": {"experiments", "sandbox", "suite_schema"},
    "bench": {"atlas", "baselines", "experiments", "sandbox", "suite_schema"},
}


def modules() -> dict[str, Path]:
    """Every module of the suite's packages and run.py, by dotted name (scripts run inside the sandbox excluded:
    they are files, not modules of the suite)."""
    out = {"run": REPO / "run.py"}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            if "inside" in rel.parts:
                continue
            name = ".".join(rel.parts)
            out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(imported suite module, line, inside a function) of every import in `path`."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = name.split(".")[: len(name.split(".")) - child.level + (path.name == "__init__.py")]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            else:
                visit(child, inside)
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    out.append((target, child.lineno, inside))
    visit(tree, False)
    return out


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_module_graph_has_no_cycle():
    edges = {name: {target for target, _, _ in found if target != name} for name, found in graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def walk(node, stack):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    assert not cycles, cycles


def test_each_package_imports_only_the_layers_below_it():
    wrong = []
    for name, found in graph().items():
        pkg = name.split(".")[0]
        for target, line, _ in found:
            other = target.split(".")[0]
            if other != pkg and other not in MAY_IMPORT[pkg]:
                wrong.append(f"{name}:{line} imports {target}")
    assert not wrong, wrong


def test_an_import_inside_a_function_says_why():
    """The first import of each run of imports inside a function has a comment on the line above (or its own)."""
    silent = []
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            found = sorted({(n.lineno, n.end_lineno) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))})
            previous_end = None
            for start, end in found:
                first = previous_end is None or start != previous_end + 1
                if first and not (lines[start - 2].strip().startswith("#") or "#" in lines[start - 1]):
                    silent.append(f"{path.relative_to(REPO)}:{start}: {lines[start - 1].strip()}")
                previous_end = end
    assert not silent, silent
