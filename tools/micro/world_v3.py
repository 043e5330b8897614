"""The micro world v3: the v2 world's knowledge and code, with retained evaluation *near* and *far* from calibration
and a code test split no run of the v2 world read.

What stays the v2 world's (`tools.micro.world`): everything the backbone was pretrained on, the code
instruction-tuning split and the code dev split (`assets/micro/data/code/{train.json,dev.jsonl}`), and the rule that
keeps every evaluated math question's arithmetic out of pretraining (`_math_reserved`). What v3 draws anew:

- math: *near* kinds (`add`, `sub`, `together`, `add_sub`) with near verbs for calibration and the near dev/test
  splits; *far* kinds (`difference`, `sub_add`, `add_add`) with far verbs (`FAR_ADD_VERBS`, `FAR_SUB_VERBS`) for
  `dev_far` / `test_far`: templates and phrasings calibration never uses, all of them in pretraining.
- commonsense: *near* relations' facts split between calibration (half) and near dev / test (a quarter each), so a
  near item asks a fact calibration does not, in a template it does; the *far* relations (`FAR_RELATIONS`) are never
  in calibration: their facts (all stated in pretraining) are split between `dev_far` and `test_far`.
- code: a new test split (`Micro/v3test/<family>/<i>`), drawn in the v2 test split's held-out styles, with no
  problem of the v2 dev or test split (the v2 test split was read while the suite was designed).

No v3 dev or test item (math question, commonsense stem and choices, code prompt) is a v2 dev or test item;
`dedup_report_v3` counts what the splits share and `write` refuses a nonzero count where the design says 0:

    python -m tools.micro.world_v3 --out assets/micro/data_v3 [--floors]

`--floors` also measures the shipped backbone on every evaluated split (math exact match, choice accuracy, code
pass@1 in the sandbox) and stores them in GENERATOR.json.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Optional

from experiments.data import dedup
from tools.micro import world as v2

GENERATOR_VERSION = 3

NEAR_KINDS = ("add", "sub", "together", "add_sub")
FAR_KINDS = ("difference", "sub_add", "add_add")
FAR_ADD_VERBS = ("wins", "makes", "collects")
FAR_SUB_VERBS = ("drops", "gives", "trades")
NEAR_VERBS = tuple(v for v in v2.ADD_VERBS + v2.SUB_VERBS if v not in FAR_ADD_VERBS + FAR_SUB_VERBS)
FAR_RELATIONS = ("color", "sound", "eats", "workplace")
NEAR_RELATIONS = tuple(r for r in v2.KNOWLEDGE if r not in FAR_RELATIONS)

#: The evaluated retained splits: near (`dev`, `test`) and far (`dev_far`, `test_far`).
EVALUATED = ("dev", "test", "dev_far", "test_far")
RETAINED_SPLITS = ("calibration",) + EVALUATED
#: Where v3 reads what it shares with v2, relative to the repository (`REPO`).
V2_DATA = Path("assets/micro/data")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class V3Sizes:
    """How many items each v3 split holds (commonsense near/far splits take every fact and template they have, up to
    these sizes)."""

    math_calibration: int = 250
    math_near: int = 250
    math_far: int = 250
    commonsense_calibration: int = 250
    commonsense_near: int = 250
    commonsense_far: int = 250
    code_test_per_target_family: int = 12
    code_test_per_pretrain_family: int = 4


def _math_role(kind: str, verbs: tuple[str, ...]) -> Optional[str]:
    """`near`, `far`, or None for a problem that mixes near and far kinds or verbs (used by neither)."""
    if kind in NEAR_KINDS and all(v in NEAR_VERBS for v in verbs):
        return "near"
    if kind in FAR_KINDS and all(v in FAR_ADD_VERBS + FAR_SUB_VERBS for v in verbs):
        return "far"
    return None


def _math_splits(seed: int, sizes: V3Sizes, read: set[str]) -> dict[str, list[dict]]:
    """Math calibration, near dev/test and far dev/test; `read` holds the masked questions of v2's dev and test."""
    rng = random.Random(f"{seed}/math/v3")
    wanted = {"calibration": ("near", sizes.math_calibration), "dev": ("near", sizes.math_near),
              "test": ("near", sizes.math_near), "dev_far": ("far", sizes.math_far), "test_far": ("far", sizes.math_far)}
    out: dict[str, list[dict]] = {s: [] for s in wanted}
    seen = set(read)  # no two v3 items pose the same arithmetic, and none poses a read v2 item's
    order = list(wanted)
    turn = 0
    while any(len(out[s]) < n for s, (_, n) in wanted.items()):
        item, kind, verbs = v2.math_item_with_kind(rng)
        role = _math_role(kind, verbs)
        if role is None or not v2._math_reserved(item):
            continue
        key = v2.mask_text(item["question"])
        if key in seen:
            continue
        # The next split of this role that still needs items, in turn: the splits fill evenly from one stream.
        open_splits = [s for s in order if wanted[s][0] == role and len(out[s]) < wanted[s][1]]
        if not open_splits:
            continue
        split = open_splits[turn % len(open_splits)]
        turn += 1
        seen.add(key)
        out[split].append(item)
    return out


