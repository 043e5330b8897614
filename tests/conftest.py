"""Shared fixtures: a tiny random Qwen3 backbone saved as a Hugging Face folder, a tiny benchmark in the
real datasets' formats, the real-data folder (skipped when absent), and a helper that runs `run.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The longest tests (minutes each), started first: with `-n 2`, one collected last keeps a worker busy alone at the end.
LONGEST_FIRST = ("tests/test_new_method.py::", "tests/experiments/test_micro_run.py::")


def pytest_collection_modifyitems(config, items):
    """Move the tests of LONGEST_FIRST to the front, in their order; the rest keep theirs."""
    rank = {prefix: i for i, prefix in enumerate(LONGEST_FIRST)}

    def key(item):
        return next((rank[p] for p in LONGEST_FIRST if item.nodeid.startswith(p)), len(LONGEST_FIRST))

    items.sort(key=key)  # stable: the order within each group is kept
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
MICRO_BACKBONE = REPO / "assets" / "micro" / "backbone"
MICRO_DATA = REPO / "assets" / "micro" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real datasets folder next to the repo (`../shared/data`); skips the test when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets folder {SHARED_DATA} is absent (a fresh clone without ../shared/data)")
    return SHARED_DATA


def build_tiny_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer (vocab 320) trained on `texts`, wrapped as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|pad|>", "<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>")


def tiny_math(n: int, start: int = 0) -> list[dict]:
    return [
        {"question": f"Ann has {i} apples and buys {i % 7 + 1} more. How many apples does Ann have?",
         "answer": f"{i} + {i % 7 + 1} = {i + i % 7 + 1}\n#### {i + i % 7 + 1}"}
        for i in range(start, start + n)
    ]


def tiny_choice(n: int, start: int = 0) -> list[dict]:
    things = ["cup", "book", "shoe", "lamp", "spoon", "chair", "coat", "pen"]
    places = ["kitchen", "library", "closet", "office"]
    out = []
    for i in range(start, start + n):
        answer = places[i % 4]
        choices = [answer] + [p for p in places if p != answer][:2]
        choices = choices[i % 3:] + choices[: i % 3]
        labels = ["A", "B", "C"]
        out.append({
            "id": f"q{i}", "answerKey": labels[choices.index(answer)],
            "question": {"stem": f"Where is a {things[i % 8]} number {i} kept?",
                         "choices": [{"label": l, "text": t} for l, t in zip(labels, choices)]},
        })
    return out


def tiny_code(n: int, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + n):
        prompt = f'def add_{i}(x):\n    """Return x plus {i}."""\n'
        out.append({"task_id": f"Tiny/{i}", "prompt": prompt, "canonical_solution": f"    return x + {i}\n",
                    "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n", "entry_point": f"add_{i}"})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="session")
def tiny_benchmark_dir(tmp_path_factory) -> Path:
    """A benchmark folder laid out like the micro benchmark, with a handful of items per split."""
    root = tmp_path_factory.mktemp("tiny_benchmark")
    write_jsonl(root / "math" / "calibration.jsonl", tiny_math(6, 0))
    write_jsonl(root / "math" / "dev.jsonl", tiny_math(5, 30))
    write_jsonl(root / "math" / "test.jsonl", tiny_math(5, 50))
    write_jsonl(root / "commonsense" / "calibration.jsonl", tiny_choice(6, 0))
    write_jsonl(root / "commonsense" / "dev.jsonl", tiny_choice(5, 30))
    write_jsonl(root / "commonsense" / "test.jsonl", tiny_choice(5, 50))
    for split, start in (("dev_far", 70), ("test_far", 90)):  # far items (benchmark.far of micro_v3, the default)
        write_jsonl(root / "math" / f"{split}.jsonl", tiny_math(4, start))
        write_jsonl(root / "commonsense" / f"{split}.jsonl", tiny_choice(4, start))
    write_jsonl(root / "code" / "dev.jsonl", tiny_code(4, 200))
    write_jsonl(root / "code" / "test.jsonl", tiny_code(4, 100))
    train = [{"instruction": "Complete the following Python function.", "input": p["prompt"],
              "response": p["canonical_solution"]} for p in tiny_code(24, 0)]
    (root / "code" / "train.json").write_text(json.dumps(train, indent=1))
    return root


@pytest.fixture(scope="session")
def tiny_backbone_dir(tmp_path_factory) -> Path:
    """A random 2-layer Qwen3 (hidden 32) with a BPE tokenizer, saved as a Hugging Face folder."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from experiments.prompts import code_problem_prompt, math_prompt

    root = tmp_path_factory.mktemp("tiny_backbone")
    texts = [math_prompt(m) + " " + m["answer"] for m in tiny_math(40)]
    texts += [code_problem_prompt(c) + c["canonical_solution"] for c in tiny_code(30)]
    texts += ["Question: Where is it kept?\nChoices: kitchen, library, closet, office\nAnswer: kitchen"]
    tok = build_tiny_tokenizer(texts)
    tok.save_pretrained(root)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    Qwen3ForCausalLM(config).save_pretrained(root)
    return root


