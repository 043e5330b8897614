"""Real benchmarks through the real path: every HumanEval canonical solution and every MBPP
reference solution (full 974 and sanitized 427, converted with ``mbpp_to_humaneval``) passes in
the sandbox via ``build_check`` (test and solution in separate processes, values crossing as
plain data); wrong completions fail.

The files are read directly (json/gzip) from ``<repo>/../shared/data``; the tests skip when that
folder is absent. All 974 MBPP references pass after conversion, so there is no exception list.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from experiments.data.mbpp_conversion import mbpp_to_humaneval
from experiments.evaluation.code_completion import build_check
from sandbox import SandboxLimits, check_solutions

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
LIMITS = SandboxLimits(wall_seconds=20, cpu_seconds=20)


def _data(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real dataset file {path.resolve()} is absent (a clone without ../shared/data)")
    return path


@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    with gzip.open(_data("humaneval", "HumanEval.jsonl.gz"), "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def mbpp_full() -> list[dict]:
    return [json.loads(line) for line in _data("mbpp", "mbpp.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mbpp_sanitized() -> list[dict]:
    return json.loads(_data("mbpp", "sanitized-mbpp.json").read_text())


def _failures(problems: list[dict], completions: list[str]) -> list[tuple[str, str, str]]:
    checks = [build_check(p, c) for p, c in zip(problems, completions)]
    results = check_solutions(checks, LIMITS, workers=2)
    return [(p["task_id"], r.status, r.reason) for p, r in zip(problems, results) if not r.passed]


@pytest.mark.sandbox
@pytest.mark.slow
def test_all_humaneval_canonical_solutions_pass(humaneval):
    assert len(humaneval) == 164
    assert _failures(humaneval, [p["canonical_solution"] for p in humaneval]) == []


@pytest.mark.sandbox
def test_humaneval_wrong_completions_fail(humaneval):
    problems = humaneval[:20]
    wrong = ["    return None\n"] * len(problems)
    failures = _failures(problems, wrong)
    assert len(failures) == len(problems)
    assert all(status == "failed" for _, status, _ in failures)
    # A whole-function answer that is wrong fails too, and the right one in a chat reply passes.
    p = humaneval[0]
    chat = f"Sure:\n```python\n{p['prompt']}{p['canonical_solution']}```\n"
    broken = f"```python\ndef {p['entry_point']}(*args):\n    return 'nope'\n```"
    results = check_solutions([build_check(p, chat), build_check(p, broken)], LIMITS)
    assert [r.status for r in results] == ["passed", "failed"]


@pytest.mark.sandbox
@pytest.mark.slow
def test_all_sanitized_mbpp_references_pass(mbpp_sanitized):
    assert len(mbpp_sanitized) == 427
    problems = [mbpp_to_humaneval(item) for item in mbpp_sanitized]
    assert len({p["task_id"] for p in problems}) == 427
    assert _failures(problems, [p["canonical_solution"] for p in problems]) == []


@pytest.mark.sandbox
@pytest.mark.slow
def test_all_full_mbpp_references_pass(mbpp_full):
    assert len(mbpp_full) == 974
    problems = [mbpp_to_humaneval(item) for item in mbpp_full]
    assert _failures(problems, [p["canonical_solution"] for p in problems]) == []


@pytest.mark.sandbox
def test_mbpp_wrong_completions_fail(mbpp_sanitized):
    problems = [mbpp_to_humaneval(item) for item in mbpp_sanitized[:30]]
    failures = _failures(problems, ["    return None\n"] * len(problems))
    assert len(failures) == len(problems)


def test_mbpp_prompts_show_only_the_signature_and_the_task(mbpp_sanitized):
    for item in mbpp_sanitized:
        problem = mbpp_to_humaneval(item)
        prompt = problem["prompt"]
        assert f"def {problem['entry_point']}(" in prompt and prompt.endswith('    """\n')
        assert item["prompt"].strip().split("\n")[0] in prompt
        assert "Example:" in prompt and problem["test"].count("assert ") == len(item["test_list"])
