"""Every third-party package the project's code imports is declared in pyproject.toml, so that `pip install -e .`
gives a working suite: each import of a module outside the standard library and the project is mapped to the
distribution that provides it (`importlib.metadata.packages_distributions`) and looked up in `dependencies` and
`optional-dependencies`."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Iterator

import tomllib

from tests.conftest import REPO

PACKAGES = ("atlas", "baselines", "experiments", "analysis", "hydra_plugins", "sandbox", "suite_schema", "bench", "tools")
SCRIPTS = ("run.py",)
OWN = set(PACKAGES) | {Path(s).stem for s in SCRIPTS}


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them: lower case, runs of '-', '_', '.' as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """Normalized names of the distributions pyproject.toml declares, required or optional."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        requirements += group
    # A PEP 508 requirement starts with the distribution's name (then extras, version, markers).
    return {_normalized(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r).group(1)) for r in requirements}


def _project_modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")) + [REPO / s for s in SCRIPTS]


def _third_party_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) of each absolute import in `path` of a module outside the standard library and
    the project; a module next to `path` imported by its bare name (a script's sibling) is the project's."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top in sys.stdlib_module_names or top in OWN:
                continue
            if (path.parent / f"{top}.py").is_file() or (path.parent / top / "__init__.py").is_file():
                continue
            yield node.lineno, name


def test_every_package_with_code_is_scanned():
    # A new top-level package or script must be added above; hidden folders (.venv, .git) are not the project's.
    with_code = {p.name for p in REPO.iterdir() if not p.name.startswith(".")
                 and (p.suffix == ".py" if p.is_file() else next(p.rglob("*.py"), None) is not None)}
    assert with_code - {"tests"} == set(PACKAGES) | set(SCRIPTS)


def test_every_imported_third_party_package_is_declared():
    declared = _declared()
    provided_by = importlib.metadata.packages_distributions()
    missing = []
    for path in _project_modules():
        for line, name in _third_party_imports(path):
            top = name.partition(".")[0]
            dists = provided_by.get(top)
            where = f"{path.relative_to(REPO)}:{line} imports {name}"
            if not dists:
                missing.append(f"{where}, which no installed distribution provides")
            elif not any(_normalized(d) in declared for d in dists):
                missing.append(f"{where} (distribution {' or '.join(sorted(set(dists)))}), not declared in "
                               "pyproject.toml")
    assert not missing, "\n".join(missing)
