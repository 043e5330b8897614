"""Completion truncation, check assembly (solution and test apart) and the MBPP conversion
(synthetic cases; the real datasets are in test_real_code_data.py)."""

from __future__ import annotations

import ast
import sys

import pytest

from experiments.data.mbpp_conversion import mbpp_to_humaneval
from experiments.evaluation.code_completion import build_check, truncate_completion
from sandbox import SandboxLimits, check_solutions

LIMITS = SandboxLimits(wall_seconds=5, cpu_seconds=5)

PROBLEM = {
    "task_id": "Toy/0",
    "prompt": 'import math\n\n\ndef helper(x):\n    return x\n\n\ndef hypot(a, b):\n    """Length of the hypotenuse.\n    >>> hypot(3, 4)\n    5.0\n    """\n',
    "canonical_solution": "    return math.sqrt(helper(a) ** 2 + b ** 2)\n",
    "test": "\n\ndef check(candidate):\n    assert candidate(3, 4) == 5.0\n    assert candidate(5, 12) == 13.0\n",
    "entry_point": "hypot",
}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("    return a + b\n", "    return a + b"),
        ("    return a + b\n\ndef other():\n    pass\n", "    return a + b"),
        ("    return a + b\n\n\nprint(hypot(3, 4))\n", "    return a + b"),
        ("    return a + b\nif __name__ == '__main__':\n    main()\n", "    return a + b"),
        ("    return a + b\n```\nThis adds the numbers.", "    return a + b"),
        ("    return a + b\nclass Foo:\n    pass\n", "    return a + b"),
        ("    return a + b\n# a top-level comment\nx = 1\n", "    return a + b"),
        ("    return a + b\nassert hypot(1, 2) == 3\n", "    return a + b"),
        ("    x = a\n\n    y = b\n    return x + y\n\nz = 3", "    x = a\n\n    y = b\n    return x + y"),
        ("    s = '''\nnot the end\n'''\n    return s\nprint(1)\n", "    s = '''\nnot the end\n'''\n    return s"),
        ("return a + b\n", "return a + b"),  # the first line is never cut
        ("    return a<|endoftext|>junk", "    return a"),
        ("", ""),
    ],
)
def test_truncate_completion(completion, expected):
    assert truncate_completion(completion) == expected


def test_build_check_layout():
    check = build_check(PROBLEM, "    return math.hypot(a, b)\n\nprint('garbage')\n")
    assert check.solution == PROBLEM["prompt"] + "    return math.hypot(a, b)" + "\n"
    assert check.test == "import math\n\n\ndef helper(x):\n    return x\n\n\n" + "\n" + PROBLEM["test"] + "\n"
    assert check.entry_point == "hypot" and check.invalid is None
    assert "def check" not in check.solution and "return math.hypot" not in check.test
    ast.parse(check.solution)
    ast.parse(check.test)


@pytest.mark.sandbox
@pytest.mark.parametrize(
    "completion, reason",
    [
        ("@(lambda f: lambda candidate: None)", "does not parse with its prompt: SyntaxError"),
        ("    return (a +\n", "does not parse with its prompt"),
        ("return a + b\n", "adds top-level statements to its prompt (line 13: return a + b)"),
        ("def hypot(a, b):\n    nonlocal q\n    return a\n", "does not compile with its prompt: SyntaxError: no binding for nonlocal 'q'"),
        ("x = 1\n", "adds top-level statements to its prompt (line 13: x = 1)"),
        ("check = None\n", "adds top-level statements"),
        ("def hypot(a, b):\n    return a\n@(lambda f: lambda candidate: None)\n", "does not parse"),
        ("```python\ndef hypot(a, b)\n    return a\n```", "does not parse"),
    ],
)
def test_completions_that_do_not_form_a_solution_are_invalid(completion, reason):
    check = build_check(PROBLEM, completion)
    assert check.invalid is not None and reason in check.invalid, check.invalid
    result = check_solutions([check], LIMITS)[0]
    assert (result.status, result.reason, result.returncode) == ("invalid", check.invalid, None)


