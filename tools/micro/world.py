"""The embedded micro benchmark: a small seeded world written in the formats of the real datasets.

Three domains, generated from one seed (same seed and sizes => byte-identical files):

- math (retained): GSM8K-format word problems with one or two + / - operations on small numbers;
  the reasoning is written as expressions (`12 + 5 = 17`) and ends in a line `#### N`.
- commonsense (retained): CommonsenseQA-format questions with three choices, rendered from the
  knowledge base below (11 relations, 293 facts); distractors come from the same relation.
- code (target): HumanEval-format problems from 13 families. Three *pretrain families* (string and
  list utilities) appear in pretraining. The ten *target families* never do: they are learnt only
  from the instruction-tuning split. Their docstrings are phrased like the math word problems
  (same names, objects, verbs, numbers), so learning them moves the model where math lives.

Splits (no item, and no near-duplicate of an item, is in two splits; see `dedup_report`):

    math/{pretrain,calibration,dev,test}.jsonl
    commonsense/{pretrain,calibration,dev,test}.jsonl
    code/{pretrain,dev,test}.jsonl          HumanEval format
    code/train.json                         instruction list {instruction, input, response}

How the splits are kept apart, by construction:

- code: every family states, solves and names its problems in *styles* partitioned over
  train / dev / test (`CodeFamily`): held-out docstring templates, canonical-body templates,
  function-name patterns, argument names, people, objects and words. Constants are split too (a
  fixed fifth of each family's constant tuples for test, a fifth for dev). Pretraining and the
  fine-tuning split use only train styles.
- math: a fixed tenth of the arithmetic (a question up to its names, objects and verbs) is
  reserved for calibration, dev and test, which never repeat each other's arithmetic;
  pretraining draws from the other nine tenths.
- commonsense: each fact belongs to one of calibration, dev and test (a fixed third each, a fact
  and its converse together); a split asks only about its own facts. Pretraining states every
  fact (it is the knowledge the retained domain measures), never with the choice set an
  evaluation item pairs with that question.

`write` runs `dedup_report` and refuses to write splits that share an exact or near-duplicate
item; the report is stored in GENERATOR.json and printed by the command line:

    python -m tools.micro.world --out DIR [--seed 0] [--no-pretrain]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Callable, Optional

from experiments.data import dedup
from experiments.prompts import CODE_INSTRUCTION

GENERATOR_VERSION = 2
DEFAULT_SEED = 0


@dataclass(frozen=True)
class MicroSizes:
    """How many items each split holds."""

    math_pretrain: int = 60000
    math_calibration: int = 250
    math_dev: int = 250
    math_test: int = 250
    commonsense_pretrain_per_fact: int = 12
    commonsense_calibration: int = 250
    commonsense_dev: int = 250
    commonsense_test: int = 250
    code_pretrain_per_family: int = 700
    code_train_per_target_family: int = 250
    code_train_per_pretrain_family: int = 30
    code_dev_per_target_family: int = 12
    code_dev_per_pretrain_family: int = 4
    code_test_per_target_family: int = 12
    code_test_per_pretrain_family: int = 4


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
    return math_item_with_kind(rng)[0]


def math_item_with_kind(rng: random.Random) -> tuple[dict, str, tuple[str, ...]]:
    """One GSM8K-format problem, its kind (`add`, `sub`, `together`, `difference`, `add_sub`, `sub_add`, `add_add`)
    and the verbs it uses, in order."""
    a_name, b_name = rng.sample(NAMES, 2)
    obj = rng.choice(OBJECTS)
    kind = rng.choices(
        ["add", "sub", "together", "difference", "add_sub", "sub_add", "add_add"],
        weights=[2, 2, 1.5, 1.5, 1, 1, 1],
    )[0]
    if kind == "add":
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        verb = rng.choice(ADD_VERBS)
        verbs: tuple[str, ...] = (verb,)
        q = f"{a_name} has {a} {obj}. {a_name} {verb} {b} more {obj}. How many {obj} does {a_name} have now?"
        c = a + b
        ans = f"{a_name} has {a} + {b} = {c} {obj} now.\n#### {c}"
    elif kind == "sub":
        a = rng.randint(0, 50)
        b = rng.randint(0, a)
        verb = rng.choice(SUB_VERBS)
        verbs = (verb,)
        q = f"{a_name} has {a} {obj}. {a_name} {verb} {b} of them. How many {obj} does {a_name} have left?"
        c = a - b
        ans = f"{a_name} has {a} - {b} = {c} {obj} left.\n#### {c}"
    elif kind == "together":
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        verbs = ()
        q = f"{a_name} has {a} {obj} and {b_name} has {b} {obj}. How many {obj} do they have together?"
        c = a + b
        ans = f"They have {a} + {b} = {c} {obj} together.\n#### {c}"
    elif kind == "difference":
        a = rng.randint(0, 50)
        b = rng.randint(0, a)
        verbs = ()
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
            verbs = (v1, v2)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} more {obj} and then {v2} {c} of them. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} + {b} = {mid} {obj}.\nThen {a_name} has {mid} - {c} = {end} {obj}.\n#### {end}"
        elif kind == "sub_add":
            b = rng.randint(0, a)
            c = rng.randint(0, 30)
            mid, end = a - b, a - b + c
            v1, v2 = rng.choice(SUB_VERBS), rng.choice(ADD_VERBS)
            verbs = (v1, v2)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} of them and then {v2} {c} more {obj}. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} - {b} = {mid} {obj}.\nThen {a_name} has {mid} + {c} = {end} {obj}.\n#### {end}"
        else:
            b, c = rng.randint(0, 30), rng.randint(0, 30)
            mid, end = a + b, a + b + c
            v1, v2 = rng.sample(ADD_VERBS, 2)
            verbs = (v1, v2)
            q = (f"{a_name} has {a} {obj}. {a_name} {v1} {b} more {obj} and then {v2} {c} more {obj}. "
                 f"How many {obj} does {a_name} have now?")
            ans = f"{a_name} has {a} + {b} = {mid} {obj}.\nThen {a_name} has {mid} + {c} = {end} {obj}.\n#### {end}"
    return {"question": q, "answer": ans}, kind, verbs


def _math_reserved(item: dict) -> bool:
    """Whether a math problem's arithmetic (its question up to names, objects and verbs) is reserved
    for the calibration, dev and test splits: a fixed tenth of them, never in pretraining."""
    return _stable_hash("math-holdout", mask_text(item["question"])) % 10 == 0


def _math_splits(seed: int, sizes: MicroSizes) -> dict[str, list[dict]]:
    rng = random.Random(f"{seed}/math")
    seen: set[str] = set()  # masked questions: no two non-pretrain items pose the same arithmetic
    out: dict[str, list[dict]] = {}
    for split, n in (("test", sizes.math_test), ("dev", sizes.math_dev), ("calibration", sizes.math_calibration),
                     ("pretrain", sizes.math_pretrain)):
        reserved = split != "pretrain"
        items = []
        pretrain_questions: set[str] = set()
        while len(items) < n:
            item = _math_item(rng)
            if _math_reserved(item) != reserved:
                continue
            if reserved:
                key = mask_text(item["question"])
                if key in seen:
                    continue
                seen.add(key)
            else:
                if item["question"] in pretrain_questions:
                    continue
                pretrain_questions.add(item["question"])
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


def fact_split(rel: str, subj: str, ans: str) -> str:
    """The split whose questions may ask about a fact: `calibration`, `dev` or `test` (a fixed third each).

    A fact and its converse (`hot`->`cold`, `cold`->`hot`) fall in the same split, so no split
    asks what another split's answer already states.
    """
    key = tuple(sorted((subj, ans))) if rel == "opposite" else (subj,)
    return ("calibration", "dev", "test")[_stable_hash("fact-split", rel, key) % 3]


def _commonsense_splits(seed: int, sizes: MicroSizes) -> dict[str, list[dict]]:
    rng = random.Random(f"{seed}/commonsense")
    facts = knowledge_facts()
    answers_by_rel: dict[str, list[str]] = {}
    for rel, _, ans in facts:
        answers_by_rel.setdefault(rel, [])
        if ans not in answers_by_rel[rel]:
            answers_by_rel[rel].append(ans)
    used: set = set()

    def draw(rel: str, subj: str, ans: str, template: Optional[str] = None) -> Optional[dict]:
        templates = KNOWLEDGE[rel][0]
        pool = [a for a in answers_by_rel[rel] if a != ans and a != subj]
        for _ in range(50):
            chosen = template if template is not None else rng.choice(templates)
            choices = rng.sample(pool, 2) + [ans]
            rng.shuffle(choices)
            item = _csqa_item(rel, subj, ans, chosen, choices)
            key = _choice_key(item["question"]["stem"], choices)
            if key not in used:
                used.add(key)
                return item
        return None

    out: dict[str, list[dict]] = {}
    for split, n in (("test", sizes.commonsense_test), ("dev", sizes.commonsense_dev),
                     ("calibration", sizes.commonsense_calibration)):
        # every (fact, question template) of this split's facts, in a seeded order
        pairs = [(fact, t) for fact in facts if fact_split(*fact) == split for t in KNOWLEDGE[fact[0]][0]]
        rng.shuffle(pairs)
        items = []
        for fact, template in pairs:
            if len(items) == n:
                break
            item = draw(*fact, template=template)
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

#: Code splits a family's *styles* are partitioned over: "train" styles serve both `code/pretrain`
#: and `code/train`; "dev" and "test" styles are held out from both and from each other.
CODE_SPLITS = ("train", "dev", "test")


def _partition(values: list[str], n_dev: int, n_test: int) -> dict[str, list[str]]:
    """The last `n_test` values for test, the `n_dev` before them for dev, the rest for train."""
    cut_dev, cut_test = len(values) - n_dev - n_test, len(values) - n_test
    return {"train": values[:cut_dev], "dev": values[cut_dev:cut_test], "test": values[cut_test:]}


#: Held-out names, objects and words: a dev or test docstring never names a person, object or word
#: of a training docstring (math, which is not code, uses them all).
CODE_NAMES = _partition(NAMES, 5, 5)
CODE_OBJECTS = _partition(OBJECTS, 5, 5)
SUFFIXES = ["ing", "er", "est", "ly", "ful", "less", "ness", "ment", "able", "ish", "ward", "ship", "y", "ed", "s", "!"]
WORDS = ["blue", "sun", "rain", "moon", "star", "tree", "road", "fish", "kind", "warm", "cold", "bird",
         "home", "play", "jump", "read", "sing", "hope", "care", "dark", "soft", "wind", "fire", "snow",
         "hand", "park", "rock", "word", "song", "ship", "lake", "gold", "mint", "farm", "book", "door"]
CODE_WORDS = _partition(WORDS, 5, 5)


def _styles(train: tuple, dev: tuple, test: tuple) -> dict[str, tuple]:
    return {"train": train, "dev": dev, "test": test}


@dataclass(frozen=True)
class CodeFamily:
    """One kind of code problem and its held-out styles.

    Each of `docs` (docstring templates), `bodies` (canonical solution templates) and `fnames`
    (function name patterns) maps a code split (`CODE_SPLITS`) to its own options, so a test
    problem is phrased, named and solved in a way no training problem is; `args` (argument
    names, a tuple per problem) is one pool for all splits. Templates use `{N}`/`{M}` (people), `{O}` (object), `{add}`/`{sub}`
    (verbs), the family's constants and its argument placeholders. `consts` draws the constants,
    `inputs` one argument tuple for them; `held_out` names the constants whose values are split
    three ways as well (a fixed fifth for test, a fifth for dev).
    """

    signature: str
    docs: dict
    bodies: dict
    fnames: dict
    args: dict
    consts: Callable[[random.Random], dict]
    inputs: Callable[[random.Random, dict], tuple]
    held_out: tuple = ()
    edge_inputs: Callable[[dict], list] = lambda c: []


def _no_consts(rng: random.Random) -> dict:
    return {}


def _k(lo: int, hi: int) -> Callable[[random.Random], dict]:
    return lambda rng: {"k": rng.randint(lo, hi)}


def _ints(rng: random.Random, k: int, lo: int = 0, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(k)]


def _pair(rng: random.Random, c: dict) -> tuple:
    a = rng.randint(0, 50)
    return (a, rng.randint(0, a))


# Argument names are fixed per argument type for the target families (the old world's
# convention): the problems test reading a new phrasing, not copying an unseen name.
_ONE_INT = (("n",),)
_TWO_INTS = (("a", "b"),)
_ONE_LIST = (("counts",),)
_ONE_STR = (("word",), ("text",), ("name",), ("s",), ("label",), ("title",))

def _compose(setups: dict, events: tuple, questions: dict) -> dict[str, tuple]:
    """Docstring templates per split: a split's own opening and question around an event sentence.

    The event sentence states the operation (`{N} {add} {k} more {O}.`) and is shared by all
    splits; openings and questions are held out, so a dev or test docstring as a whole is never a
    training docstring, nor within the near-duplicate threshold of one (`dedup_report`).
    """
    return {split: tuple(" ".join(part for part in (s, e, q) if part)
                         for s in setups[split] for e in (events or ("",)) for q in questions[split])
            for split in CODE_SPLITS}


# Frames (opening and question) are shared by the families of one argument type, so that only
# the event sentence says which operation a problem asks for.
_HAS_SETUPS = _styles(("{N} has {x} {O}.", "There are {x} {O} in {N}'s bag.", "{N} starts the day with {x} {O}.",
                       "{N} keeps {x} {O} on a shelf.", "In the morning {N} counts {x} {O}.", "{N} got {x} {O} from a friend."),
                      ("At breakfast {N} counted {x} {O}.", "{N}'s basket had {x} {O} in it."),
                      ("When the week began, {N} owned {x} {O}.", "A jar of {N}'s held {x} {O}."))
_COUNT_QUESTIONS = _styles(("How many {O} does {N} have now?", "What is the number of {O} now?", "Return the count of {O}.",
                            "How many are there at the end?", "Return how many {O} there are.", "What number of {O} is left over?"),
                           ("What is the total at the end?", "Say how many {O} {N} ends with."),
                           ("Find the final number of {O}.", "Which count does {N} reach?"))
_PAIR_SETUPS = _styles(("{N} has {a} {O} and {M} has {b} {O}.", "{N} brings {a} {O} and {M} brings {b} {O}.",
                        "There are {a} {O} from {N} and {b} {O} from {M}.", "{N} found {a} {O}; {M} found {b} {O}.",
                        "{N} holds {a} {O} while {M} holds {b} {O}.", "In the park {N} picks {a} {O} and {M} picks {b} {O}."),
                       ("{N} with {a} {O} meets {M} with {b} {O}.", "Count {a} {O} for {N} and {b} {O} for {M}."),
                       ("Two friends, {N} and {M}, own {a} and {b} {O}.", "The {O} of {N} number {a}; those of {M} number {b}."))
_PAIR_QUESTIONS = _styles(("What is that number?", "Return that number of {O}.", "How many {O} is that?",
                           "Return the result.", "What do you get?", "Give that number of {O}."),
                          ("What figure results?", "Report it."), ("Find that figure.", "Which number comes out?"))
_LIST_SETUPS = _styles(("{xs} holds how many {O} {N} {add} each day.", "The numbers in {xs} are the {O} in each of {N}'s boxes.",
                        "{xs} lists the {O} {N} {add} on each trip.", "Each number in {xs} is a bag of {O}.",
                        "{N} keeps a list {xs} of {O} per shelf.", "{xs} has one entry of {O} for each friend of {N}."),
                       ("Per day, {N}'s {O} are in {xs}.", "{xs} tracks {O} for every class of {N}."),
                       ("{xs} notes the {O} of each week.", "For each box, {xs} records its {O}."))
_LIST_QUESTIONS = _styles(("Return the answer.", "What is the result?", "Compute it.", "Return what you get.",
                           "What comes out?", "Give the result."),
                          ("Report the outcome.", "Return the output."), ("Produce the outcome.", "Hand it back."))

TARGET_FAMILIES: dict[str, CodeFamily] = {
    "add_more": CodeFamily(
        "({x}: int) -> int",
        _compose(_HAS_SETUPS, ("{N} {add} {k} more {O}.", "Then {N} {add} {k} more.", "Later {N} {add} another {k} {O}."),
                 _COUNT_QUESTIONS),
        _styles(("return {x} + {k}", "total = {x} + {k}\n    return total"),
                ("{x} = {x} + {k}\n    return {x}",), ("return {k} + {x}",)),
        _styles(("{obj}_now", "{obj}_after_getting"), ("{obj}_after_lunch",), ("new_{obj}_count",)),
        _ONE_INT, _k(1, 50), lambda rng, c: (rng.randint(0, 50),), ("k",)),
    "take_away": CodeFamily(
        "({x}: int) -> int",
        _compose(_HAS_SETUPS, ("{N} {sub} {k} of them.", "Then {N} {sub} {k} of the {O}.", "Later {N} {sub} {k}."),
                 _COUNT_QUESTIONS),
        _styles(("return {x} - {k}", "left = {x} - {k}\n    return left"),
                ("{x} = {x} - {k}\n    return {x}",), ("return -{k} + {x}",)),
        _styles(("{obj}_left", "{obj}_remaining"), ("{obj}_still_held",), ("{obj}_in_jar",)),
        _ONE_INT, _k(1, 50), lambda rng, c: (rng.randint(c["k"], c["k"] + 50),), ("k",)),
    "together": CodeFamily(
        "({a}: int, {b}: int) -> int",
        _compose(_PAIR_SETUPS, ("They put all their {O} together.", "They add their {O} into one pile.",
                                "They count their {O} together."),
                 _PAIR_QUESTIONS),
        _styles(("return {a} + {b}", "total = {a} + {b}\n    return total"),
                ("together = {a}\n    together = together + {b}\n    return together",), ("return sum([{a}, {b}])",)),
        _styles(("total_{obj}", "{obj}_together"), ("shared_box_of_{obj}",), ("combined_{obj}",)),
        _TWO_INTS, _no_consts, lambda rng, c: tuple(_ints(rng, 2, 0, 50))),
    "how_many_more": CodeFamily(
        "({a}: int, {b}: int) -> int",
        _compose(_PAIR_SETUPS, ("Compare: {N} has more {O}.",
                                "{M} is behind {N}; we want the gap.", "Find by how much {N} is ahead of {M}."),
                 _PAIR_QUESTIONS),
        _styles(("return {a} - {b}", "diff = {a} - {b}\n    return diff"),
                ("gap = {a}\n    gap = gap - {b}\n    return gap",), ("return abs({a} - {b})",)),
        _styles(("more_{obj}", "{obj}_difference"), ("{obj}_behind",), ("gap_in_{obj}",)),
        _TWO_INTS, _no_consts, _pair),
    "two_steps": CodeFamily(
        "({x}: int) -> int",
        _compose(_HAS_SETUPS, ("{N} {add} {k1} more {O} and then {sub} {k2} of them.",
                               "First {N} {add} {k1} more, then {N} {sub} {k2}.",
                               "{N} {add} {k1}, later {sub} {k2}."),
                 _COUNT_QUESTIONS),
        _styles(("return {x} + {k1} - {k2}", "total = {x} + {k1}\n    total = total - {k2}\n    return total"),
                ("return {x} - {k2} + {k1}",), ("{x} = {x} + {k1}\n    return {x} - {k2}",)),
        _styles(("{obj}_at_end", "{obj}_at_night"), ("final_{obj}",), ("{obj}_after_two_changes",)),
        _ONE_INT, lambda rng: {"k1": rng.randint(1, 30), "k2": rng.randint(1, 30)},
        lambda rng, c: (rng.randint(c["k2"], 50),), ("k1", "k2")),
    "boxes": CodeFamily(
        "({x}: int) -> int",
        _compose(_styles(("{N} has {x} boxes.", "{N} fills {x} bags.", "There are {x} rows."),
                         ("{N} carries {x} baskets.", "{N} stacks {x} crates."), ("{N} buys {x} packs.", "{N} opens {x} tins.")),
                 ("Each one holds {k} {O}.", "There are {k} {O} in each.", "Every one has {k} {O} inside."),
                 _COUNT_QUESTIONS),
        _styles(("return {x} * {k}", "total = {x} * {k}\n    return total"),
                ("return {k} * {x}",), ("total = 0\n    for _ in range({x}):\n        total = total + {k}\n    return total",)),
        _styles(("{obj}_in_boxes", "{obj}_in_bags"), ("{obj}_in_baskets",), ("{obj}_in_packs",)),
        _ONE_INT, _k(2, 12), lambda rng, c: (rng.randint(0, 10),), ("k",)),
    "enough": CodeFamily(
        "({x}: int) -> bool",
        _compose(_HAS_SETUPS, ("{N} needs {k} {O}.", "A recipe needs {k} {O}.", "{N} wants to give away {k} {O}."),
                 _styles(("Return True if {N} has enough {O}, else False.", "Return True if there are enough {O}, else False.",
                          "Does {N} have enough? Return True or False."),
                         ("Say True when it is enough, otherwise False.", "Is it sufficient? Give True or False."),
                         ("Answer True if the {O} suffice and False if not.", "Return whether {N} has sufficient {O}."))),
        _styles(("if {x} >= {k}:\n        return True\n    return False", "return {x} >= {k}"),
                ("return not {x} < {k}",), ("if {x} < {k}:\n        return False\n    return True",)),
        _styles(("enough_{obj}", "has_enough_{obj}"), ("at_least_{obj}",), ("can_bring_{obj}",)),
        _ONE_INT, _k(1, 50), lambda rng, c: (rng.randint(0, 60),), ("k",),
        lambda c: [(c["k"],), (c["k"] - 1,)]),
    "sum_days": CodeFamily(
        "({xs}: list) -> int",
        _compose(_LIST_SETUPS, ("{N} adds all of them up.", "All the {O} go into one bag; count them.",
                                "Find the total of all the {O}."),
                 _LIST_QUESTIONS),
        _styles(("total = 0\n    for c in {xs}:\n        total = total + c\n    return total", "return sum({xs})"),
                ("total = 0\n    for i in range(len({xs})):\n        total += {xs}[i]\n    return total",),
                ("return sum(c for c in {xs})",)),
        _styles(("sum_{obj}", "all_{obj}"), ("{obj}_added_up",), ("overall_{obj}",)),
        _ONE_LIST, _no_consts, lambda rng, c: (_ints(rng, rng.randint(0, 5)),)),
    "days_over": CodeFamily(
        "({xs}: list) -> int",
        _compose(_LIST_SETUPS, ("Count the entries with more than {k} {O}.",
                                "Only entries above {k} count; how many are there?",
                                "Count the days above {k}."),
                 _LIST_QUESTIONS),
        _styles(("days = 0\n    for c in {xs}:\n        if c > {k}:\n            days = days + 1\n    return days",
                 "return len([c for c in {xs} if c > {k}])"),
                ("return sum(1 for c in {xs} if c > {k})",),
                ("count = 0\n    for c in {xs}:\n        count += c > {k}\n    return count",)),
        _styles(("days_over_{k}", "trips_over_{k}"), ("days_above_{k}",), ("weeks_over_{k}",)),
        _ONE_LIST, _k(1, 15), lambda rng, c: (_ints(rng, rng.randint(1, 6)),), ("k",)),
    "each_more": CodeFamily(
        "({xs}: list) -> list",
        _compose(_LIST_SETUPS, ("Each one gets {k} more {O}; list the new numbers.",
                                "{N} adds {k} more {O} to every one and lists them.",
                                "Every entry grows by {k} {O}; give the new list."),
                 _LIST_QUESTIONS),
        _styles(("return [c + {k} for c in {xs}]", "result = []\n    for c in {xs}:\n        result.append(c + {k})\n    return result"),
                ("return [{k} + c for c in {xs}]",), ("return list(map(lambda c: c + {k}, {xs}))",)),
        _styles(("each_{obj}", "{obj}_per_jar"), ("{obj}_per_player",), ("{obj}_per_friend",)),
        _ONE_LIST, _k(1, 30), lambda rng, c: (_ints(rng, rng.randint(0, 5)),), ("k",)),
}

_WHICH = ("largest", "smallest", "first", "last")
_PICK_BODIES = {
    "train": {"largest": "return max({xs})", "smallest": "return min({xs})", "first": "return {xs}[0]",
              "last": "return {xs}[-1]"},
    "dev": {"largest": "return sorted({xs})[-1]", "smallest": "return sorted({xs})[0]", "first": "return {xs}[:1][0]",
            "last": "return {xs}[len({xs}) - 1]"},
    "test": {"largest": "return sorted({xs}, reverse=True)[0]", "smallest": "return sorted({xs}, reverse=True)[-1]",
             "first": "for v in {xs}:\n        return v", "last": "return list(reversed({xs}))[0]"},
}

_STR_SETUPS = _styles(("Take the string {s}.", "{s} is a word.", "You get the text {s}."),
                     ("Start from {s}.",), ("Look at {s}.",))
_STR_QUESTIONS = _styles(("Return the result.", "Return the new string.", "What is the new string?"),
                         ("Give that back.",), ("Hand back what you get.",))

PRETRAIN_FAMILIES: dict[str, CodeFamily] = {
    "add_suffix": CodeFamily(
        "({s}: str) -> str",
        _compose(_STR_SETUPS, ("Add \"{sep}{suffix}\" at the end.", "Put \"{sep}{suffix}\" after it.",
                               "Stick \"{sep}{suffix}\" onto its end."), _STR_QUESTIONS),
        _styles(("return {s} + \"{sep}{suffix}\"",), ("return \"\".join([{s}, \"{sep}{suffix}\"])",),
                ("result = {s}\n    result += \"{sep}{suffix}\"\n    return result",)),
        _styles(("add_{tag}",), ("with_{tag}",), ("append_{tag}",)),
        _ONE_STR,
        lambda rng: {"suffix": rng.choice(SUFFIXES), "sep": rng.choice(["", "-", "_", " "])},
        lambda rng, c: (rng.choice(WORDS),), ("suffix", "sep")),
    "repeat": CodeFamily(
        "({s}: str) -> str",
        _compose(_STR_SETUPS, ("Repeat it {k} times with \"{sep}\" between the copies.",
                               "Write it {k} times, joined by \"{sep}\".", "Make {k} copies joined by \"{sep}\"."),
                 _STR_QUESTIONS),
        _styles(("return \"{sep}\".join([{s}] * {k})",), ("return \"{sep}\".join({s} for _ in range({k}))",),
                ("parts = [{s}] * {k}\n    return \"{sep}\".join(parts)",)),
        _styles(("repeat_{k}",), ("copies_{k}",), ("times_{k}",)),
        _ONE_STR,
        lambda rng: {"k": rng.randint(2, 9), "sep": rng.choice(["", " ", "-", ","])},
        lambda rng, c: (rng.choice(WORDS),), ("k", "sep")),
    "pick": CodeFamily(
        "({xs}: list) -> int",
        _compose(_styles(("{xs} is a non-empty list of numbers.", "The list {xs} is never empty.",
                          "You get a non-empty list {xs}."),
                         ("{xs} holds at least one number.",), ("There is always a number in {xs}.",)),
                 ("Find the {which} number.", "Look for the {which} one.", "Take the {which} value."),
                 _styles(("Return it.", "Return that number.", "What is it?"), ("Give it back.",), ("Hand it over.",))),
        {split: tuple(bodies[w] for w in _WHICH) for split, bodies in _PICK_BODIES.items()},
        _styles(("{which}_{word}",), ("get_{which}_{word}",), ("find_{which}_{word}",)),
        (("values",), ("numbers",), ("items",), ("xs",), ("nums",), ("data",)),
        lambda rng: {"which": rng.choice(_WHICH)},
        lambda rng, c: (_ints(rng, rng.randint(1, 6), 0, 50),)),
}
CODE_FAMILIES: dict[str, CodeFamily] = {**TARGET_FAMILIES, **PRETRAIN_FAMILIES}


@dataclass
class _Problem:
    fname: str
    signature: str          # "(n: int) -> int"
    doc: str                # first docstring line(s), without the example
    body: str               # canonical solution (indented, ends with newline)
    example: tuple          # args of the docstring example
    tests: list             # list of argument tuples for the asserts


def _call(fn: Callable, args: tuple):
    return fn(*args)


def _run_body(p: _Problem) -> Callable:
    namespace: dict = {}
    exec(f"def {p.fname}{p.signature}:\n{p.body}", namespace)  # our own canonical code only
    return namespace[p.fname]


def _const_split(family: str, consts: dict, keys: tuple) -> str:
    """The code split a family's constants belong to (a fixed fifth each for dev and test)."""
    if not keys:
        return "any"
    bucket = _stable_hash("code-holdout", family, tuple(consts[k] for k in keys)) % 5
    return {0: "test", 1: "dev"}.get(bucket, "train")