def backbone_config(path, **overrides):
    """A typed backbone config: conf/backbone/micro.yaml's values with `path` and `overrides`."""
    from omegaconf import OmegaConf

    from experiments.config import BackboneConfig

    raw = OmegaConf.load(REPO / "conf" / "backbone" / "micro.yaml")
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(BackboneConfig), raw, {"path": str(path), **overrides})


def tiny_overrides(backbone: Path, bench: Path, run_root: Path, cache_dir: Path, **extra: str) -> list[str]:
    """Hydra overrides that point a run at the tiny backbone and benchmark, with a tiny budget."""
    ov = {
        "backbone.path": str(backbone),
        "backbone.train_batch_size": "4",
        "backbone.eval_batch_size": "8",
        "backbone.max_length": "96",
        "benchmark.target.train.local": str(bench / "code"),
        "benchmark.target.evaluation.micro_code.local": str(bench / "code"),
        "benchmark.target.dev.micro_code.local": str(bench / "code"),
        "benchmark.retained.math.local": str(bench / "math"),
        "benchmark.retained.commonsense.local": str(bench / "commonsense"),
        "train.steps": "6",
        "train.warmup_steps": "0",
        "train.checkpoint_every": "2",
        "train.progress": "false",
        "eval.max_new_tokens_math": "8",
        "eval.max_new_tokens_choice": "4",
        "eval.max_new_tokens_code": "8",
        "eval.sandbox_timeout_s": "5",
        "eval.cache_dir": str(cache_dir),
        "run_root": str(run_root),
    }
    ov.update(extra)
    return [f"{k}={v}" for k, v in ov.items()]


def run_cli(args: list[str], timeout: float = 300, env: Optional[dict] = None, **popen) -> subprocess.CompletedProcess:
    """Run `python run.py ARGS` from the repo root (offline, `env` added to the environment); returns the completed
    process (text output)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "run.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, **popen)


def mounted_tmpfs(path: Path, size: str):
    """A tmpfs of `size` (mount's notation, e.g. "64k") mounted at `path` for the duration of a fixture (yields it);
    skips where this user or machine cannot mount one."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (mount -t tmpfs)")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The per-job override lists of `python run.py -m OVERRIDES`, as Hydra's basic sweeper makes them: the config
    is loaded in multirun mode (sweep values allowed), the `hydra.sweeper.params` it sets (a preset's) go before the
    command line's, and the product is split into jobs (`glob(...)` lists the group's options)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))
    cfg = loader.load_configuration("config", list(overrides), RunMode.MULTIRUN)
    params = [f"{k}={v}" for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *overrides])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


# -- the tiny backbone and benchmark composed into a real run config, with a real reference cache of the tiny
# -- base (built once per session, float32 log-probs): what the method tests (baselines, ATLAS) prepare on.
@dataclass
class Tiny:
    """A validated run config on the tiny backbone + benchmark, its data and the base's reference cache."""

    cfg: Any
    tokenizer: Any
    benchmark: Any
    reference: Any
    examples: list
    cache_dir: Path


def compose_tiny(backbone: Path, bench: Path, run_root: Path, cache_dir: Path, *extra: str):
    from hydra import compose, initialize_config_dir

    from experiments.config import validate_config

    overrides = tiny_overrides(backbone, bench, run_root, cache_dir, **{"++eval.logprob_dtype": "float32"})
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate_config(compose("config", overrides=["method=lora", *overrides, *extra]))


@pytest.fixture(scope="session")
def tiny(tiny_backbone_dir, tiny_benchmark_dir, tmp_path_factory) -> Tiny:
    from experiments.backbones import backbone_key, load_backbone
    from experiments.config import eval_config
    from experiments.data.benchmark import build_benchmark
    from experiments.evaluation.reference_cache import get_reference
    from experiments.job import encode_target

    root = tmp_path_factory.mktemp("baselines")
    cfg = compose_tiny(tiny_backbone_dir, tiny_benchmark_dir, root / "runs", root / "cache" / "reference")
    benchmark = build_benchmark(cfg.benchmark)
    base, tok = load_backbone(cfg.backbone)
    reference = get_reference(base, tok, benchmark, eval_config(cfg), backbone_key(cfg.backbone),
                              cfg.backbone.chat_template)
    examples = encode_target(benchmark, tok, cfg.backbone.chat_template, cfg.backbone.max_length)
    return Tiny(cfg, tok, benchmark, reference, examples, root / "cache")