FULL_FUNCTION_ANSWERS = {
    "plain": "def hypot(a, b):\n    return math.sqrt(helper(a) ** 2 + b ** 2)\n",
    "fenced chat answer": (
        "Here is the function:\n\n```python\ndef hypot(a, b):\n    return math.sqrt(a * a + b * b)\n```\n"
        "It uses Pythagoras.\n"
    ),
    "fenced with a helper and usage": (
        "```python\nimport math\n\ndef _sq(x):\n    return x * x\n\ndef hypot(a, b):\n    return math.sqrt(_sq(a) + _sq(b))\n\n"
        "print(hypot(3, 4))\nassert hypot(1, 1) == 99\nif __name__ == '__main__':\n    input()\n```"
    ),
    "two fenced blocks": "```\npip install nothing\n```\nthen\n```python\ndef hypot(a, b):\n    return (a * a + b * b) ** 0.5\n```",
    "fenced body only": "```python\n    return math.sqrt(a * a + b * b)\n```",
}


@pytest.mark.sandbox
def test_full_function_and_fenced_answers_pass():
    checks = [build_check(PROBLEM, c) for c in FULL_FUNCTION_ANSWERS.values()]
    for check in checks:
        assert check.invalid is None and "def check(candidate)" not in check.solution
        assert "pip install" not in check.solution and "It uses Pythagoras" not in check.solution
        assert "print(hypot" not in check.solution and "__main__" not in check.solution
    results = check_solutions(checks, LIMITS)
    for name, result in zip(FULL_FUNCTION_ANSWERS, results):
        assert result.passed, (name, result.reason)


def test_full_function_keeps_the_prompt_preamble():
    check = build_check(PROBLEM, "def hypot(a, b):\n    return a\n")
    assert check.solution.startswith("import math\n\n\ndef helper(x):")
    assert '"""Length of the hypotenuse.' not in check.solution  # the prompt's function is replaced


@pytest.mark.sandbox
def test_wrong_and_canonical_completions():
    checks = [
        build_check(PROBLEM, PROBLEM["canonical_solution"]),
        build_check(PROBLEM, "    return a + b\n"),
        build_check(PROBLEM, "def hypot(a, b):\n    return a + b\n"),
        build_check(PROBLEM, "    while True:\n        pass\n"),
    ]
    results = check_solutions(checks, SandboxLimits(wall_seconds=3, cpu_seconds=1))
    assert [r.status for r in results] == ["passed", "failed", "failed", "timeout"]
    assert "assert candidate(3, 4) == 5.0" in results[1].reason and "hypot(3, 4) returned 7" in results[1].reason


MBPP_FULL = {
    "task_id": 1,
    "text": "Write a function to find the minimum cost path to reach (m, n) from (0, 0).",
    "code": (
        "R = 3\r\nC = 3\r\ndef min_cost(cost, m, n): \r\n\ttc = [[0 for x in range(C)] for x in range(R)] \r\n"
        "\ttc[0][0] = cost[0][0] \r\n\tfor i in range(1, m+1): \r\n\t\ttc[i][0] = tc[i-1][0] + cost[i][0] \r\n"
        "\tfor j in range(1, n+1): \r\n\t\ttc[0][j] = tc[0][j-1] + cost[0][j] \r\n\tfor i in range(1, m+1): \r\n"
        "\t\tfor j in range(1, n+1): \r\n\t\t\ttc[i][j] = min(tc[i-1][j-1], tc[i-1][j], tc[i][j-1]) + cost[i][j] \r\n"
        "\treturn tc[m][n]"
    ),
    "test_setup_code": "",
    "test_list": [
        "assert min_cost([[1, 2, 3], [4, 8, 2], [1, 5, 3]], 2, 2) == 8",
        "assert min_cost([[2, 3, 4], [5, 9, 3], [2, 6, 4]], 2, 2) == 12",
    ],
    "challenge_test_list": [],
}