def _make_problem(family_name: str, fam: CodeFamily, rng: random.Random, split: str) -> Optional[_Problem]:
    """One problem of `family_name` in the styles of code split `split`; None if its constants belong elsewhere."""
    consts = fam.consts(rng)
    where = _const_split(family_name, consts, fam.held_out)
    if where not in ("any", split):
        return None
    style = rng.randrange(len(fam.docs[split]))
    body_t = rng.choice(fam.bodies[split])
    if family_name == "pick":
        body_t = fam.bodies[split][_WHICH.index(consts["which"])]
    names = rng.sample(CODE_NAMES[split], 2)
    obj = rng.choice(CODE_OBJECTS[split])
    arg_names = rng.choice(fam.args)
    args = dict(zip([k for k in ("x", "a", "b", "xs", "s") if "{" + k + "}" in fam.signature], arg_names))
    tag = consts.get("suffix", "") if str(consts.get("suffix", "")).isalpha() else "mark"
    fields = {"N": names[0], "M": names[1], "O": obj, "obj": obj, "add": rng.choice(ADD_VERBS),
              "sub": rng.choice(SUB_VERBS), "word": rng.choice(CODE_WORDS[split]), "tag": tag, **consts, **args}
    fname = rng.choice(fam.fnames[split]).format(**fields)
    example = fam.inputs(rng, consts)
    edges = fam.edge_inputs(consts)
    tests = edges + [fam.inputs(rng, consts) for _ in range(4 - len(edges))]
    return _Problem(fname, fam.signature.format(**fields), fam.docs[split][style].format(**fields),
                    "    " + body_t.format(**fields) + "\n", example, tests)


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