def fact_split_v3(rel: str, subj: str, ans: str) -> str:
    """The v3 split whose questions may ask a fact: near relations' facts go to calibration (half), `dev` or `test`
    (a quarter each); far relations' to `dev_far` or `test_far` (half each). A fact and its converse stay together."""
    key = tuple(sorted((subj, ans))) if rel == "opposite" else (subj,)
    h = v2._stable_hash("fact-split-v3", rel, key)
    if rel in FAR_RELATIONS:
        return ("dev_far", "test_far")[h % 2]
    return ("calibration", "calibration", "dev", "test")[h % 4]


def _commonsense_splits(seed: int, sizes: V3Sizes, read: set) -> dict[str, list[dict]]:
    """Commonsense splits in CommonsenseQA format; `read` holds v2 dev/test (stem, sorted choices) keys."""
    rng = random.Random(f"{seed}/commonsense/v3")
    facts = v2.knowledge_facts()
    answers: dict[str, list[str]] = {}
    for rel, _, ans in facts:
        if ans not in answers.setdefault(rel, []):
            answers[rel].append(ans)
    used = set(read)
    limits = {"calibration": sizes.commonsense_calibration, "dev": sizes.commonsense_near,
              "test": sizes.commonsense_near, "dev_far": sizes.commonsense_far, "test_far": sizes.commonsense_far}
    out: dict[str, list[dict]] = {}
    for split in ("test_far", "dev_far", "test", "dev", "calibration"):
        pairs = [(fact, t) for fact in facts if fact_split_v3(*fact) == split for t in v2.KNOWLEDGE[fact[0]][0]]
        rng.shuffle(pairs)
        items = []
        for (rel, subj, ans), template in pairs:
            if len(items) == limits[split]:
                break
            pool = [a for a in answers[rel] if a != ans and a != subj]
            for _ in range(50):
                choices = rng.sample(pool, 2) + [ans]
                rng.shuffle(choices)
                item = v2._csqa_item(rel, subj, ans, template, choices)
                key = v2._choice_key(item["question"]["stem"], choices)
                if key not in used:
                    used.add(key)
                    items.append(item)
                    break
        out[split] = items
    return out


def _code_test(seed: int, sizes: V3Sizes, earlier: set[str]) -> list[dict]:
    """A code test split in the v2 test styles, none of whose prompts is in `earlier` (v2's splits)."""
    rng = random.Random(f"{seed}/code/test/v3")
    seen = set(earlier)
    out = []
    for families, n in ((v2.TARGET_FAMILIES, sizes.code_test_per_target_family),
                        (v2.PRETRAIN_FAMILIES, sizes.code_test_per_pretrain_family)):
        for family in families:
            fam, got, tries = v2.CODE_FAMILIES[family], 0, 0
            while got < n:
                tries += 1
                if tries > 200 * n + 1000:
                    raise RuntimeError(f"code family {family}: cannot draw {n} new test problems")
                p = v2._make_problem(family, fam, rng, "test")
                if p is None:
                    continue
                item = v2._humaneval(f"Micro/v3test/{family}/{got}", p)
                if item["prompt"] in seen:
                    continue
                seen.add(item["prompt"])
                out.append(item)
                got += 1
    return out


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def earlier_world(root: Path = REPO / V2_DATA) -> dict[str, list[dict]]:
    """The v2 splits v3 keeps apart from or shares: `{domain}/{split}` for the shipped files under `root`."""
    out = {}
    for domain, names in (("math", ("calibration", "dev", "test")), ("commonsense", ("calibration", "dev", "test")),
                          ("code", ("dev", "test"))):
        for name in names:
            out[f"{domain}/{name}"] = _read_jsonl(root / domain / f"{name}.jsonl")
    out["code/train"] = json.loads((root / "code" / "train.json").read_text(encoding="utf-8"))
    return out