MBPP_SANITIZED = {
    "source_file": "x",
    "task_id": 2,
    "prompt": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n  return (res) ",
    "test_imports": ["import math"],
    "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"],
}


def test_mbpp_full_record_conversion():
    problem = mbpp_to_humaneval(MBPP_FULL)
    assert problem["task_id"] == "MBPP/1" and problem["entry_point"] == "min_cost"
    assert problem["prompt"].startswith("def min_cost(cost, m, n):\n    \"\"\"\n    Write a function to find the minimum")
    assert "    Example:\n    assert min_cost([[1, 2, 3], [4, 8, 2], [1, 5, 3]], 2, 2) == 8\n" in problem["prompt"]
    assert "R = 3" not in problem["prompt"]  # helpers and constants belong to the solution
    assert problem["canonical_solution"].startswith("    R = 3\n    C = 3\n")
    assert "\t" not in problem["canonical_solution"] and "\r" not in problem["canonical_solution"]
    assert problem["test"] == (
        "\ndef check(candidate):\n    min_cost = candidate\n"
        "    assert min_cost([[1, 2, 3], [4, 8, 2], [1, 5, 3]], 2, 2) == 8\n"
        "    assert min_cost([[2, 3, 4], [5, 9, 3], [2, 6, 4]], 2, 2) == 12\n"
    )


def test_mbpp_sanitized_record_conversion():
    problem = mbpp_to_humaneval(MBPP_SANITIZED)
    assert problem["task_id"] == "MBPP/2" and problem["entry_point"] == "similar_elements"
    assert problem["test"].startswith("import math\n\n\ndef check(candidate):\n    similar_elements = candidate\n")
    assert "shared elements" in problem["prompt"]


@pytest.mark.sandbox
def test_mbpp_special_cases():
    named_check = {
        "task_id": 56,
        "text": "Check if a number is one less than twice its reverse.",
        "code": "def rev(num):\n  r = 0\n  while num > 0:\n    r = r * 10 + num % 10\n    num //= 10\n  return r\ndef check(n):\n  return 2 * rev(n) == n + 1",
        "test_setup_code": "",
        "test_list": ["assert check(70) == False", "assert check(73) == True"],
    }
    shadowing = {
        "task_id": 631,
        "text": "Replace spaces with underscores.",
        "code": "text = 'Python Exercises'\ndef replace_spaces(text):\n  return text.replace(' ', '_')",
        "test_setup_code": "",
        "test_list": ["assert replace_spaces('a b') == 'a_b'"],
    }
    uses_class = {
        "task_id": 601,
        "text": "Longest chain of pairs.",
        "code": "class Pair(object):\n  def __init__(self, a, b):\n    self.a = a\n    self.b = b\ndef first(p):\n  return p.a\ndef firsts(arr):\n  return [first(p) for p in arr]",
        "test_setup_code": "",
        "test_list": ["assert firsts([Pair(1, 2), Pair(3, 4)]) == [1, 3]"],
    }
    backslash = {
        "task_id": 9,
        "text": "Match digits with a regex like \\d+.",
        "code": "import re\ndef digits(s):\n  return re.findall(r'\\d+', s)",
        "test_setup_code": "",
        "test_list": ["assert digits('a1b22') == ['1', '22']"],
    }
    problems = [mbpp_to_humaneval(r) for r in (named_check, shadowing, uses_class, backslash)]
    assert problems[0]["entry_point"] == "check_solution" and "def check_solution(n):" in problems[0]["prompt"]
    assert "assert check_solution(70) == False" in problems[0]["test"]
    assert problems[1]["prompt"].startswith("text = 'Python Exercises'\n")
    assert problems[2]["prompt"].startswith("class Pair(object):") and "def first(p)" not in problems[2]["prompt"]
    assert '    r"""' in problems[3]["prompt"] and problems[3]["prompt"].startswith("import re\n")
    for problem in problems:
        ast.parse(problem["prompt"] + problem["canonical_solution"])
    checks = [build_check(p, p["canonical_solution"]) for p in problems]
    checks.append(build_check(problems[0], "    return n == 73\n"))  # passes the tests, wrong idea
    checks.append(build_check(problems[0], "    return True\n"))
    # Pair instances built by the test cross to the solution as plain data of its own Pair class.
    assert [r.status for r in check_solutions(checks, LIMITS)] == ["passed"] * 5 + ["failed"]