def _fname_pattern(pattern: str) -> "re.Pattern":
    alternatives = {"obj": OBJECTS, "word": WORDS, "which": list(_WHICH), "tag": [s for s in SUFFIXES if s.isalpha()] + ["mark"]}
    regex = re.escape(pattern)
    for key, values in alternatives.items():
        regex = regex.replace(re.escape("{" + key + "}"), "(?:" + "|".join(map(re.escape, values)) + ")")
    return re.compile(regex.replace(re.escape("{k}"), r"\d+"))


_FNAME_PATTERNS = [(family, _fname_pattern(pattern)) for family, fam in CODE_FAMILIES.items()
                   for patterns in fam.fnames.values() for pattern in patterns]


def code_family_of_prompt(prompt: str) -> str:
    """The family of a micro code prompt, read from its function name (instruction items carry no task id)."""
    fname = prompt.split("(", 1)[0].removeprefix("def ")
    found = {family for family, pattern in _FNAME_PATTERNS if pattern.fullmatch(fname)}
    if len(found) != 1:
        raise ValueError(f"not a micro code prompt of one family: {fname!r} matches {sorted(found)}")
    return found.pop()


def _code_splits(seed: int, sizes: MicroSizes) -> dict:
    # One random stream per split: a split's problems do not depend on how the others are drawn.
    rngs = {split: random.Random(f"{seed}/code/{split}") for split in ("pretrain", "train", "dev", "test")}
    seen: set[str] = set()

    def draw(split: str, style_split: str, family: str, n: int) -> list[dict]:
        fam = CODE_FAMILIES[family]
        rng = rngs[split]
        items = []
        tries = 0
        while len(items) < n:
            tries += 1
            if tries > 200 * n + 1000:
                raise RuntimeError(f"code family {family}: cannot draw {n} distinct {split} problems")
            p = _make_problem(family, fam, rng, style_split)
            if p is None:
                continue
            item = _humaneval(f"Micro/{split}/{family}/{len(items)}", p)
            if item["prompt"] in seen:
                continue
            seen.add(item["prompt"])
            items.append(item)
        return items

    # Pretraining first: what the backbone learnt from depends on no fine-tuning, dev or test choice.
    pretrain = [p for fam in PRETRAIN_FAMILIES for p in draw("pretrain", "train", fam, sizes.code_pretrain_per_family)]
    rngs["pretrain"].shuffle(pretrain)
    train_problems = [p for fam in TARGET_FAMILIES for p in draw("train", "train", fam, sizes.code_train_per_target_family)]
    train_problems += [p for fam in PRETRAIN_FAMILIES
                       for p in draw("train", "train", fam, sizes.code_train_per_pretrain_family)]
    rngs["train"].shuffle(train_problems)
    out: dict[str, list[dict]] = {"pretrain": pretrain, "train": [
        {"instruction": CODE_INSTRUCTION, "input": p["prompt"], "response": p["canonical_solution"]}
        for p in train_problems
    ]}
    for split, n_target, n_pretrain in (("dev", sizes.code_dev_per_target_family, sizes.code_dev_per_pretrain_family),
                                        ("test", sizes.code_test_per_target_family, sizes.code_test_per_pretrain_family)):
        out[split] = [p for fam in TARGET_FAMILIES for p in draw(split, split, fam, n_target)]
        out[split] += [p for fam in PRETRAIN_FAMILIES for p in draw(split, split, fam, n_pretrain)]
    return out


