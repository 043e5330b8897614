"""The embedded micro benchmark: a small seeded world written in the formats of the real datasets.

Three domains, generated from one seed (same seed and sizes => byte-identical files):

- math (retained): GSM8K-format word problems with one or two + / - operations on small numbers;
  the reasoning is written as expressions (`12 + 5 = 17`) and ends in a line `#### N`.
- commonsense (retained): CommonsenseQA-format questions with three choices, rendered from the
  knowledge base below (11 relations, ~300 facts); distractors come from the same relation.
- code (target): HumanEval-format problems from 13 families. Three *pretrain families* (string and
  list utilities) appear in pretraining. The ten *target families* never do: they are learnt only
  from the instruction-tuning split. Their docstrings are phrased like the math word problems
  (same names, objects, verbs, numbers), so learning them moves the model where math lives.

Splits (no item is in two splits; see `split_keys`):

    math/{pretrain,calibration,evaluation}.jsonl
    commonsense/{pretrain,calibration,evaluation}.jsonl
    code/{pretrain,evaluation}.jsonl        HumanEval format
    code/train.json                         instruction list {instruction, input, response}

Code evaluation problems use held-out parameters: for every family with constants, a fixed fifth
of the constant tuples is reserved for evaluation and never appears in pretraining or training.
Commonsense evaluation and calibration questions test facts that pretraining states, asked with a
choice set that pretraining never pairs with that question.

    python -m experiments.data.micro --out DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from experiments.prompts import CODE_INSTRUCTION

GENERATOR_VERSION = 1
DEFAULT_SEED = 0


@dataclass(frozen=True)
class MicroSizes:
    """How many items each split holds."""

    math_pretrain: int = 60000
    math_calibration: int = 250
    math_evaluation: int = 250
    commonsense_pretrain_per_fact: int = 12
    commonsense_calibration: int = 250
    commonsense_evaluation: int = 250
    code_pretrain_per_family: int = 700
    code_train_per_target_family: int = 110
    code_train_per_pretrain_family: int = 30
    code_evaluation_per_target_family: int = 12
    code_evaluation_per_pretrain_family: int = 4


TINY_SIZES = MicroSizes(
    math_pretrain=400,
    commonsense_pretrain_per_fact=2,
    code_pretrain_per_family=40,
)

# ----------------------------------------------------------------------------------------------
# Shared vocabulary of the world (math problems and code docstrings draw from the same lists)
# ----------------------------------------------------------------------------------------------

NAMES = [
    "Tom", "Mia", "Sam", "Ana", "Ben", "Lily", "Max", "Emma", "Leo", "Zoe", "Jack", "Nina",
    "Omar", "Ella", "Finn", "Ruby", "Adam", "Sara", "Ivan", "Lucy", "Noah", "Grace", "Eli", "Maya",
    "Owen", "Ava", "Luke", "Rosa", "Kai", "Jade",
]
OBJECTS = [
    "apples", "pencils", "marbles", "stickers", "cookies", "books", "cards", "coins", "shells",
    "stamps", "toys", "eggs", "flowers", "balloons", "candies", "crayons", "buttons", "rocks",
    "beads", "blocks", "cupcakes", "oranges", "pens", "ribbons", "lemons", "shirts", "kites",
    "cars", "nuts", "plums",
]
ADD_VERBS = ["buys", "finds", "gets", "picks up", "receives", "wins", "makes", "collects"]
SUB_VERBS = ["gives away", "eats", "loses", "sells", "uses", "drops", "gives", "trades"]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _stable_hash(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


# ----------------------------------------------------------------------------------------------
# Math (GSM8K format)
# ----------------------------------------------------------------------------------------------


def _math_item(rng: random.Random) -> dict:
    a_name, b_name = rng.sample(NAMES, 2)
    obj = rng.choice(OBJECTS)
    kind = rng.choices(
        ["add", "sub", "together", "difference", "add_sub", "sub_add", "add_add"],
        weights=[2, 2, 1.5, 1.5, 1, 1, 1],
    )[0]
    if kind == "add":
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        verb = rng.choice(ADD_VERBS)
        q = f"{a_name} has {a} {obj}. {a_name} {verb} {b} more {obj}. How many {obj} does {a_name} have now?"
        c = a + b
        ans = f"{a_name} has {a} + {b} = {c} {obj} now.\n#### {c}"
    elif kind == "sub":
        a = rng.randint(0, 50)
        b = rng.randint(0, a)
        verb = rng.choice(SUB_VERBS)
        q = f"{a_name} has {a} {obj}. {a_name} {verb} {b} of them. How many {obj} does {a_name} have left?"
        c = a - b
        ans = f"{a_name} has {a} - {b} = {c} {obj} left.\n#### {c}"
    elif kind == "together":
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        q = f"{a_name} has {a} {obj} and {b_name} has {b} {obj}. How many {obj} do they have together?"
        c = a + b
        ans = f"They have {a} + {b} = {c} {obj} together.\n#### {c}"
    elif kind == "difference":
        a = rng.randint(0, 50)
        b = rng.randint(0, a)
        q = f"{a_name} has {a} {obj} and {b_name} has {b} {obj}. How many more {obj} does {a_name} have than {b_name}?"
        c = a - b
        ans = f"{a_name} has {a} - {b} = {c} more {obj}.\n#### {c}"
    else:
        a = rng.randint(0, 40)
        if kind == "add_sub":
            b = rng.randint(0, 30)
            c = rng.randint(0, a + b)
            mid, end = a + b, a + b - c
            v1, v2 = rng.choice(ADD_VERBS), rng.choice(SUB_VERBS)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} more {obj} and then {v2} {c} of them. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} + {b} = {mid} {obj}.\nThen {a_name} has {mid} - {c} = {end} {obj}.\n#### {end}"
        elif kind == "sub_add":
            b = rng.randint(0, a)
            c = rng.randint(0, 30)
            mid, end = a - b, a - b + c
            v1, v2 = rng.choice(SUB_VERBS), rng.choice(ADD_VERBS)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} of them and then {v2} {c} more {obj}. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} - {b} = {mid} {obj}.\nThen {a_name} has {mid} + {c} = {end} {obj}.\n#### {end}"
        else:
            b, c = rng.randint(0, 30), rng.randint(0, 30)
            mid, end = a + b, a + b + c
            v1, v2 = rng.sample(ADD_VERBS, 2)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} more {obj} and then {v2} {c} more {obj}. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} + {b} = {mid} {obj}.\nThen {a_name} has {mid} + {c} = {end} {obj}.\n#### {end}"
    return {"question": q, "answer": ans}


def _math_splits(seed: int, sizes: MicroSizes) -> dict[str, list[dict]]:
    rng = random.Random(f"{seed}/math")
    seen: set[str] = set()
    out: dict[str, list[dict]] = {}
    for split, n in (("evaluation", sizes.math_evaluation), ("calibration", sizes.math_calibration),
                     ("pretrain", sizes.math_pretrain)):
        items = []
        while len(items) < n:
            item = _math_item(rng)
            if item["question"] in seen:
                continue
            seen.add(item["question"])
            items.append(item)
        out[split] = items
    return out


# ----------------------------------------------------------------------------------------------
# Commonsense (CommonsenseQA format) from a knowledge base
# ----------------------------------------------------------------------------------------------

# relation -> (question templates with {s} = subject and {a} = its article, facts "subject:answer")
KNOWLEDGE: dict[str, tuple[list[str], str]] = {
    "location": (
        ["Where would you usually find {a} {s}?", "Where is {a} {s} usually kept?",
         "In which place do people often see {a} {s}?"],
        "bed:bedroom pillow:bedroom blanket:bedroom wardrobe:bedroom stove:kitchen fridge:kitchen "
        "oven:kitchen kettle:kitchen toothbrush:bathroom towel:bathroom bathtub:bathroom "
        "shower:bathroom lawnmower:garage toolbox:garage ladder:garage bookshelf:library "
        "librarian:library dictionary:library blackboard:classroom desk:classroom "
        "nurse:hospital stretcher:hospital tractor:farm barn:farm scarecrow:farm whale:ocean "
        "shark:ocean deer:forest owl:forest pilot:airport suitcase:airport giraffe:zoo "
        "swing:park slide:park",
    ),
    "used_for": (
        ["What is {a} {s} used for?", "Why would someone use {a} {s}?",
         "What do people do with {a} {s}?"],
        "knife:cutting scissors:cutting saw:cutting pen:writing pencil:writing chalk:writing "
        "broom:cleaning mop:cleaning sponge:cleaning pan:cooking pot:cooking chair:sitting "
        "bench:sitting stool:sitting cup:drinking mug:drinking straw:drinking clock:telling_time "
        "watch:telling_time shovel:digging spade:digging basket:carrying bag:carrying "
        "lamp:lighting candle:lighting flashlight:lighting brush:painting easel:painting "
        "umbrella:staying_dry raincoat:staying_dry key:opening_doors",
    ),
    "made_of": (
        ["What is {a} {s} usually made of?", "What material is {a} {s} made from?",
         "{A} {s} is mostly made of what?"],
        "table:wood door:wood fence:wood pencil:wood window:glass bottle:glass mirror:glass "
        "jar:glass coin:metal spoon:metal nail:metal fork:metal newspaper:paper envelope:paper "
        "notebook:paper napkin:paper shirt:cotton sock:cotton towel:cotton sweater:wool "
        "scarf:wool mitten:wool tire:rubber eraser:rubber boot:rubber belt:leather "
        "wallet:leather saddle:leather brick:clay vase:clay",
    ),
    "category": (
        ["What kind of thing is {a} {s}?", "{A} {s} is a type of what?",
         "Which group does {a} {s} belong to?"],
        "apple:fruit banana:fruit grape:fruit cherry:fruit peach:fruit carrot:vegetable "
        "potato:vegetable onion:vegetable pea:vegetable lettuce:vegetable bus:vehicle "
        "truck:vehicle train:vehicle van:vehicle piano:instrument guitar:instrument "
        "drum:instrument violin:instrument flute:instrument robin:bird eagle:bird parrot:bird "
        "sparrow:bird rose:flower tulip:flower daisy:flower lily:flower oak:tree pine:tree "
        "maple:tree willow:tree",
    ),
    "color": (
        ["What color is {a} {s} usually?", "What color do you expect {a} {s} to be?",
         "Most of the time, what color is {a} {s}?"],
        "banana:yellow lemon:yellow sunflower:yellow canary:yellow strawberry:red tomato:red "
        "cherry:red ladybug:red carrot:orange pumpkin:orange tangerine:orange leaf:green "
        "frog:green cucumber:green lime:green crow:black raven:black tire:black cloud:white "
        "snowman:white swan:white egg:white plum:purple grape:purple eggplant:purple "
        "coconut:brown acorn:brown",
    ),
    "sound": (
        ["What sound does {a} {s} make?", "What noise do you hear from {a} {s}?",
         "Which sound comes from {a} {s}?"],
        "dog:bark cat:meow cow:moo sheep:baa duck:quack lion:roar snake:hiss bee:buzz owl:hoot "
        "horse:neigh pig:oink mouse:squeak frog:croak wolf:howl rooster:crow bell:ring "
        "drum:boom clock:tick whistle:tweet",
    ),
    "moves": (
        ["How does {a} {s} usually move?", "What does {a} {s} do to get around?",
         "How does {a} {s} get from place to place?"],
        "fish:swim shark:swim dolphin:swim seal:swim eagle:fly bat:fly butterfly:fly "
        "sparrow:fly kangaroo:hop rabbit:hop grasshopper:hop toad:hop snail:crawl worm:crawl "
        "caterpillar:crawl baby:crawl horse:gallop pony:gallop zebra:gallop snake:slither "
        "eel:slither penguin:waddle goose:waddle",
    ),
    "part_of": (
        ["{A} {s} is part of what?", "What has {a} {s} as one of its parts?",
         "Where would you find {a} {s} attached?"],
        "wheel:car bumper:car steering_wheel:car leaf:tree branch:tree trunk:tree root:tree "
        "page:book cover:book chapter:book petal:flower stem:flower finger:hand thumb:hand "
        "palm:hand toe:foot heel:foot roof:house chimney:house porch:house lens:camera "
        "flash:camera sail:boat anchor:boat feather:bird beak:bird",
    ),
    "opposite": (
        ["What is the opposite of {s}?", "Which word means the opposite of {s}?",
         "If something is not {s}, it may be what?"],
        "hot:cold cold:hot big:small small:big fast:slow slow:fast happy:sad sad:happy "
        "wet:dry dry:wet full:empty empty:full early:late late:early loud:quiet quiet:loud "
        "hard:soft soft:hard high:low low:high light:heavy heavy:light old:young young:old "
        "open:closed closed:open",
    ),
    "eats": (
        ["What does {a} {s} like to eat?", "What food does {a} {s} eat?",
         "What would you feed {a} {s}?"],
        "cow:grass sheep:grass goat:grass rabbit:carrots monkey:bananas cat:fish seal:fish "
        "penguin:fish dog:bones bird:seeds parrot:seeds bee:nectar butterfly:nectar panda:bamboo "
        "mouse:cheese squirrel:nuts chipmunk:nuts koala:leaves giraffe:leaves horse:hay "
        "donkey:hay chicken:corn bear:honey frog:flies lizard:flies",
    ),
    "workplace": (
        ["Where does {a} {s} work?", "Where would you meet {a} {s} at work?",
         "Which place is {a} {s} likely to work in?"],
        "doctor:hospital surgeon:hospital teacher:school principal:school chef:restaurant "
        "waiter:restaurant farmer:farm baker:bakery banker:bank cashier:bank "
        "firefighter:fire_station judge:court lawyer:court lifeguard:beach mechanic:garage "
        "actor:theater astronaut:space_station miner:mine sailor:ship captain:ship "
        "pharmacist:pharmacy",
    ),
}


def knowledge_facts() -> list[tuple[str, str, str]]:
    """All (relation, subject, answer) facts of the knowledge base."""
    facts = []
    for rel, (_, spec) in KNOWLEDGE.items():
        for pair in _split_facts(spec):
            facts.append((rel, pair[0], pair[1]))
    return facts


def _split_facts(spec: str) -> list[tuple[str, str]]:
    # facts are "subject:answer" separated by spaces; "_" stands for a space inside a word group
    pairs = []
    for chunk in spec.split():
        subj, ans = chunk.split(":")
        pairs.append((subj.replace("_", " "), ans.replace("_", " ")))
    return pairs


def _choice_key(stem: str, choices: list[str]) -> tuple[str, tuple[str, ...]]:
    return stem, tuple(sorted(choices))


def _csqa_item(rel: str, subj: str, ans: str, template: str, choices: list[str]) -> dict:
    art = _article(subj)
    stem = template.format(s=subj, a=art, A=art.capitalize())
    labels = ["A", "B", "C"]
    ident = hashlib.sha1(f"{stem}|{'|'.join(choices)}".encode()).hexdigest()
    return {
        "answerKey": labels[choices.index(ans)],
        "id": ident,
        "question": {
            "question_concept": subj,
            "choices": [{"label": lab, "text": t} for lab, t in zip(labels, choices)],
            "stem": stem,
        },
    }


def _commonsense_splits(seed: int, sizes: MicroSizes) -> dict[str, list[dict]]:
    rng = random.Random(f"{seed}/commonsense")
    facts = knowledge_facts()
    answers_by_rel: dict[str, list[str]] = {}
    for rel, _, ans in facts:
        answers_by_rel.setdefault(rel, [])
        if ans not in answers_by_rel[rel]:
            answers_by_rel[rel].append(ans)
    used: set = set()

    def draw(rel: str, subj: str, ans: str) -> Optional[dict]:
        templates = KNOWLEDGE[rel][0]
        pool = [a for a in answers_by_rel[rel] if a != ans and a != subj]
        for _ in range(50):
            template = rng.choice(templates)
            choices = rng.sample(pool, 2) + [ans]
            rng.shuffle(choices)
            item = _csqa_item(rel, subj, ans, template, choices)
            key = _choice_key(item["question"]["stem"], choices)
            if key not in used:
                used.add(key)
                return item
        return None

    out: dict[str, list[dict]] = {}
    for split, n in (("evaluation", sizes.commonsense_evaluation),
                     ("calibration", sizes.commonsense_calibration)):
        order = list(range(len(facts)))
        rng.shuffle(order)
        items = []
        for idx in order[:n]:
            item = draw(*facts[idx])
            if item is not None:
                items.append(item)
        out[split] = items
    pretrain = []
    for rel, subj, ans in facts:
        for _ in range(sizes.commonsense_pretrain_per_fact):
            item = draw(rel, subj, ans)
            if item is not None:
                pretrain.append(item)
    rng.shuffle(pretrain)
    out["pretrain"] = pretrain
    return out


# ----------------------------------------------------------------------------------------------
# Code (HumanEval format)
# ----------------------------------------------------------------------------------------------


@dataclass
class _Problem:
    fname: str
    signature: str          # "(n: int) -> int"
    doc: str                # first docstring line(s), without the example
    body: str               # canonical solution (indented, ends with newline)
    example: tuple          # args of the docstring example
    tests: list             # list of argument tuples for the asserts
    consts: tuple           # constants that define the problem (held out for evaluation)


def _call(fn: Callable, args: tuple):
    return fn(*args)


def _run_body(p: _Problem) -> Callable:
    namespace: dict = {}
    exec(f"def {p.fname}{p.signature}:\n{p.body}", namespace)  # our own canonical code only
    return namespace[p.fname]


def _ints(rng: random.Random, k: int, lo: int = 0, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


def _fam_add_more(rng):
    name, obj, verb = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(ADD_VERBS)
    k = rng.randint(1, 50)
    return _Problem(
        f"{obj}_now", "(n: int) -> int",
        f"{name} has n {obj}. {name} {verb} {k} more {obj}. How many {obj} does {name} have now?",
        f"    return n + {k}\n", (rng.randint(0, 50),), [(rng.randint(0, 50),) for _ in range(4)], (k,))


def _fam_take_away(rng):
    name, obj, verb = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(SUB_VERBS)
    k = rng.randint(1, 50)
    return _Problem(
        f"{obj}_left", "(n: int) -> int",
        f"{name} has n {obj}. {name} {verb} {k} of them. How many {obj} does {name} have left?",
        f"    return n - {k}\n", (rng.randint(k, k + 50),), [(rng.randint(k, k + 50),) for _ in range(4)], (k,))


def _fam_together(rng):
    a_name, b_name = rng.sample(NAMES, 2)
    obj = rng.choice(OBJECTS)
    return _Problem(
        f"total_{obj}", "(a: int, b: int) -> int",
        f"{a_name} has a {obj} and {b_name} has b {obj}. How many {obj} do they have together?",
        "    return a + b\n", tuple(_ints(rng, 2, 0, 50)), [tuple(_ints(rng, 2, 0, 50)) for _ in range(4)], ())


def _fam_how_many_more(rng):
    a_name, b_name = rng.sample(NAMES, 2)
    obj = rng.choice(OBJECTS)

    def pair():
        a = rng.randint(0, 50)
        return (a, rng.randint(0, a))

    return _Problem(
        f"more_{obj}", "(a: int, b: int) -> int",
        f"{a_name} has a {obj} and {b_name} has b {obj}. How many more {obj} does {a_name} have than {b_name}?",
        "    return a - b\n", pair(), [pair() for _ in range(4)], ())


def _fam_two_steps(rng):
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    v1, v2 = rng.choice(ADD_VERBS), rng.choice(SUB_VERBS)
    k1, k2 = rng.randint(1, 30), rng.randint(1, 30)
    return _Problem(
        f"{obj}_at_end", "(n: int) -> int",
        f"{name} has n {obj}. {name} {v1} {k1} more {obj} and then {v2} {k2} of them. "
        f"How many {obj} does {name} have now?",
        f"    return n + {k1} - {k2}\n", (rng.randint(k2, 50),), [(rng.randint(k2, 50),) for _ in range(4)],
        (k1, k2))


def _fam_boxes(rng):
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    k = rng.randint(2, 12)
    return _Problem(
        f"{obj}_in_boxes", "(n: int) -> int",
        f"{name} has n boxes. Each box holds {k} {obj}. How many {obj} does {name} have?",
        f"    return n * {k}\n", (rng.randint(0, 10),), [(rng.randint(0, 10),) for _ in range(4)], (k,))


def _fam_enough(rng):
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    k = rng.randint(1, 50)
    return _Problem(
        f"enough_{obj}", "(n: int) -> bool",
        f"{name} has n {obj} and needs {k} {obj}. Return True if {name} has enough {obj}, else False.",
        f"    if n >= {k}:\n        return True\n    return False\n",
        (rng.randint(0, 60),), [(k,), (k - 1,), (rng.randint(0, 60),), (rng.randint(0, 60),)], (k,))


def _fam_sum_days(rng):
    name, obj, verb = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(ADD_VERBS)
    return _Problem(
        f"sum_{obj}", "(counts: list) -> int",
        f"Each day {name} {verb} some {obj}; counts holds how many. How many {obj} does {name} have in all?",
        "    total = 0\n    for c in counts:\n        total = total + c\n    return total\n",
        (_ints(rng, 3),), [(_ints(rng, rng.randint(0, 5)),) for _ in range(4)], ())


def _fam_days_over(rng):
    name, obj, verb = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(ADD_VERBS)
    k = rng.randint(1, 15)
    return _Problem(
        f"days_over_{k}", "(counts: list) -> int",
        f"Each day {name} {verb} some {obj}; counts holds how many. On how many days does {name} get more than {k} {obj}?",
        f"    days = 0\n    for c in counts:\n        if c > {k}:\n            days = days + 1\n    return days\n",
        (_ints(rng, 4),), [(_ints(rng, rng.randint(1, 6)),) for _ in range(4)], (k,))


def _fam_each_more(rng):
    obj, verb = rng.choice(OBJECTS), rng.choice(ADD_VERBS)
    k = rng.randint(1, 30)
    return _Problem(
        f"each_{obj}", "(counts: list) -> list",
        f"Each friend has some {obj}; counts holds how many. Each friend {verb} {k} more {obj}. How many {obj} does each friend have now?",
        f"    return [c + {k} for c in counts]\n",
        (_ints(rng, 3),), [(_ints(rng, rng.randint(0, 5)),) for _ in range(4)], (k,))


SUFFIXES = ["ing", "er", "est", "ly", "ful", "less", "ness", "ment", "able", "ish", "ward", "ship", "y", "ed", "s", "!"]
WORDS = ["blue", "sun", "rain", "moon", "star", "tree", "road", "fish", "kind", "warm", "cold", "bird",
         "home", "play", "jump", "read", "sing", "hope", "care", "dark", "soft", "wind", "fire", "snow",
         "hand", "park", "rock", "word", "song", "ship", "lake", "gold", "mint", "farm", "book", "door"]
STR_ARGS = ["word", "text", "name", "s"]


def _fam_add_suffix(rng):
    suffix = rng.choice(SUFFIXES)
    sep = rng.choice(["", "-", "_", " "])
    arg = rng.choice(STR_ARGS)
    return _Problem(
        f"add_{suffix if suffix.isalpha() else 'mark'}", f"({arg}: str) -> str",
        f"Return {arg} with \"{sep}{suffix}\" added at the end.",
        f"    return {arg} + \"{sep}{suffix}\"\n", (rng.choice(WORDS),),
        [(rng.choice(WORDS),) for _ in range(4)], (suffix, sep, arg))


def _fam_repeat(rng):
    k = rng.randint(2, 9)
    sep = rng.choice(["", " ", "-", ","])
    arg = rng.choice(STR_ARGS)
    return _Problem(
        f"repeat_{k}", f"({arg}: str) -> str",
        f"Return {arg} repeated {k} times, joined by \"{sep}\".",
        f"    return \"{sep}\".join([{arg}] * {k})\n", (rng.choice(WORDS),),
        [(rng.choice(WORDS),) for _ in range(4)], (k, sep, arg))


def _fam_pick(rng):
    which = rng.choice(["largest", "smallest", "first", "last"])
    arg = rng.choice(["values", "numbers", "items", "xs"])
    expr = {"largest": f"max({arg})", "smallest": f"min({arg})", "first": f"{arg}[0]", "last": f"{arg}[-1]"}[which]
    name = rng.choice(WORDS)
    return _Problem(
        f"{which}_{name}", f"({arg}: list) -> int",
        f"Return the {which} number in the non-empty list {arg}.",
        f"    return {expr}\n", (_ints(rng, 4, 0, 50),),
        [(_ints(rng, rng.randint(1, 6), 0, 50),) for _ in range(4)], (which, name, arg))


TARGET_FAMILIES: dict[str, Callable[[random.Random], _Problem]] = {
    "add_more": _fam_add_more,
    "take_away": _fam_take_away,
    "together": _fam_together,
    "how_many_more": _fam_how_many_more,
    "two_steps": _fam_two_steps,
    "boxes": _fam_boxes,
    "enough": _fam_enough,
    "sum_days": _fam_sum_days,
    "days_over": _fam_days_over,
    "each_more": _fam_each_more,
}
PRETRAIN_FAMILIES: dict[str, Callable[[random.Random], _Problem]] = {
    "add_suffix": _fam_add_suffix,
    "repeat": _fam_repeat,
    "pick": _fam_pick,
}


def _is_eval_params(family: str, p: _Problem) -> bool:
    """Whether a problem's parameters are reserved for evaluation (a fixed fifth of them)."""
    key = p.consts if p.consts else (p.doc,)
    return _stable_hash("code-holdout", family, key) % 5 == 0