def test_mbpp_without_a_called_definition_is_an_error():
    broken = dict(MBPP_FULL, test_list=["assert other_name(1) == 2"])
    with pytest.raises(ValueError, match="no function defined by the reference code"):
        mbpp_to_humaneval(broken)


# --------------------------------------------------------------------------------------------
# Whole-function answers are kept as written, less their examples and tests

#: Realistic whole-function answers that need a top-level statement besides definitions: (problem, answer, the
#: kept statements in their order, a dropped example).
AS_WRITTEN = {
    "recursion limit": (
        {"task_id": "Toy/1", "entry_point": "sum_to",
         "prompt": 'def sum_to(n: int) -> int:\n    """1 + 2 + ... + n, recursively."""\n',
         "test": "\n\ndef check(candidate):\n    assert candidate(3) == 6\n    assert candidate(5000) == 12502500\n"},
        ("```python\nimport sys\n\nsys.setrecursionlimit(10000)\n\n\ndef sum_to(n: int) -> int:\n    if n == 0:\n"
        "        return 0\n    return n + sum_to(n - 1)\n\n\nprint(sum_to(5000))  # 12502500\n```\n"),
        ["import sys", "sys.setrecursionlimit(10000)", "def sum_to(n: int) -> int:"],
        "print(sum_to(5000))",
    ),
    "table filled by a loop": (
        {"task_id": "Toy/2", "entry_point": "fib",
         "prompt": 'def fib(n: int) -> int:\n    """The n-th Fibonacci number, n <= 90."""\n',
         "test": "\n\ndef check(candidate):\n    assert candidate(0) == 0\n    assert candidate(10) == 55\n"
                 "    assert candidate(90) == 2880067194370816120\n"},
        ("FIB = [0, 1]\nfor _ in range(2, 91):\n    FIB.append(FIB[-1] + FIB[-2])\n\n\ndef fib(n: int) -> int:\n"
        "    return FIB[n]\n\n\nfor n in range(5):\n    print(n, fib(n))\nassert fib(10) == 55\n"),
        ["FIB = [0, 1]", "for _ in range(2, 91):", "FIB.append(FIB[-1] + FIB[-2])", "def fib(n: int) -> int:"],
        "print(n, fib(n))",
    ),
    "import with a fallback": (
        {"task_id": "Toy/3", "entry_point": "grid_paths",
         "prompt": 'def grid_paths(m: int, n: int) -> int:\n    """Monotone paths through an m x n grid of steps."""\n',
         "test": "\n\ndef check(candidate):\n    assert candidate(2, 2) == 6\n    assert candidate(3, 7) == 120\n"},
        ("Using the binomial coefficient:\n\n```python\ntry:\n    from math import comb\nexcept ImportError:  # Python < 3.8\n"
        "    def comb(n, k):\n        result = 1\n        for i in range(1, k + 1):\n"
        "            result = result * (n - k + i) // i\n        return result\n\n\ndef grid_paths(m: int, n: int) -> int:\n"
        "    return comb(m + n, n)\n\n\nif __name__ == \"__main__\":\n    print(grid_paths(int(input()), int(input())))\n```\n"),
        ["try:", "from math import comb", "except ImportError:", "def grid_paths(m: int, n: int) -> int:"],
        "__main__",
    ),
    "future import after the prompt's imports": (
        {"task_id": "Toy/4", "entry_point": "evens",
         "prompt": 'from typing import List\n\n\ndef evens(numbers: List[int]) -> List[int]:\n    """The even numbers."""\n',
         "test": "\n\ndef check(candidate):\n    assert candidate([1, 2, 3, 4]) == [2, 4]\n    assert candidate(None) == []\n"},
        ("from __future__ import annotations\n\n\ndef evens(numbers: list[int] | None) -> list[int]:\n"
        "    return [n for n in numbers or [] if n % 2 == 0]\n\n\ndef check(candidate):\n    assert candidate([2]) == [2]\n\n\n"
        "check(evens)\nevens([1, 2])\n"),
        ["from __future__ import annotations", "from typing import List", "def evens(numbers: list[int] | None)"],
        "check(evens)",
    ),
}


