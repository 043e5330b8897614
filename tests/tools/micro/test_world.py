"""The micro benchmark generator: determinism, committed files, disjoint and deduplicated splits, sizes, formats."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields
from itertools import combinations
from pathlib import Path

import pytest

from experiments.data import dedup
from tools.micro import world as micro

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "assets" / "micro" / "data"


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return micro.generate(micro.DEFAULT_SEED, micro.MicroSizes())


def _read_all(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_same_seed_gives_byte_identical_files(tmp_path):
    a = _read_all(Path(micro.write(tmp_path / "a", 3, micro.TINY_SIZES)["math/test"]).parents[1])
    b = _read_all(Path(micro.write(tmp_path / "b", 3, micro.TINY_SIZES)["math/test"]).parents[1])
    assert a == b
    assert "math/pretrain.jsonl" in a and "code/train.json" in a and "code/dev.jsonl" in a
    c = _read_all(Path(micro.write(tmp_path / "c", 4, micro.TINY_SIZES)["math/test"]).parents[1])
    assert c["math/test.jsonl"] != a["math/test.jsonl"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_dedup_report_is_zero_and_committed(splits):
    """The acceptance check: no exact or near-duplicate item in two splits, at the stated threshold."""
    report = micro.dedup_report(splits)
    assert report["threshold"] == dedup.NEAR_DUPLICATE_THRESHOLD == 0.8
    assert micro.dedup_violations(report) == []
    assert set(report["code"]) == {"train|dev", "train|test", "dev|test"}
    assert {"calibration|dev", "calibration|test", "dev|test", "test|pretrain"} <= set(report["math"])
    assert set(report["commonsense"]) == {"calibration|dev", "calibration|test", "dev|test"}
    for counts in report["code"].values():
        assert counts["docstrings_max_similarity"] < report["threshold"]
    committed = json.loads((COMMITTED / "GENERATOR.json").read_text())["dedup"]
    assert committed == json.loads(json.dumps(report))


def _leaky(splits: dict, **changes) -> dict:
    out = {k: list(v) for k, v in splits.items()}
    for key, extra in changes.items():
        out[key.replace("__", "/")] = out[key.replace("__", "/")] + extra
    return out


@pytest.mark.slow
def test_dedup_report_catches_copies_and_renamed_copies(splits):
    train = splits["code/train"][0]
    copy = {"task_id": "Micro/test/leak/0", "prompt": train["input"], "canonical_solution": train["response"],
            "test": "", "entry_point": "x"}
    leak = micro.dedup_report(_leaky(splits, code__test=[copy]))["code"]["train|test"]
    assert leak["bodies_exact"] >= 1 and leak["docstrings_exact"] >= 1 and leak["function_names"] >= 1
    # the same problem with other names, person, object and numbers is still a near-duplicate
    fam = micro.TARGET_FAMILIES["add_more"]
    doc = fam.docs["train"][0].format(N="Kai", M="Ava", O="kites", x="amount", add="finds", k=99)
    renamed = {"task_id": "Micro/test/leak/1", "canonical_solution": "    return amount + 99\n", "test": "",
               "entry_point": "f", "prompt": f'def f(amount: int) -> int:\n    """{doc}\n    """\n'}
    leak = micro.dedup_report(_leaky(splits, code__test=[renamed]))["code"]["train|test"]
    assert leak["bodies_exact"] == 0 and leak["bodies_near"] >= 1
    assert leak["docstrings_exact"] == 0 and leak["docstrings_near"] >= 1
    # math: a calibration question with another name is the same arithmetic; commonsense: the same stem
    m = dict(splits["math/calibration"][0])
    name = next(n for n in micro.NAMES if n in m["question"])
    other = next(n for n in micro.NAMES if n not in m["question"])
    m["question"] = m["question"].replace(name, other)
    cs = splits["commonsense/calibration"][0]
    report = micro.dedup_report(_leaky(splits, math__test=[m], commonsense__test=[cs]))
    assert report["math"]["calibration|test"]["questions_near"] == 1
    assert report["math"]["calibration|test"]["questions_exact"] == 0
    assert report["commonsense"]["calibration|test"] == {"questions_exact": 1, "questions_normalised": 1, "facts": 1}


@pytest.mark.slow
def test_write_refuses_splits_that_share_items(tmp_path, monkeypatch, splits):
    leaky = _leaky(splits, math__dev=[splits["math/test"][0]])
    monkeypatch.setattr(micro, "generate", lambda seed, sizes: leaky)
    with pytest.raises(RuntimeError, match="math calibration|math dev\\|test questions_exact = 1"):
        micro.write(tmp_path, 0, micro.MicroSizes())
    assert not any(tmp_path.iterdir())


def test_code_dev_and_test_are_held_out_by_style(splits):
    pretrain_families = {micro.code_family(p["task_id"]) for p in splits["code/pretrain"]}
    assert pretrain_families == set(micro.PRETRAIN_FAMILIES)
    for split in ("dev", "test"):
        families = [micro.code_family(p["task_id"]) for p in splits[f"code/{split}"]]
        assert set(families) == set(micro.CODE_FAMILIES)
        assert sum(f in micro.TARGET_FAMILIES for f in families) / len(families) >= 0.9
    # every style option of a family is in exactly one split, and no person, object or word is shared
    for name, fam in micro.CODE_FAMILIES.items():
        for part in ("docs", "bodies", "fnames"):
            options = getattr(fam, part)
            assert set(options) == set(micro.CODE_SPLITS), (name, part)
            for x, y in combinations(micro.CODE_SPLITS, 2):
                assert not set(options[x]) & set(options[y]), f"{name}: {part} shared by {x} and {y}"
    for pool in (micro.CODE_NAMES, micro.CODE_OBJECTS, micro.CODE_WORDS):
        for x, y in combinations(micro.CODE_SPLITS, 2):
            assert not set(pool[x]) & set(pool[y])
    # held-out constants: a dev or test problem's constants never define a training problem of its family
    def constants(prompt: str) -> tuple[str, ...]:
        return tuple(re.findall(r"\d+", prompt.split('"""')[1].split(">>>")[0]))

    for t in splits["code/train"]:
        assert micro.code_family_of_prompt(t["input"]) in micro.CODE_FAMILIES
    for p in splits["code/dev"] + splits["code/test"] + splits["code/pretrain"]:
        assert micro.code_family_of_prompt(p["prompt"]) == micro.code_family(p["task_id"])
    seen = {(micro.code_family_of_prompt(t["input"]), constants(t["input"])) for t in splits["code/train"]}
    seen |= {(micro.code_family(p["task_id"]), constants(p["prompt"])) for p in splits["code/pretrain"]}
    held = 0
    for p in splits["code/dev"] + splits["code/test"]:
        key = (micro.code_family(p["task_id"]), constants(p["prompt"]))
        if key[0] in micro.TARGET_FAMILIES and micro.CODE_FAMILIES[key[0]].held_out and key[1]:
            assert key not in seen, f"{p['task_id']} reuses training constants {key[1]}"
            held += 1
    assert held >= 150