# ----------------------------------------------------------------------------------------------
# Deduplication across splits
# ----------------------------------------------------------------------------------------------

_MULTIWORD_VERBS = sorted((v for v in ADD_VERBS + SUB_VERBS if " " in v), key=len, reverse=True)
_MASKS = {**{n: "<name>" for n in NAMES}, **{o: "<obj>" for o in OBJECTS}, **{w: "<word>" for w in WORDS},
          **{v: "<verb>" for v in ADD_VERBS + SUB_VERBS if " " not in v}, "MULTIWORDVERB": "<verb>"}


def mask_text(text: str, numbers: bool = False, extra: tuple = ()) -> str:
    """`text` with the world's names, objects, words and verbs (and `extra` words) masked, e.g.
    `Tom buys 5 apples` -> `<name> <verb> 5 <obj>`; numbers become `<num>` when `numbers` is set."""
    for verb in _MULTIWORD_VERBS:
        text = text.replace(verb, "MULTIWORDVERB")
    out = []
    for tok in dedup.words(text):
        if tok in extra:
            out.append("<arg>")
        elif tok in _MASKS:
            out.append(_MASKS[tok])
        elif numbers and tok.isdigit():
            out.append("<num>")
        else:
            out.append(tok)
    return " ".join(out)


def _code_parts(prompt: str, body: str) -> dict:
    """Function name, signature argument names, docstring text (without the example) and body."""
    header, doc = prompt.split('"""', 2)[:2]
    fname = header.split("(", 1)[0].removeprefix("def ").strip()
    args = tuple(re.findall(r"(\w+):", header.split("(", 1)[1].split(")", 1)[0]))
    return {"fname": fname, "doc": doc.split(">>>")[0].strip(), "body": body, "args": args}