def _in_order(text: str, parts: list[str]) -> bool:
    at = [text.find(p) for p in parts]
    return -1 not in at and at == sorted(at)


@pytest.mark.parametrize("name", AS_WRITTEN)
def test_whole_function_answers_keep_their_top_level_statements(name):
    problem, answer, kept, dropped = AS_WRITTEN[name]
    check = build_check(problem, answer)
    assert check.invalid is None, check.invalid
    assert _in_order(check.solution, kept), check.solution
    assert dropped not in check.solution and "def check" not in check.solution
    # The program HumanEval's harness would run (solution, test, check) passes as one program too.
    program = compile(f"{check.solution}\n{check.test}\ncheck({check.entry_point})\n", "program.py", "exec", dont_inherit=True)
    limit = sys.getrecursionlimit()
    try:
        exec(program, {"__name__": "program"})  # noqa: S102 - the fixed programs above
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.sandbox
def test_whole_function_answers_kept_as_written_pass():
    checks = [build_check(problem, answer) for problem, answer, _, _ in AS_WRITTEN.values()]
    results = check_solutions(checks, LIMITS)
    for name, result in zip(AS_WRITTEN, results):
        assert result.passed, (name, result.status, result.reason)


#: More honest whole-function answers of PROBLEM (hypot), in the shapes chat models write them: each passes as written.
HONEST = {
    "cached recursion": "import functools\n\n@functools.lru_cache(maxsize=None)\ndef hypot(a, b):\n    return math.sqrt(a * a + b * b)\n",
    "helper after the function": "def hypot(a, b):\n    return math.sqrt(_square(a) + _square(b))\n\ndef _square(x):\n    return x * x\n",
    "class behind the function": ("class Triangle:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n"
                                  "    def hypotenuse(self):\n        return math.hypot(self.a, self.b)\n\n\n"
                                  "def hypot(a, b):\n    return Triangle(a, b).hypotenuse()\n"),
    "module docstring and __all__": '"""Geometry helpers."""\n__all__ = ["hypot"]\n\ndef hypot(a, b):\n    return math.hypot(a, b)\n',
    "TYPE_CHECKING block": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from numbers import Real\n\n"
                            "def hypot(a: 'Real', b: 'Real') -> float:\n    return math.hypot(a, b)\n"),
    "table by a comprehension": "SQUARES = {n: n * n for n in range(100)}\n\ndef hypot(a, b):\n    return math.sqrt(SQUARES[a] + SQUARES[b])\n",
    "dataclass": ("from dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass Leg:\n    length: float\n\n"
                  "def hypot(a, b):\n    return math.sqrt(Leg(a).length ** 2 + Leg(b).length ** 2)\n"),
    "main function behind a guard": ("def hypot(a, b):\n    return math.hypot(a, b)\n\n\ndef main():\n    a, b = map(float, input().split())\n"
                                     "    print(hypot(a, b))\n\n\nif __name__ == '__main__':\n    main()\n"),
    "decorator chosen at import": ("try:\n    from functools import cache\nexcept ImportError:\n    def cache(f):\n        return f\n\n\n"
                                   "@cache\ndef hypot(a, b):\n    return math.hypot(a, b)\n"),
    "sieve filled by a while loop": ("LIMIT = 200\nsquare = [False] * LIMIT\ni = 0\nwhile i * i < LIMIT:\n    square[i * i] = True\n"
                                     "    i += 1\n\ndef hypot(a, b):\n    c2 = a * a + b * b\n"
                                     "    return float(int(c2 ** 0.5)) if c2 < LIMIT and square[c2] else math.sqrt(c2)\n"),
    "memo dict and global counter": ("_memo = {}\ncalls = 0\n\ndef hypot(a, b):\n    global calls\n    calls += 1\n"
                                     "    if (a, b) not in _memo:\n        _memo[a, b] = math.sqrt(a * a + b * b)\n    return _memo[a, b]\n"),
    "examples in a loop after it": ("def hypot(a, b):\n    return math.sqrt(a * a + b * b)\n\n\nfor a, b in [(3, 4), (5, 12)]:\n"
                                    "    print(hypot(a, b))\n"),
}