def generate(seed: int = v2.DEFAULT_SEED, sizes: V3Sizes = V3Sizes(), earlier: Optional[dict] = None) -> dict:
    """Every v3 split as {"<domain>/<split>": records}; `earlier` are the v2 splits (`earlier_world()` by default)."""
    earlier = earlier_world() if earlier is None else earlier
    read_math = {v2.mask_text(i["question"]) for s in ("dev", "test") for i in earlier[f"math/{s}"]}
    read_cs = {v2._choice_key(r["question"]["stem"], [c["text"] for c in r["question"]["choices"]])
               for s in ("dev", "test") for r in earlier[f"commonsense/{s}"]}
    code_seen = {p["prompt"] for s in ("dev", "test") for p in earlier[f"code/{s}"]}
    math = _math_splits(seed, sizes, read_math)
    cs = _commonsense_splits(seed, sizes, read_cs)
    out = {f"math/{s}": math[s] for s in RETAINED_SPLITS}
    out.update({f"commonsense/{s}": cs[s] for s in RETAINED_SPLITS})
    out["code/test"] = _code_test(seed, sizes, code_seen)
    return out


# ----------------------------------------------------------------------------------------------
# What the splits share
# ----------------------------------------------------------------------------------------------


def math_template(question: str) -> str:
    """A math question's template: its text with names, objects, verbs and numbers masked."""
    return v2.mask_text(question, numbers=True)


def _math_verbs(question: str) -> set[str]:
    """The world's verbs a question uses (multi-word verbs first, so `gives away` is not also `gives`)."""
    text, found = f" {question} ", set()
    for verb in sorted(v2.ADD_VERBS + v2.SUB_VERBS, key=len, reverse=True):
        if f" {verb} " in text:
            found.add(verb)
            text = text.replace(f" {verb} ", " ")
    return found


def _relation(rec: dict) -> str:
    stem, subj = rec["question"]["stem"], rec["question"]["question_concept"]
    for rel, (templates, _) in v2.KNOWLEDGE.items():
        for t in templates:
            art = v2._article(subj)
            if t.format(s=subj, a=art, A=art.capitalize()) == stem:
                return rel
    raise ValueError(f"no relation template renders {stem!r}")


def cs_template(rec: dict) -> str:
    """A commonsense question's template: its stem with the subject (and its article) masked."""
    q = rec["question"]
    subj = q["question_concept"]
    return q["stem"].replace(f"{v2._article(subj)} {subj}", "<a> <s>").replace(
        f"{v2._article(subj).capitalize()} {subj}", "<A> <s>").replace(subj, "<s>")


def _cs_item(rec: dict) -> str:
    """A commonsense item's identity (its stem and choice set, `world.split_keys`) as text."""
    return str(v2.split_keys("commonsense", [rec]).pop())


def _fact(rec: dict) -> str:
    return f"{_relation(rec)}|{rec['question']['question_concept']}|{v2._csqa_answer(rec)}"


