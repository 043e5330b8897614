"""The micro benchmark generator: determinism, committed files, disjoint splits, sizes and formats."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from itertools import combinations
from pathlib import Path

import pytest

from experiments.data import micro

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "assets" / "micro" / "data"


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return micro.generate(micro.DEFAULT_SEED, micro.MicroSizes())


def _read_all(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_byte_identical_files(tmp_path):
    a = _read_all(Path(micro.write(tmp_path / "a", 3, micro.TINY_SIZES)["math/evaluation"]).parents[1])
    b = _read_all(Path(micro.write(tmp_path / "b", 3, micro.TINY_SIZES)["math/evaluation"]).parents[1])
    assert a == b
    assert "math/pretrain.jsonl" in a and "code/train.json" in a
    c = _read_all(Path(micro.write(tmp_path / "c", 4, micro.TINY_SIZES)["math/evaluation"]).parents[1])
    assert c["math/evaluation.jsonl"] != a["math/evaluation.jsonl"]


def test_committed_files_equal_regeneration(tmp_path):
    meta = json.loads((COMMITTED / "GENERATOR.json").read_text())
    assert meta["version"] == micro.GENERATOR_VERSION
    sizes = micro.MicroSizes(**{f.name: meta["sizes"][f.name] for f in fields(micro.MicroSizes)})
    micro.write(tmp_path, meta["seed"], sizes, include_pretrain=False)
    regenerated = _read_all(tmp_path)
    committed = _read_all(COMMITTED)
    assert sorted(committed) == sorted(regenerated)
    for name in committed:
        assert committed[name] == regenerated[name], f"{name} differs from its regeneration"
    assert not any("pretrain" in name for name in committed)


def test_splits_never_share_an_item(splits):
    by_domain: dict[str, list[str]] = {}
    for key in splits:
        by_domain.setdefault(key.split("/")[0], []).append(key)
    for domain, keys in by_domain.items():
        ident = {k: micro.split_keys(k, splits[k]) for k in keys}
        for k in keys:
            assert len(ident[k]) == len(splits[k]), f"{k} repeats an item"
        for a, b in combinations(keys, 2):
            assert not ident[a] & ident[b], f"{a} and {b} share items"


def test_code_evaluation_is_held_out(splits):
    pretrain_families = {micro.code_family(p["task_id"]) for p in splits["code/pretrain"]}
    eval_families = {micro.code_family(p["task_id"]) for p in splits["code/evaluation"]}
    assert pretrain_families == set(micro.PRETRAIN_FAMILIES)
    assert len(eval_families - pretrain_families) >= 2
    never_pretrained = [p for p in splits["code/evaluation"] if micro.code_family(p["task_id"]) not in pretrain_families]
    assert len(never_pretrained) / len(splits["code/evaluation"]) >= 0.75
    # evaluation constants (the numbers that define a problem) never appear in training problems of that family
    def constants(prompt: str) -> tuple[str, ...]:
        return tuple(re.findall(r"\d+", prompt.split('"""')[1].split(">>>")[0]))

    for t in splits["code/train"]:
        assert micro.code_family_of_prompt(t["input"]) in {**micro.TARGET_FAMILIES, **micro.PRETRAIN_FAMILIES}
    for p in splits["code/evaluation"] + splits["code/pretrain"]:
        assert micro.code_family_of_prompt(p["prompt"]) == micro.code_family(p["task_id"])
    seen = {(micro.code_family_of_prompt(t["input"]), constants(t["input"])) for t in splits["code/train"]}
    seen |= {(micro.code_family(p["task_id"]), constants(p["prompt"])) for p in splits["code/pretrain"]}
    held_out = 0
    for p in splits["code/evaluation"]:
        key = (micro.code_family(p["task_id"]), constants(p["prompt"]))
        if key[0] in micro.TARGET_FAMILIES and key[1]:
            assert key not in seen, f"{p['task_id']} reuses training constants {key[1]}"
            held_out += 1
    assert held_out >= 60


def test_sizes(splits):
    assert len(splits["math/evaluation"]) >= 200 and len(splits["math/calibration"]) >= 200
    assert len(splits["commonsense/evaluation"]) >= 200 and len(splits["commonsense/calibration"]) >= 200
    assert len(splits["code/evaluation"]) >= 100
    assert len(splits["code/train"]) >= 500
    assert len({micro.code_family(p["task_id"]) for p in splits["code/evaluation"]}) >= 8
    assert len(micro.knowledge_facts()) >= 250
    assert len(micro.KNOWLEDGE) >= 10


_EXPR = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)")