def test_sizes(splits):
    for split in ("calibration", "dev", "test"):
        assert len(splits[f"math/{split}"]) == 250 and len(splits[f"commonsense/{split}"]) == 250
    assert len(splits["code/dev"]) == len(splits["code/test"]) == 132
    assert len(splits["code/train"]) >= 500
    assert len(micro.knowledge_facts()) >= 250
    assert len(micro.KNOWLEDGE) >= 10


_EXPR = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)")


def test_math_format_gsm8k(splits):
    for key in ("math/pretrain", "math/calibration", "math/dev", "math/test"):
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
    for key in ("commonsense/pretrain", "commonsense/calibration", "commonsense/dev", "commonsense/test"):
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
    for key in ("code/pretrain", "code/dev", "code/test"):
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


@pytest.mark.slow
def test_canonical_solutions_pass_their_tests(splits):
    problems = [(p["task_id"], _program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]))
                for key in ("code/dev", "code/test", "code/pretrain") for p in splits[key]]
    assert _failures(problems) == []
    # the instruction split's responses complete their inputs into working functions
    train = [(f"train/{i}", f"{t['input']}{t['response']}") for i, t in enumerate(splits["code/train"])]
    assert _failures(train) == []


@pytest.mark.slow
def test_a_wrong_body_fails_every_evaluation_test(splits):
    wrong = [(p["task_id"], _program(p["prompt"], "    return None\n", p["test"], p["entry_point"]))
             for key in ("code/dev", "code/test") for p in splits[key]]
    assert len(_failures(wrong)) == len(wrong)


@pytest.mark.sandbox
def test_evaluation_programs_pass_through_the_quick_checker(splits):
    from tools.micro.quick_eval import completions_pass

    problems = splits["code/test"][::11]
    assert all(completions_pass(problems, [p["canonical_solution"] for p in problems]))
    assert not any(completions_pass(problems, ["    return -1\n"] * len(problems)))


def test_committed_files_load_through_the_project_loaders():
    loaders = pytest.importorskip("experiments.data.loaders")
    src = str(COMMITTED)
    for split in ("calibration", "dev", "test"):
        math_items = loaders.load_math(f"{src}/math", split)
        assert len(math_items) == 250 and math_items[0]["answer"].rstrip().split("\n")[-1].startswith("####")
        choice = loaders.load_choice(f"{src}/commonsense", split)
        assert len(choice) == 250
        assert all(len(c["choices"]) == 3 and c["labels"] == ["A", "B", "C"] for c in choice)
    for split in ("dev", "test"):
        problems = loaders.load_code_problems(f"{src}/code", split)
        assert len(problems) == 132 and problems[0]["task_id"].startswith(f"Micro/{split}/")
    instructions = loaders.load_code_instructions(f"{src}/code", "train")
    assert len(instructions) >= 500 and instructions[0]["instruction"] == micro.CODE_INSTRUCTION
