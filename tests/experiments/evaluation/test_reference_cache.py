import threading
import time
from types import SimpleNamespace

import pytest
import torch
from eval_tiny_lm import tiny_model, tiny_tokenizer

import experiments.evaluation.reference_cache as rc
from experiments import prompts as P
from experiments.data.benchmark import RetainedDomain
from experiments.evaluation.answers import extract_math_answer
from experiments.evaluation.config import EvalConfig
from experiments.evaluation.generation import generate
from experiments.evaluation.scoring import score_choices


def _math(q, a):
    return {"question": f"What is {q}?", "answer": f"{q} = {a}\n#### {a}"}


def _choice(i, q, choices, answer):
    return {"id": f"c{i}", "question": q, "choices": choices, "labels": ["A", "B", "C"][: len(choices)],
            "answer_index": answer}


def fake_benchmark():
    return SimpleNamespace(
        name="fake",
        target_eval=[],
        retained={
            "math": RetainedDomain("math", "math",
                                   calibration=[_math("1 + 2", 3), _math("4 + 4", 8)],
                                   evaluation=[_math("12 + 7", 19), _math("3 + 3", 6), _math("9 - 2", 7)]),
            "commonsense": RetainedDomain("commonsense", "choice",
                                          calibration=[_choice(0, "Where is the car?", ["garden", "kitchen"], 0)],
                                          evaluation=[_choice(1, "Where do you sleep?", ["bedroom", "court", "ocean"], 0),
                                                      _choice(2, "What is in the kitchen?", ["a", "car", "the"], 1)]),
        },
    )


def _cfg(tmp_path, **kw):
    base = dict(cache_dir=str(tmp_path / "cache"), max_new_tokens_math=8, max_new_tokens_choice=4,
                generation_batch_size=2, scoring_batch_size=3, logprob_dtype="float32")
    base.update(kw)
    return EvalConfig.from_group(**base).validate()


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return tiny_model(tok, seed=3), tok


class ForwardCounter:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += 1

    def close(self):
        self.handle.remove()


def test_cold_build_then_hit_without_forward(lm, tmp_path):
    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path)
    counter = ForwardCounter(model)
    try:
        cold = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
        built = counter.n
        warm = rc.get_reference(lambda: model, tok, bench, cfg, "tiny/test", chat_template=False)
    finally:
        counter.close()
    assert built > 0 and counter.n == built, "a cache hit ran the base model"
    assert not cold.stats["hit"] and warm.stats["hit"]
    assert warm.stats["build_s"] == pytest.approx(cold.stats["build_s"]) and cold.stats["build_s"] > 0
    assert cold.path == warm.path and cold.key[:24] in cold.path.name
    assert cold.mode == "full"
    for name in bench.retained:
        for split in rc.SPLITS:
            a, b = cold.domains[name].split(split), warm.domains[name].split(split)
            assert a.response_ids == b.response_ids and a.prompts == b.prompts
            assert torch.equal(a.logprobs.full, b.logprobs.full)
            assert a.logprobs.full.shape == (sum(len(r) for r in a.response_ids), len(tok))
    # what is cached is what the base does
    ev = warm.domains["math"].evaluation
    texts = [P.math_prompt(it) for it in bench.retained["math"].evaluation]
    assert ev.prompts == texts
    sampled = generate(model, tok, texts, max_new_tokens=8, do_sample=True, seed=cfg.reference_seed)
    greedy = generate(model, tok, texts, max_new_tokens=8)
    assert ev.response_ids == sampled.token_ids
    assert ev.greedy_texts == greedy.texts
    assert ev.greedy_answers == [extract_math_answer(t) for t in greedy.texts]
    assert warm.domains["math"].calibration.greedy_answers is None
    ch = warm.domains["commonsense"].evaluation
    scores = score_choices(model, tok, bench.retained["commonsense"].evaluation, chat_template=False, batch_size=2)
    assert ch.choice == scores.choice and ch.choice_norm == scores.choice_norm
    for cached_ll, live_ll in zip(ch.choice_loglik, scores.loglik):
        assert cached_ll == pytest.approx(live_ll, abs=1e-4)