def _humaneval(task_id: str, p: _Problem) -> dict:
    fn = _run_body(p)
    ex_args = ", ".join(repr(a) for a in p.example)
    prompt = (
        f"def {p.fname}{p.signature}:\n"
        f"    \"\"\"{p.doc}\n"
        f"    >>> {p.fname}({ex_args})\n"
        f"    {_call(fn, p.example)!r}\n"
        f"    \"\"\"\n"
    )
    asserts = "".join(
        f"    assert candidate({', '.join(repr(a) for a in args)}) == {_call(fn, args)!r}\n" for args in p.tests
    )
    return {
        "task_id": task_id,
        "prompt": prompt,
        "canonical_solution": p.body,
        "test": f"\n\ndef check(candidate):\n{asserts}\n",
        "entry_point": p.fname,
    }


def code_family(task_id: str) -> str:
    """The family a micro code task belongs to (task ids are `Micro/<split>/<family>/<index>`)."""
    return task_id.split("/")[2]


_PREFIXES = {"total_": "together", "more_": "how_many_more", "enough_": "enough", "sum_": "sum_days",
             "days_over_": "days_over", "each_": "each_more", "add_": "add_suffix", "repeat_": "repeat",
             "largest_": "pick", "smallest_": "pick", "first_": "pick", "last_": "pick"}