@pytest.mark.sandbox
def test_more_honest_whole_function_answers_pass():
    checks = [build_check(PROBLEM, f"```python\n{answer}```\n") for answer in HONEST.values()]
    for name, check in zip(HONEST, checks):
        assert check.invalid is None, (name, check.invalid)
    results = check_solutions(checks, LIMITS)
    assert {name: r.status for name, r in zip(HONEST, results) if not r.passed} == {}


@pytest.mark.parametrize(
    "answer, kept, dropped",
    [
        ("def hypot(a, b):\n    return a\nprint('x'); Y = 2  # c\n", ["pass; Y = 2  # c"], ["print("]),
        ("def hypot(a, b):\n    return a\nhypot(1, 2)\nhypot(3, 4) == 5\n", ["hypot(3, 4) == 5"], ["hypot(1, 2)\n"]),
        ("def hypot(a, b):\n    return a\nfor i in range(3):\n    assert hypot(i, 0) == i\n    pass\n", [], ["for i"]),
        ("def hypot(a, b):\n    return a\nwhile True:\n    pass\n", ["while True:"], []),
        ("def hypot(a, b):\n    return a\ncheck = None\nclass check:\n    pass\n", [], ["check"]),
        ("def hypot(a, b):\n    return a\nimport unittest\nunittest.main()\n", ["import unittest"], ["unittest.main"]),
        ("def hypot(a, b):\n    return a\nif '__main__' == __name__:\n    hypot(1, 2)\nelse:\n    X = 1\n", [], ["X = 1"]),
        ("def hypot(a, b):\n    return a\nif DEBUG := False:\n    X = 1\nwith open(__file__) as f:\n    S = f.read()\n",
         ["if DEBUG := False:", "with open(__file__)"], []),
        ("@staticmethod\ndef check(c):\n    pass\ndef hypot(a, b):\n    return a\n", [], ["@staticmethod", "def check"]),
        ("def hypot(a, b):\n    return a\r\nprint(1)\r\nZ = 'é'; print(Z); W = 1\r\n", ["Z = 'é'; pass; W = 1"], ["print("]),
    ],
)
def test_whole_function_answers_lose_only_examples_and_tests(answer, kept, dropped):
    check = build_check(PROBLEM, answer)
    assert check.invalid is None, check.invalid
    assert _in_order(check.solution, ["import math", "def helper(x):", "def hypot(a, b):", *kept]), check.solution
    for text in dropped:
        assert text not in check.solution, check.solution