def dedup_report_v3(splits: dict, earlier: dict) -> dict:
    """What the v3 splits share, and what they share with the v2 dev and test splits.

    - `exact`: per domain and split pair, shared items (math: questions; also up to names/objects/verbs = the same
      arithmetic; commonsense: stems with their choice sets, and facts; code: prompts) - 0 everywhere by design.
    - `calibration_vs`: per evaluated split, the templates, facts (commonsense), relations and verbs (math) it shares
      with calibration: 0 for far splits by design, the near splits share templates (that is what near means).
    - `earlier_read`: per v3 evaluated split, the items, masked questions / facts and templates it shares with v2's dev
      and test splits: items 0 by design; templates and facts are reported (a small world has few).
    - `code`: the v2 report's code counts with the v3 test split (train, dev, test pairwise; 0 by design).
    """
    report: dict = {"threshold": dedup.NEAR_DUPLICATE_THRESHOLD, "exact": {}, "calibration_vs": {},
                    "earlier_read": {}}
    for domain in ("math", "commonsense"):
        for x, y in combinations(RETAINED_SPLITS, 2):
            a, b = splits[f"{domain}/{x}"], splits[f"{domain}/{y}"]
            if domain == "math":
                counts = {"questions": dedup.shared((i["question"] for i in a), (i["question"] for i in b)),
                          "arithmetic": dedup.shared((v2.mask_text(i["question"]) for i in a),
                                                     (v2.mask_text(i["question"]) for i in b))}
            else:
                counts = {"items": dedup.shared((_cs_item(r) for r in a),
                                                (_cs_item(r) for r in b)),
                          "facts": dedup.shared(map(_fact, a), map(_fact, b))}
            report["exact"][f"{domain} {x}|{y}"] = counts
    cal_math, cal_cs = splits["math/calibration"], splits["commonsense/calibration"]
    cal_verbs = set().union(*(_math_verbs(i["question"]) for i in cal_math))
    for split in EVALUATED:
        items = splits[f"math/{split}"]
        report["calibration_vs"][f"math {split}"] = {
            "templates": dedup.shared((math_template(i["question"]) for i in items),
                                      (math_template(i["question"]) for i in cal_math)),
            "items_with_a_calibration_template": sum(
                math_template(i["question"]) in {math_template(c["question"]) for c in cal_math} for i in items),
            "verbs": len(set().union(*(_math_verbs(i["question"]) for i in items)) & cal_verbs),
        }
        recs = splits[f"commonsense/{split}"]
        cal_templates = {cs_template(c) for c in cal_cs}
        report["calibration_vs"][f"commonsense {split}"] = {
            "templates": dedup.shared(map(cs_template, recs), map(cs_template, cal_cs)),
            "items_with_a_calibration_template": sum(cs_template(r) in cal_templates for r in recs),
            "facts": dedup.shared(map(_fact, recs), map(_fact, cal_cs)),
            "relations": len({_relation(r) for r in recs} & {_relation(c) for c in cal_cs}),
        }
    read_math = earlier["math/dev"] + earlier["math/test"]
    read_cs = earlier["commonsense/dev"] + earlier["commonsense/test"]
    for split in EVALUATED:
        items, recs = splits[f"math/{split}"], splits[f"commonsense/{split}"]
        report["earlier_read"][f"math {split}"] = {
            "questions": dedup.shared((i["question"] for i in items), (i["question"] for i in read_math)),
            "arithmetic": dedup.shared((v2.mask_text(i["question"]) for i in items),
                                       (v2.mask_text(i["question"]) for i in read_math)),
            "templates": dedup.shared((math_template(i["question"]) for i in items),
                                      (math_template(i["question"]) for i in read_math)),
        }
        report["earlier_read"][f"commonsense {split}"] = {
            "items": dedup.shared((_cs_item(r) for r in recs),
                                  (_cs_item(r) for r in read_cs)),
            "facts": dedup.shared(map(_fact, recs), map(_fact, read_cs)),
        }
    report["earlier_read"]["code test"] = {
        "prompts": dedup.shared((p["prompt"] for p in splits["code/test"]),
                                (p["prompt"] for p in earlier["code/dev"] + earlier["code/test"])),
    }
    code = v2.dedup_report({"code/train": earlier["code/train"], "code/dev": earlier["code/dev"],
                            "code/test": splits["code/test"], "math/calibration": [], "commonsense/calibration": [],
                            "commonsense/dev": [], "commonsense/test": []})["code"]
    report["code"] = code
    return report


def dedup_violations_v3(report: dict) -> list[str]:
    """Every count the design requires to be 0 that is not, as `section key count = n`."""
    out = [f"exact {k} {c} = {n}" for k, counts in report["exact"].items() for c, n in counts.items() if n]
    for key, counts in report["calibration_vs"].items():
        if "_far" in key:
            out += [f"calibration_vs {key} {c} = {n}" for c, n in counts.items() if n]
        elif counts.get("facts"):
            out.append(f"calibration_vs {key} facts = {counts['facts']}")
    for key, counts in report["earlier_read"].items():
        for c in ("questions", "arithmetic", "items", "prompts"):
            if counts.get(c):
                out.append(f"earlier_read {key} {c} = {counts[c]}")
    out += [f"code {pair} {k} = {v}" for pair, counts in report["code"].items() for k, v in counts.items()
            if k != "docstrings_max_similarity" and v]
    return out