def test_math_format_gsm8k(splits):
    for key in ("math/pretrain", "math/calibration", "math/evaluation"):
        for item in splits[key][:2000]:
            assert set(item) == {"question", "answer"}
            m = re.search(r"\n#### (\d+)$", item["answer"])
            assert m, item["answer"]
            exprs = _EXPR.findall(item["answer"])
            assert exprs
            for a, op, b, c in exprs:
                assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(c)
            assert exprs[-1][3] == m.group(1)
            assert item["question"].endswith("?")


def test_commonsense_format_csqa(splits):
    facts = {(s, a) for _, s, a in micro.knowledge_facts()}
    for key in ("commonsense/pretrain", "commonsense/calibration", "commonsense/evaluation"):
        for rec in splits[key]:
            assert set(rec) == {"answerKey", "id", "question"}
            q = rec["question"]
            assert set(q) == {"question_concept", "choices", "stem"}
            assert [c["label"] for c in q["choices"]] == ["A", "B", "C"]
            texts = [c["text"] for c in q["choices"]]
            assert len(set(texts)) == 3
            answer = texts[["A", "B", "C"].index(rec["answerKey"])]
            assert (q["question_concept"], answer) in facts
            assert q["question_concept"] in q["stem"]
            assert re.fullmatch(r"[0-9a-f]{40}", rec["id"])


def test_code_format_humaneval(splits):
    for key in ("code/pretrain", "code/evaluation"):
        for p in splits[key]:
            assert set(p) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
            assert p["prompt"].startswith(f"def {p['entry_point']}(")
            assert p["prompt"].endswith('    """\n')
            assert "def check(candidate):" in p["test"] and "assert candidate(" in p["test"]
            assert p["canonical_solution"].startswith("    ")
    for t in splits["code/train"]:
        assert set(t) == {"instruction", "input", "response"}
        assert t["instruction"] == micro.CODE_INSTRUCTION


_RUNNER = r"""
import json, sys
programs = json.load(sys.stdin)
failed = []
for name, program in programs:
    try:
        exec(compile(program, name, "exec"), {"__name__": "__check__"})
    except BaseException as exc:
        failed.append([name, repr(exc)])
print(json.dumps(failed))
"""


def _failures(programs: list[tuple[str, str]]) -> list:
    proc = subprocess.run([sys.executable, "-I", "-c", _RUNNER], input=json.dumps(programs), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _program(prompt: str, body: str, test: str, entry: str) -> str:
    return f"{prompt}{body}\n{test}\ncheck({entry})\n"


def test_canonical_solutions_pass_their_tests(splits):
    problems = [(p["task_id"], _program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]))
                for key in ("code/evaluation", "code/pretrain") for p in splits[key]]
    assert _failures(problems) == []
    # the instruction split's responses complete their inputs into working functions
    train = [(f"train/{i}", f"{t['input']}{t['response']}") for i, t in enumerate(splits["code/train"])]
    assert _failures(train) == []


def test_a_wrong_body_fails_every_evaluation_test(splits):
    wrong = [(p["task_id"], _program(p["prompt"], "    return None\n", p["test"], p["entry_point"]))
             for p in splits["code/evaluation"]]
    assert len(_failures(wrong)) == len(wrong)


def test_evaluation_programs_pass_through_the_quick_checker(splits):
    from experiments.micro.quick_eval import completions_pass

    problems = splits["code/evaluation"][::11]
    assert all(completions_pass(problems, [p["canonical_solution"] for p in problems]))
    assert not any(completions_pass(problems, ["    return -1\n"] * len(problems)))


def test_committed_files_load_through_the_project_loaders():
    loaders = pytest.importorskip("experiments.data.loaders")
    src = str(COMMITTED)
    math_items = loaders.load_math(f"{src}/math", "evaluation")
    assert len(math_items) >= 200 and math_items[0]["answer"].rstrip().split("\n")[-1].startswith("####")
    assert len(loaders.load_math(f"{src}/math", "calibration")) >= 200
    choice = loaders.load_choice(f"{src}/commonsense", "evaluation")
    assert len(choice) >= 200
    assert all(len(c["choices"]) == 3 and c["labels"] == ["A", "B", "C"] for c in choice)
    assert len(loaders.load_choice(f"{src}/commonsense", "calibration")) >= 200
    problems = loaders.load_code_problems(f"{src}/code", "evaluation")
    assert len(problems) >= 100 and problems[0]["task_id"].startswith("Micro/evaluation/")
    instructions = loaders.load_code_instructions(f"{src}/code", "train")
    assert len(instructions) >= 500 and instructions[0]["instruction"] == micro.CODE_INSTRUCTION