def test_future_imports_of_the_prompt_and_the_answer_go_first():
    problem = dict(PROBLEM, prompt='"""Module."""\nfrom __future__ import division\nimport math\n\n\n' + PROBLEM["prompt"][13:])
    check = build_check(problem, "import os\nfrom __future__ import (\n    annotations,\n)\n\ndef hypot(a: int | None, b):\n    return a\n")
    assert check.invalid is None, check.invalid
    assert check.solution.startswith("from __future__ import division\nfrom __future__ import (\n    annotations,\n)\n"
                                     '"""Module."""\nimport math\n'), check.solution
    assert _in_order(check.solution, ["def helper", "import os", "def hypot"])
    # a body-only completion of a prompt with a __future__ import is unchanged
    assert build_check(problem, "    return a\n").solution == problem["prompt"] + "    return a\n"


# --------------------------------------------------------------------------------------------
# Building a check never raises: a completion that cannot be assembled is invalid, with the reason

DEEP = {
    "unary minus": ("    return " + "-" * 3000 + "1\n", "RecursionError"),
    "attribute chain": ("    return a" + ".b" * 3000 + "\n", "RecursionError"),
    "nested calls": ("    return f" + "()" * 3000 + "\n", "RecursionError"),
    "nested parentheses": ("    return " + "(" * 3000 + "1" + ")" * 3000 + "\n", "too many nested parentheses"),
    "nested lists": ("    return " + "[" * 3000 + "]" * 3000 + "\n", "too many nested parentheses"),
    "long sum": ("    return " + "+".join(["1"] * 100_000) + "\n", "RecursionError"),
    "whole function, unary minus": ("def hypot(a, b):\n    return " + "-" * 3000 + "1\n", "RecursionError"),
    "whole function, nested lambdas": ("```python\ndef hypot(a, b):\n    return " + "lambda: " * 3000 + "1\n```", "MemoryError"),
    "null byte": ("    return 1\x00\n", "null bytes"),
}


@pytest.mark.parametrize("name", DEEP)
def test_a_completion_the_parser_cannot_take_is_invalid_with_the_reason(name):
    completion, error = DEEP[name]
    check = build_check(PROBLEM, completion)
    assert check.invalid is not None and error in check.invalid, check.invalid
    assert "\n" not in check.invalid and len(check.invalid) < 400
    assert completion.strip("`\n").splitlines()[-1] in check.solution and check.entry_point == "hypot"


@pytest.mark.sandbox
def test_checks_of_normal_completions_are_built_and_run_beside_deep_ones():
    completions = [PROBLEM["canonical_solution"], *(c for c, _ in DEEP.values()), FULL_FUNCTION_ANSWERS["plain"]]
    results = check_solutions([build_check(PROBLEM, c) for c in completions], LIMITS)
    assert [r.status for r in results] == ["passed"] + ["invalid"] * len(DEEP) + ["passed"]


BODY, FENCED = "    return a\n", "```python\nfrom __future__ import annotations\ndef hypot(a, b):\n    return a\n```"


@pytest.mark.parametrize("completion, where", [
    *((BODY, w) for w in ("parse_code", "truncate_completion", "compile", "_invalid")),
    *((FENCED, w) for w in ("parse_code", "_fenced_code", "_keep_definitions", "_cut", "compile", "_invalid")),
])
def test_any_error_while_building_makes_the_check_invalid(monkeypatch, completion, where):
    import experiments.evaluation.code_completion as cc

    test = build_check(PROBLEM, completion).test

    def broken(*args, **kwargs):
        raise ValueError("broken on purpose")

    monkeypatch.setattr(cc, where, broken, raising=False)
    check = build_check(PROBLEM, completion)
    assert check.invalid is not None and "ValueError: broken on purpose" in check.invalid, check.invalid
    assert "import math\n" in check.solution and check.test == test


@pytest.mark.parametrize("completion", [BODY, FENCED])
def test_an_interrupt_while_building_is_not_swallowed(monkeypatch, completion):
    import experiments.evaluation.code_completion as cc

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cc, "parse_code", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_check(PROBLEM, completion)