_SUFFIXES_OF_NAME = {"_now": "add_more", "_left": "take_away", "_at_end": "two_steps", "_in_boxes": "boxes"}


def code_family_of_prompt(prompt: str) -> str:
    """The family of a micro code prompt, read from its function name (instruction items carry no task id)."""
    fname = prompt.split("(", 1)[0].removeprefix("def ")
    for prefix, family in _PREFIXES.items():
        if fname.startswith(prefix):
            return family
    for suffix, family in _SUFFIXES_OF_NAME.items():
        if fname.endswith(suffix):
            return family
    raise ValueError(f"not a micro code prompt: {fname!r}")


def _code_splits(seed: int, sizes: MicroSizes) -> dict:
    rng = random.Random(f"{seed}/code")
    seen: set[str] = set()

    def draw(split: str, family: str, make, n: int, holdout: bool) -> list[dict]:
        items = []
        tries = 0
        while len(items) < n:
            tries += 1
            if tries > 200 * n + 1000:
                raise RuntimeError(f"code family {family}: cannot draw {n} distinct {split} problems")
            p = make(rng)
            if _is_eval_params(family, p) != holdout:
                continue
            item = _humaneval(f"Micro/{split}/{family}/{len(items)}", p)
            if item["prompt"] in seen:
                continue
            seen.add(item["prompt"])
            items.append(item)
        return items

    evaluation: list[dict] = []
    for fam, make in TARGET_FAMILIES.items():
        evaluation += draw("evaluation", fam, make, sizes.code_evaluation_per_target_family, True)
    for fam, make in PRETRAIN_FAMILIES.items():
        evaluation += draw("evaluation", fam, make, sizes.code_evaluation_per_pretrain_family, True)
    train_problems: list[dict] = []
    for fam, make in TARGET_FAMILIES.items():
        train_problems += draw("train", fam, make, sizes.code_train_per_target_family, False)
    for fam, make in PRETRAIN_FAMILIES.items():
        train_problems += draw("train", fam, make, sizes.code_train_per_pretrain_family, False)
    rng.shuffle(train_problems)
    train = [
        {"instruction": CODE_INSTRUCTION, "input": p["prompt"], "response": p["canonical_solution"]}
        for p in train_problems
    ]
    pretrain: list[dict] = []
    for fam, make in PRETRAIN_FAMILIES.items():
        pretrain += draw("pretrain", fam, make, sizes.code_pretrain_per_family, False)
    rng.shuffle(pretrain)
    return {"evaluation": evaluation, "train": train, "pretrain": pretrain}


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def generate(seed: int = DEFAULT_SEED, sizes: MicroSizes = MicroSizes()) -> dict[str, list[dict]]:
    """All splits as {"<domain>/<split>": records}, in the order they are written."""
    math = _math_splits(seed, sizes)
    cs = _commonsense_splits(seed, sizes)
    code = _code_splits(seed, sizes)
    out = {}
    for split in ("pretrain", "calibration", "evaluation"):
        out[f"math/{split}"] = math[split]
    for split in ("pretrain", "calibration", "evaluation"):
        out[f"commonsense/{split}"] = cs[split]
    out["code/pretrain"] = code["pretrain"]
    out["code/train"] = code["train"]
    out["code/evaluation"] = code["evaluation"]
    return out


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def file_name(key: str) -> str:
    """Relative file path of a split key, e.g. `code/train` -> `code/train.json`."""
    return f"{key}.json" if key == "code/train" else f"{key}.jsonl"