def code_groups(splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Code items grouped for deduplication: `train` (pretraining and fine-tuning data), `dev`, `test`."""
    train = [_code_parts(p["prompt"], p["canonical_solution"]) for p in splits.get("code/pretrain", [])]
    train += [_code_parts(t["input"], t["response"]) for t in splits["code/train"]]
    return {"train": train,
            "dev": [_code_parts(p["prompt"], p["canonical_solution"]) for p in splits["code/dev"]],
            "test": [_code_parts(p["prompt"], p["canonical_solution"]) for p in splits["code/test"]]}


def _stem(rec: dict) -> str:
    return rec["question"]["stem"]


def _csqa_answer(rec: dict) -> str:
    return rec["question"]["choices"][["A", "B", "C"].index(rec["answerKey"])]["text"]


def dedup_report(splits: dict[str, list[dict]]) -> dict:
    """Exact and near-duplicate counts between the splits (definitions in `experiments.data.dedup`).

    - code: between `train` (pretraining + fine-tuning problems), `dev` and `test`: shared function
      bodies (exact text; near = same skeleton up to renaming and constants), docstrings (exact;
      near = masked-token similarity >= the threshold, names, objects, verbs, words, numbers and
      argument names masked) and function names.
    - math: between calibration, dev and test, and each of them against pretraining: shared
      questions (exact; normalised; near = the same question up to names, objects and verbs,
      which for these templates means the same arithmetic and the same answer).
    - commonsense: between calibration, dev and test: shared questions (exact stem; normalised
      stem, ignoring the choices) and shared facts (same subject, same answer). Pretraining
      states every fact on purpose (it is the knowledge the model keeps) and is not compared.

    Every count must be 0; `max_similarity` shows how far the closest docstrings are from the threshold.
    """
    code = code_groups(splits)

    def doc_tokens(items):
        return [tuple(mask_text(c["doc"], numbers=True, extra=c["args"]).split()) for c in items]

    report: dict = {"threshold": dedup.NEAR_DUPLICATE_THRESHOLD, "code": {}, "math": {}, "commonsense": {}}
    for pair, (a, b) in {f"{x}|{y}": (code[x], code[y]) for x, y in (("train", "dev"), ("train", "test"),
                                                                       ("dev", "test"))}.items():
        near_docs, best = dedup.near_pairs(doc_tokens(a), doc_tokens(b))
        report["code"][pair] = {
            "bodies_exact": dedup.shared((c["body"] for c in a), (c["body"] for c in b)),
            "bodies_near": dedup.shared((dedup.code_skeleton(c["body"]) for c in a),
                                        (dedup.code_skeleton(c["body"]) for c in b)),
            "docstrings_exact": dedup.shared((c["doc"] for c in a), (c["doc"] for c in b)),
            "docstrings_near": near_docs,
            "docstrings_max_similarity": round(best, 4),
            "function_names": dedup.shared((c["fname"] for c in a), (c["fname"] for c in b)),
        }
    math = {s: splits[f"math/{s}"] for s in ("calibration", "dev", "test", "pretrain") if f"math/{s}" in splits}
    for x, y in combinations(math, 2):
        qa, qb = [i["question"] for i in math[x]], [i["question"] for i in math[y]]
        report["math"][f"{x}|{y}"] = {
            "questions_exact": dedup.shared(qa, qb),
            "questions_normalised": dedup.shared(map(dedup.normalise_text, qa), map(dedup.normalise_text, qb)),
            "questions_near": dedup.shared((mask_text(q) for q in qa), (mask_text(q) for q in qb)),
        }
    cs = {s: splits[f"commonsense/{s}"] for s in ("calibration", "dev", "test")}
    for x, y in combinations(cs, 2):
        report["commonsense"][f"{x}|{y}"] = {
            "questions_exact": dedup.shared(map(_stem, cs[x]), map(_stem, cs[y])),
            "questions_normalised": dedup.shared((dedup.normalise_text(_stem(r)) for r in cs[x]),
                                                 (dedup.normalise_text(_stem(r)) for r in cs[y])),
            "facts": dedup.shared((f"{r['question']['question_concept']}|{_csqa_answer(r)}" for r in cs[x]),
                                  (f"{r['question']['question_concept']}|{_csqa_answer(r)}" for r in cs[y])),
        }
    return report


def dedup_violations(report: dict) -> list[str]:
    """Every nonzero duplicate count of a `dedup_report`, as `domain pair key = n`."""
    out = []
    for domain in ("code", "math", "commonsense"):
        for pair, counts in report[domain].items():
            out += [f"{domain} {pair} {k} = {v}" for k, v in counts.items() if k != "docstrings_max_similarity" and v]
    return out


def format_dedup_report(report: dict) -> str:
    """The report as aligned text lines, one per domain and split pair."""
    lines = [f"deduplication across splits (near-duplicate threshold {report['threshold']}):"]
    for domain in ("code", "math", "commonsense"):
        for pair, counts in report[domain].items():
            lines.append(f"  {domain:<11} {pair:<22} " + "  ".join(f"{k}={v}" for k, v in counts.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

#: Split names of each domain, in the order they are written.
SPLITS = {
    "math": ("pretrain", "calibration", "dev", "test"),
    "commonsense": ("pretrain", "calibration", "dev", "test"),
    "code": ("pretrain", "train", "dev", "test"),
}


def generate(seed: int = DEFAULT_SEED, sizes: MicroSizes = MicroSizes()) -> dict[str, list[dict]]:
    """All splits as {"<domain>/<split>": records}, in the order they are written."""
    parts = {"math": _math_splits(seed, sizes), "commonsense": _commonsense_splits(seed, sizes),
             "code": _code_splits(seed, sizes)}
    return {f"{domain}/{split}": parts[domain][split] for domain, names in SPLITS.items() for split in names}


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def file_name(key: str) -> str:
    """Relative file path of a split key, e.g. `code/train` -> `code/train.json`."""
    return f"{key}.json" if key == "code/train" else f"{key}.jsonl"


def write(out_dir: str | Path, seed: int = DEFAULT_SEED, sizes: MicroSizes = MicroSizes(),
          include_pretrain: bool = True) -> dict[str, Path]:
    """Generate every split, check that no two splits share an item, and write them under `out_dir`
    with GENERATOR.json (sizes, counts, the deduplication report); returns the paths.

    Raises `RuntimeError` (and writes nothing) when the deduplication report has a nonzero count.
    """
    out_dir = Path(out_dir)
    splits = generate(seed, sizes)
    report = dedup_report(splits)
    violations = dedup_violations(report)
    if violations:
        raise RuntimeError("the micro splits share items: " + "; ".join(violations))
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
        "generator": "tools.micro.world",
        "version": GENERATOR_VERSION,
        "seed": seed,
        "sizes": asdict(sizes),
        "counts": {k: len(v) for k, v in splits.items()},
        "code_target_families": list(TARGET_FAMILIES),
        "code_pretrain_families": list(PRETRAIN_FAMILIES),
        "dedup": report,
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
    meta = json.loads((Path(args.out) / "GENERATOR.json").read_text(encoding="utf-8"))
    print(format_dedup_report(meta["dedup"]))


if __name__ == "__main__":
    main()