def test_key_depends_on_what_the_contents_depend_on(lm, tmp_path):
    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path)
    key = rc.reference_key(model, tok, bench, cfg, "tiny/test", False)[0]
    assert key == rc.reference_key(model, tok, fake_benchmark(), cfg, "tiny/test", False)[0]
    # ignored: batch sizes, target settings, lm-eval settings
    same = _cfg(tmp_path, generation_batch_size=7, scoring_batch_size=1, pass_k=[1, 2], n_samples=2)
    assert rc.reference_key(model, tok, bench, same, "tiny/test", False)[0] == key
    changed = {
        "seed": (model, bench, _cfg(tmp_path, reference_seed=1), "tiny/test"),
        "greedy": (model, bench, _cfg(tmp_path, reference_sampling=False), "tiny/test"),
        "top_k": (model, bench, _cfg(tmp_path, top_k=5), "tiny/test"),
        "max_items": (model, bench, _cfg(tmp_path, max_items_per_domain=1), "tiny/test"),
        "backbone": (model, bench, cfg, "tiny/other"),
        "weights": (tiny_model(tok, seed=4), bench, cfg, "tiny/test"),
    }
    edited = fake_benchmark()
    edited.retained["math"].evaluation[0]["answer"] = "changed"
    changed["items"] = (model, edited, cfg, "tiny/test")
    keys = {name: rc.reference_key(m, tok, b, c, k, False)[0] for name, (m, b, c, k) in changed.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(keys)
    # one weight entry changed
    other = tiny_model(tok, seed=3)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-3
    assert rc.model_fingerprint(other) != rc.model_fingerprint(model)
    assert rc.model_fingerprint(tiny_model(tok, seed=3)) == rc.model_fingerprint(model)


def test_topk_mode_when_over_budget_and_greedy_reuse(lm, tmp_path):
    model, tok = lm
    bench = fake_benchmark()
    cfg = _cfg(tmp_path, logprob_budget_mb=1e-4, top_k=6, reference_sampling=False, max_items_per_domain=2)
    ref = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    assert ref.mode == "topk"
    ev = ref.domains["math"].evaluation
    assert len(ev.items) == 2 and len(ref.domains["math"].calibration.items) == 2
    n = sum(len(r) for r in ev.response_ids)
    assert ev.logprobs.topk_logprobs.shape == (n, 6) and ev.logprobs.tail_logmass.shape == (n,)
    assert ev.greedy_texts == ev.response_texts  # greedy reference responses are reused as the answers
    assert ev.response_ids == generate(model, tok, ev.prompts, max_new_tokens=8).token_ids


def test_concurrent_calls_build_once(lm, tmp_path, monkeypatch):
    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path, max_items_per_domain=1)
    builds = []
    real_build = rc._build

    def slow_build(*args, **kwargs):
        builds.append(threading.get_ident())
        time.sleep(0.5)  # both callers are past the "already built?" check by now
        return real_build(*args, **kwargs)

    monkeypatch.setattr(rc, "_build", slow_build)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def worker():
        try:
            barrier.wait()
            results.append(rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(builds) == 1
    assert sorted(r.stats["hit"] for r in results) == [False, True]
    assert results[0].domains["math"].evaluation.response_ids == results[1].domains["math"].evaluation.response_ids


def test_a_build_says_when_it_starts_and_how_long_it_took_and_a_hit_says_nothing(lm, tmp_path):
    import logging
    import re

    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path, max_items_per_domain=1)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("suite.eval")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `logger.level =`: setLevel clears the cached "is INFO enabled" answers
    try:
        ref = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
        built = list(lines)
        rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    what = f"reference cache: the base model's responses and log-probs, built once into {ref.path}"
    assert built[0] == what + " ..." and len(built) == 2
    seconds = float(re.fullmatch(re.escape(what) + r": done in (\d+\.\d) s", built[1]).group(1))
    assert seconds == pytest.approx(ref.stats["build_s"], abs=0.1)
    assert lines == built  # the hit: nothing more