def format_report(report: dict) -> str:
    """The report as aligned text lines."""
    lines = [f"micro world v3: what the splits share (near-duplicate threshold {report['threshold']})"]
    for section in ("exact", "calibration_vs", "earlier_read", "code"):
        for key, counts in report[section].items():
            lines.append(f"  {section:<15} {key:<28} " + "  ".join(f"{k}={v}" for k, v in counts.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Floors and writing
# ----------------------------------------------------------------------------------------------


def floors(data_dir: Path, backbone: Path = REPO / "assets" / "micro" / "backbone") -> dict:
    """The shipped backbone on every evaluated v3 split: math exact match and choice accuracy per near/far split,
    code pass@1 on the code dev (v2's) and v3 test splits (greedy, checked in the sandbox)."""
    # here, not at the top: generating the splits needs neither a model nor the sandbox
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tools.micro import quick_eval as Q

    tok = AutoTokenizer.from_pretrained(str(backbone))
    model = AutoModelForCausalLM.from_pretrained(str(backbone)).eval()
    out: dict = {}
    for split in EVALUATED:
        m = Q.math_exact_match(model, tok, _read_jsonl(data_dir / "math" / f"{split}.jsonl"))
        c = Q.choice_accuracy(model, tok, [Q.csqa_to_choice(r) for r in
                                           _read_jsonl(data_dir / "commonsense" / f"{split}.jsonl")])
        out[f"math/{split}"] = {"exact_match": round(m["exact_match"], 4), "n": m["n"]}
        out[f"commonsense/{split}"] = {"accuracy": round(c["accuracy"], 4), "n": c["n"]}
    for name, path in (("code/dev", REPO / V2_DATA / "code" / "dev.jsonl"), ("code/test", data_dir / "code" / "test.jsonl")):
        r = Q.code_pass_at_1(model, tok, _read_jsonl(path))
        out[name] = {"pass@1": round(r["pass@1"], 4), "n": r["n"]}
    return out


def write(out_dir: str | Path, seed: int = v2.DEFAULT_SEED, sizes: V3Sizes = V3Sizes(),
          with_floors: bool = False) -> dict[str, Path]:
    """Generate the v3 splits, check what they share and write them under `out_dir` with GENERATOR.json (sizes,
    counts, the sharing report, and the backbone's floors with `with_floors`). Raises `RuntimeError`, writing
    nothing, when a count the design requires to be 0 is not."""
    out_dir = Path(out_dir)
    earlier = earlier_world()
    splits = generate(seed, sizes, earlier)
    report = dedup_report_v3(splits, earlier)
    problems = dedup_violations_v3(report)
    if problems:
        raise RuntimeError("the micro v3 splits share what they must not: " + "; ".join(problems))
    paths = {}
    for key, records in splits.items():
        path = out_dir / f"{key}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        paths[key] = path
    meta = {
        "generator": "tools.micro.world_v3", "version": GENERATOR_VERSION, "seed": seed, "sizes": asdict(sizes),
        "shared_with_v2": {"code/train": str(V2_DATA / "code" / "train.json"),
                           "code/dev": str(V2_DATA / "code" / "dev.jsonl"), "backbone": "assets/micro/backbone"},
        "near": {"math_kinds": list(NEAR_KINDS), "math_verbs": list(NEAR_VERBS), "relations": list(NEAR_RELATIONS)},
        "far": {"math_kinds": list(FAR_KINDS), "math_verbs": list(FAR_ADD_VERBS + FAR_SUB_VERBS),
                "relations": list(FAR_RELATIONS)},
        "counts": {k: len(v) for k, v in splits.items()},
        "dedup": report,
    }
    if with_floors:
        meta["floors"] = floors(out_dir)
    (out_dir / "GENERATOR.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return paths


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=v2.DEFAULT_SEED)
    ap.add_argument("--floors", action="store_true", help="also measure the shipped backbone on every evaluated split")
    args = ap.parse_args(argv)
    paths = write(args.out, args.seed, with_floors=args.floors)
    meta = json.loads((Path(args.out) / "GENERATOR.json").read_text(encoding="utf-8"))
    for key, path in paths.items():
        print(f"{key}: {path} ({meta['counts'][key]} items)")
    print(format_report(meta["dedup"]))
    for key, value in (meta.get("floors") or {}).items():
        print(f"floor {key}: {value}")


if __name__ == "__main__":
    main()