def write(out_dir: str | Path, seed: int = DEFAULT_SEED, sizes: MicroSizes = MicroSizes(),
          include_pretrain: bool = True) -> dict[str, Path]:
    """Generate and write every split under `out_dir`, plus GENERATOR.json; returns the paths."""
    out_dir = Path(out_dir)
    splits = generate(seed, sizes)
    paths: dict[str, Path] = {}
    for key, records in splits.items():
        if key.endswith("/pretrain") and not include_pretrain:
            continue
        path = out_dir / file_name(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(records, ensure_ascii=False, indent=1) + "\n" if key == "code/train" else _jsonl(records)
        path.write_text(text, encoding="utf-8")
        paths[key] = path
    meta = {
        "generator": "experiments.data.micro",
        "version": GENERATOR_VERSION,
        "seed": seed,
        "sizes": asdict(sizes),
        "counts": {k: len(v) for k, v in splits.items()},
        "code_target_families": list(TARGET_FAMILIES),
        "code_pretrain_families": list(PRETRAIN_FAMILIES),
    }
    (out_dir / "GENERATOR.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return paths


def split_keys(key: str, records: list[dict]) -> set:
    """Identity of each record, used to check that splits never share an item."""
    domain = key.split("/")[0]
    if domain == "math":
        return {r["question"] for r in records}
    if domain == "commonsense":
        return {_choice_key(r["question"]["stem"], [c["text"] for c in r["question"]["choices"]]) for r in records}
    if key == "code/train":
        return {r["input"] for r in records}
    return {r["prompt"] for r in records}


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--no-pretrain", action="store_true", help="write only calibration/evaluation/train splits")
    args = ap.parse_args(argv)
    paths = write(args.out, args.seed, include_pretrain=not args.no_pretrain)
    for key, path in paths.items():
        print(f"{key}: {path}")


if __name__ == "__main__":
    main()