def test_failed_build_leaves_nothing_behind(lm, tmp_path, monkeypatch):
    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path, max_items_per_domain=1)

    def boom(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(rc, "score_choices", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    leftovers = [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_an_altered_cache_is_detected_rebuilt_and_the_base_against_itself_is_zero_again(lm, tmp_path, caplog):
    """A third of one split's cached log-prob rows perturbed, the safetensors header intact: read as it is, the
    base measured against itself would show a large KL. The load detects the checksum mismatch, names the entry
    in one warning line and rebuilds it; KL is 0 again. A truncated file is rebuilt the same way."""
    import json

    from safetensors.torch import load_file, save_file

    from experiments.evaluation.evaluate import ImpossibleMetricError, check_kl
    from experiments.evaluation.generation import pad_token_id
    from experiments.evaluation.retained_kl import CachedLogprobs, retained_kl

    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path)
    ref = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    manifest = json.loads((ref.path / "manifest.json").read_text())
    meta = manifest["domains"]["math"]["splits"]["evaluation"]
    path = ref.path / meta["tensors"]
    tensors = load_file(str(path))
    full = tensors["full"].clone()
    full[::3] = torch.log_softmax(torch.randn(full[::3].shape, generator=torch.Generator().manual_seed(0)) * 4, -1)
    save_file({**tensors, "full": full}, str(path))
    ev = ref.domains["math"].evaluation

    def kl(cached):
        return retained_kl(model, ev.prompt_ids, ev.response_ids, cached, pad_id=pad_token_id(tok), batch_size=2,
                           progress=False)

    assert kl(CachedLogprobs.from_tensors("full", "float32", {**tensors, "full": full}))["kl_token_mean"] > 0.1
    with caplog.at_level("WARNING", logger="suite.cache"):
        again = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    assert not again.stats["hit"]
    assert [r.getMessage() for r in caplog.records] == [
        f"reference cache {ref.path} is broken: {meta['tensors']} does not match its checksum (truncated or "
        "altered); rebuilding it"]
    assert abs(kl(again.domains["math"].evaluation.logprobs)["kl_token_mean"]) < 1e-6

    path.write_bytes(path.read_bytes()[:100])  # truncated
    rebuilt = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    assert not rebuilt.stats["hit"] and rc.get_reference(model, tok, bench, cfg, "tiny/test", False).stats["hit"]

    check_kl("math", {"kl_token_mean": 0.0, "kl_seq_mean": -5e-4, "n_tokens": 3}, path)  # rounding: accepted
    check_kl("math", {"kl_token_mean": float("nan"), "kl_seq_mean": float("nan"), "n_tokens": 0}, path)
    for bad in (float("nan"), float("inf"), -0.01):
        with pytest.raises(ImpossibleMetricError, match="cannot be right"):
            check_kl("math", {"kl_token_mean": bad, "kl_seq_mean": 0.0, "n_tokens": 3}, path)


def test_each_split_is_stored_by_its_own_size_so_calibration_does_not_depend_on_the_evaluation_split(lm, tmp_path):
    """What methods train on (the calibration split's log-probs) is the same whichever evaluation split a benchmark
    carries, even where both splits together exceed the budget (a dev run and a test run train the same model)."""
    model, tok = lm
    small = fake_benchmark()
    big = fake_benchmark()
    big.retained["math"] = RetainedDomain("math", "math", calibration=small.retained["math"].calibration,
                                          evaluation=[_math(f"{i} + {i}", 2 * i) for i in range(14)])

    def tokens(ref, split):
        return sum(len(r) for d in ref.domains.values() for r in d.split(split).response_ids)

    roomy = rc.get_reference(model, tok, big, _cfg(tmp_path / "roomy"), "tiny/test", chat_template=False)
    width = 4 * len(tok)  # float32 log-probs of one token
    n_cal, n_big = tokens(roomy, "calibration"), tokens(roomy, "evaluation")
    budget_mb = 2 * n_cal * width * 1.05 / 2**20  # the calibration split fits its half of it...
    assert (n_cal + n_big) * width > budget_mb * 2**20 and n_big * width > budget_mb * 2**20 / 2  # ...the sum does not
    refs = {name: rc.get_reference(model, tok, bench, _cfg(tmp_path / name, logprob_budget_mb=budget_mb), "tiny/test",
                                   chat_template=False) for name, bench in (("small", small), ("big", big))}
    assert refs["big"].modes == {"calibration": "full", "evaluation": "topk"} and refs["big"].mode == "topk"
    assert refs["small"].modes["calibration"] == "full"
    for name in small.retained:
        a, b = refs["small"].domains[name].calibration, refs["big"].domains[name].calibration
        assert a.response_ids == b.response_ids and torch.equal(a.logprobs.full, b.logprobs.full)


def test_an_edited_manifest_is_detected_rebuilt_and_the_base_against_itself_is_zero_again(lm, tmp_path, caplog):
    """The manifest holds the base's response ids, greedy answers and choices. Edited (still valid JSON, key and file
    checksums intact), it no longer matches its own checksum: the load names it in one warning line and rebuilds the
    entry, so the base measured against itself shows no KL and no changed answer or choice. The rebuild removes the
    temporary folder a killed build of the entry left."""
    import json
    import subprocess
    import sys

    from experiments.evaluation.generation import pad_token_id
    from experiments.evaluation.retained_kl import retained_kl

    model, tok = lm
    bench, cfg = fake_benchmark(), _cfg(tmp_path)
    ref = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    manifest_path = ref.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    math_ev = manifest["domains"]["math"]["splits"]["evaluation"]
    math_ev["response_ids"] = [list(reversed(r)) for r in math_ev["response_ids"]]
    math_ev["greedy_answers"] = ["999999"] * len(math_ev["greedy_answers"])
    choice_ev = manifest["domains"]["commonsense"]["splits"]["evaluation"]
    choice_ev["choice"] = [(c + 1) % 2 for c in choice_ev["choice"]]
    manifest_path.write_text(json.dumps(manifest))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed_build = ref.path.parent / f".{ref.path.name}.tmp-{int(gone.stdout)}"  # what a SIGKILLed build leaves
    killed_build.mkdir()

    with caplog.at_level("WARNING", logger="suite.cache"):
        again = rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False)
    assert not again.stats["hit"] and not killed_build.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"reference cache {ref.path} is broken: manifest.json does not match its checksum (edited or altered); "
        "rebuilding it"]
    ev = again.domains["math"].evaluation
    assert ev.response_ids == ref.domains["math"].evaluation.response_ids
    assert ev.greedy_answers == ref.domains["math"].evaluation.greedy_answers
    assert again.domains["commonsense"].evaluation.choice == ref.domains["commonsense"].evaluation.choice
    kl = retained_kl(model, ev.prompt_ids, ev.response_ids, ev.logprobs, pad_id=pad_token_id(tok), batch_size=2,
                     progress=False)
    assert abs(kl["kl_token_mean"]) < 1e-6
    assert rc.get_reference(model, tok, bench, cfg, "tiny/test", chat_template=False).stats["hit"]
