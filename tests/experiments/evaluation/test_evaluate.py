import json

import pytest
from eval_tiny_lm import perturbed_copy, tiny_model, tiny_tokenizer
from omegaconf import OmegaConf
from test_reference_cache import fake_benchmark

import experiments.evaluation.evaluate as ev
from experiments.evaluation.answers import extract_math_answer
from experiments.evaluation.config import (
    CACHE_ENV,
    EvalConfig,
    as_eval_config,
    resolve_cache_dir,
)
from experiments.evaluation.generation import GenerationOutput
from experiments.evaluation.retained_kl import model_kl

PROBLEMS = [
    {"task_id": "t/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"},
    {"task_id": "t/1", "prompt": "def neg(a):\n", "canonical_solution": "    return -a\n",
     "test": "def check(candidate):\n    assert candidate(4) == -4\n", "entry_point": "neg"},
]


def bench_with_code():
    b = fake_benchmark()
    b.target_eval = [dict(p) for p in PROBLEMS]
    return b


def _cfg(tmp_path, **kw):
    base = dict(cache_dir=str(tmp_path / "cache"), max_new_tokens_math=8, max_new_tokens_choice=4,
                max_new_tokens_code=8, generation_batch_size=4, scoring_batch_size=4,
                logprob_dtype="float32", sandbox_timeout_s=5.0, sandbox_workers=2)
    base.update(kw)
    return EvalConfig.from_group(**base)


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return tiny_model(tok, seed=21), tok


def test_base_against_itself_is_zero_everywhere(lm, tmp_path):
    model, tok = lm
    bench, cfg = bench_with_code(), _cfg(tmp_path, pass_k=[1, 2], n_samples=2)
    first = ev.evaluate_run(model, model, tok, bench, cfg, "tiny/e2e", chat_template=False, progress=False)
    second = ev.evaluate_run(model, lambda: model, tok, bench, cfg, "tiny/e2e", chat_template=False,
                             progress=False)
    assert first["timing"]["reference_hit"] is False and second["timing"]["reference_hit"] is True
    assert second["timing"]["reference_build_s"] == 0.0 and first["timing"]["reference_build_s"] > 0
    for key in ("kl_s", "generation_s", "execution_s", "total_s", "decode_tokens_per_s"):
        assert first["timing"][key] > 0, key
    for res in (first, second):
        assert set(res["retained_near"]) == {"math", "commonsense"}
        for domain, m in res["retained_near"].items():
            assert abs(m["kl_token_mean"]) < 1e-6 and abs(m["kl_seq_mean"]) < 1e-6, (domain, m)
            assert m["n"] == len(bench.retained[domain].evaluation) and m["n_tokens"] > 0
        math, cs = res["retained_near"]["math"], res["retained_near"]["commonsense"]
        assert math["answer_change_rate"] == {"rate": 0.0, "n": 3}
        assert math["base_accuracy"] == math["adapted_accuracy"] and math["base_accuracy"]["n"] == 3
        assert cs["choice_flip_rate"] == {"rate": 0.0, "n": 2} and cs["choice_flip_rate_norm"]["rate"] == 0.0
        assert cs["base_accuracy"] == cs["adapted_accuracy"] and cs["base_accuracy_norm"] == cs["adapted_accuracy_norm"]
        assert abs(res["retained_kl_mean"]) < 1e-6
        t = res["target"]
        assert t["n_problems"] == 2 and 0.0 <= t["pass@1"] <= 1.0 and 0.0 <= t["pass@2"] <= 1.0
        assert sum(t["failures"].values()) <= 2 + 4
    assert first["target"] == second["target"]


def test_adapted_model_kl_matches_live_computation(lm, tmp_path):
    model, tok = lm
    adapted = perturbed_copy(model, tok, scale=0.3, seed=3)
    bench, cfg = bench_with_code(), _cfg(tmp_path, max_target_problems=1)
    res = ev.evaluate_run(adapted, model, tok, bench, cfg, "tiny/e2e", chat_template=False, progress=False)
    ref = ev.get_reference(model, tok, bench, cfg, "tiny/e2e", False)
    kls = []
    for name, m in res["retained_near"].items():
        split = ref.domains[name].evaluation
        live = model_kl(model, adapted, split.prompt_ids, split.response_ids, pad_id=tok.pad_token_id,
                        batch_size=2)["exact"]
        assert m["kl_token_mean"] == pytest.approx(live["kl_token_mean"], rel=1e-4) and m["kl_token_mean"] > 1e-3
        assert m["kl_seq_mean"] == pytest.approx(live["kl_seq_mean"], rel=1e-4)
        kls.append(m["kl_token_mean"])
    assert res["retained_kl_mean"] == pytest.approx(sum(kls) / len(kls))
    assert res["target"]["n_problems"] == 1


@pytest.mark.sandbox
def test_code_completions_run_in_the_sandbox(lm, tmp_path, monkeypatch, capsys):
    """Greedy completions: the right body for one problem, a wrong one for the other -> pass@1 = 0.5; the checks
    advance a progress bar of their own."""
    model, tok = lm
    real = ev._timed_generate

    def fake(timing, m, t, prompts, **kw):
        if not kw.get("desc", "").startswith("code"):
            return real(timing, m, t, prompts, **kw)
        texts = ["    return a + b\n" if "def add" in p else "    return a\n" for p in prompts]
        return GenerationOutput(texts=texts, token_ids=[[1]] * len(texts), stopped=[True] * len(texts))

    monkeypatch.setattr(ev, "_timed_generate", fake)
    res = ev.evaluate_run(model, model, tok, bench_with_code(), _cfg(tmp_path), "tiny/e2e", chat_template=False,
                          progress=True)
    assert "sandbox: 100%" in capsys.readouterr().err
    assert res["target"]["pass@1"] == pytest.approx(0.5)
    assert res["target"]["n_problems"] == 2 and res["target"]["failures"] == {"failed": 1}
    assert res["target"]["sandbox"]["separate_test_process"] and res["target"]["sandbox"]["mode"]
    assert isinstance(res["target"]["sandbox"]["syscall_filter_applied"], bool)
    assert isinstance(res["target"]["sandbox"]["cpu_bounded_in_total"], bool)
    samples = res["code_samples"]
    assert [(s["task_id"], s["kind"], s["status"]) for s in samples] == [("t/0", "greedy", "passed"), ("t/1", "greedy", "failed")]
    assert samples[1]["completion"] == "    return a\n" and "neg(4) returned 4" in samples[1]["reason"]


@pytest.mark.sandbox
def test_a_completion_whose_check_cannot_be_built_is_scored_invalid(lm, tmp_path, monkeypatch):
    """A completion the parser cannot take (3,000 nested unary minus signs: RecursionError) is `invalid` with the
    reason; the other completions are still checked and pass@k is reported."""
    model, tok = lm
    real = ev._timed_generate
    nested = "    return " + "-" * 3000 + "a\n"

    def fake(timing, m, t, prompts, **kw):
        if not kw.get("desc", "").startswith("code"):
            return real(timing, m, t, prompts, **kw)
        texts = ["    return a + b\n" if "def add" in p else nested for p in prompts]
        return GenerationOutput(texts=texts, token_ids=[[1]] * len(texts), stopped=[True] * len(texts))

    monkeypatch.setattr(ev, "_timed_generate", fake)
    res = ev.evaluate_run(model, model, tok, bench_with_code(), _cfg(tmp_path, pass_k=[1, 2], n_samples=2), "tiny/e2e",
                          chat_template=False, progress=False)
    target = res["target"]
    assert target["pass@1"] == pytest.approx(0.5) and target["pass@2"] == pytest.approx(0.5)
    assert target["failures"] == {"invalid": 3}
    invalid = [s for s in res["code_samples"] if s["status"] == "invalid"]
    assert len(invalid) == 3 and all("could not be parsed: RecursionError" in s["reason"] for s in invalid)


def test_a_sandbox_that_cannot_run_stops_the_evaluation_before_generating(lm, tmp_path, monkeypatch):
    import sandbox

    model, tok = lm
    generated = []
    real = ev._timed_generate
    monkeypatch.setattr(ev, "_timed_generate", lambda *a, **k: generated.append(k.get("desc")) or real(*a, **k))
    monkeypatch.setenv("ATLAS_SANDBOX_MODE", "no-such-mode")
    sandbox.probe.reset()
    try:
        with pytest.raises(RuntimeError, match="no sandbox mode works on this machine"):
            ev.evaluate_run(model, model, tok, bench_with_code(), _cfg(tmp_path), "tiny/e2e", chat_template=False, progress=False)
        assert not [d for d in generated if d and d.startswith("code")]
    finally:
        monkeypatch.delenv("ATLAS_SANDBOX_MODE")
        sandbox.probe.reset()


@pytest.mark.slow
def test_lm_eval_deltas_for_local_tasks(lm, tmp_path, monkeypatch):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    model, tok = lm
    cfg = _cfg(tmp_path, lm_eval_tasks=["atlas_math", "atlas_commonsense"], lm_eval_limit=2,
               max_target_problems=1)
    res = ev.evaluate_run(model, model, tok, bench_with_code(), cfg, "tiny/e2e", chat_template=False, progress=False)
    out = res["lm_eval"]
    assert out["adapted"]["atlas_math"]["n"] == 2 and "exact_match" in out["adapted"]["atlas_math"]
    assert set(out["adapted"]["atlas_commonsense"]) >= {"acc", "acc_norm", "n"}
    assert out["delta"]["atlas_commonsense"] == {"acc": 0.0, "acc_norm": 0.0}
    assert out["base"] == out["adapted"]
    cached = list(ev.get_reference(model, tok, bench_with_code(), cfg, "tiny/e2e", False).path.glob("lm_eval_base-*.json"))
    assert len(cached) == 1
    stored = json.loads(cached[0].read_text())
    stored["results"]["atlas_commonsense"]["acc"] = 0.123  # altered, still valid JSON: detected and recomputed
    cached[0].write_text(json.dumps(stored))
    again = ev.evaluate_run(model, model, tok, bench_with_code(), cfg, "tiny/e2e", chat_template=False, progress=False)
    assert again["lm_eval"]["base"] == out["base"] and json.loads(cached[0].read_text())["results"] == out["base"]
    bad = _cfg(tmp_path, lm_eval_tasks=["atlas_nope"], max_target_problems=1)
    with pytest.raises(ValueError, match="atlas_nope"):
        ev.evaluate_run(model, model, tok, bench_with_code(), bad, "tiny/e2e", chat_template=False, progress=False)


@pytest.mark.parametrize("key,value,allowed", [
    ("generation_batch_size", 0, ">= 1"),
    ("logprob_dtype", "bfloat16", "float16"),
    ("pass_k", [1, 5], "n_samples"),
    ("sample_top_p", 1.5, "(0, 1]"),
    ("max_items_per_domain", 0, "null or an integer"),
    ("reference_temperature", 0.0, "> 0"),
    ("lm_eval_tasks", [""], "non-empty"),
])
def test_config_validation_names_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ValueError) as err:
        EvalConfig.from_group(**{key: value}).validate()
    msg = str(err.value)
    expected_key = "n_samples" if key == "pass_k" else key
    assert expected_key in msg and allowed in msg
    if key != "pass_k":
        assert repr(value) in msg


def test_config_is_a_structured_config_and_cache_dir_resolves(monkeypatch, tmp_path):
    node = OmegaConf.merge(OmegaConf.structured(EvalConfig), EvalConfig.from_group().__dict__)
    node.pass_k = [1, 4]
    node.n_samples = 4
    cfg = as_eval_config(node).validate()
    assert cfg.pass_k == [1, 4] and cfg.max_new_tokens("choice") == cfg.max_new_tokens_choice
    with pytest.raises(ValueError, match=r"eval.bogus=1 is not allowed: a key of the eval config"):
        as_eval_config({"bogus": 1})
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert resolve_cache_dir(None) == tmp_path / "env"
    assert resolve_cache_dir(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.delenv(CACHE_ENV)
    assert str(resolve_cache_dir(None)).endswith(".cache/atlas-suite/reference")


def test_headline_kl_weighs_near_and_far_and_each_domain_equally():
    from experiments.evaluation.evaluate import headline_kl

    near = {"math": {"kl_token_mean": 0.1}, "commonsense": {"kl_token_mean": 0.3}}
    far = {"math": {"kl_token_mean": 0.5}, "commonsense": {"kl_token_mean": 0.1}}
    assert headline_kl(near, far) == pytest.approx((0.2 + 0.3) / 2)
    assert headline_kl(near, {}) == pytest.approx(0.2)  # no far items: the near mean, as every earlier record


def bench_with_far():
    """`fake_benchmark` with far items in both domains (two math, one choice) and no code problems."""
    b = fake_benchmark()
    b.retained["math"].far = [{"question": "What is 20 + 5?", "answer": "20 + 5 = 25\n#### 25"},
                              {"question": "What is 8 - 8?", "answer": "8 - 8 = 0\n#### 0"}]
    b.retained["commonsense"].far = [{"question": "Where do fish swim?", "choices": ["ocean", "bedroom"],
                                      "labels": ["A", "B"], "answer_index": 0}]
    b.target_eval = PROBLEMS[:1]
    return b


def check_samples_against_record(res, bench):
    """One entry per near and far item per domain, in benchmark order, with the item's question and gold; the
    entries marked changed are as many as the record's rates count."""
    samples = res["retained_samples"]
    expected = [(s, name, i) for s, split in (("near", "evaluation"), ("far", "far"))
                for name, dom in bench.retained.items() for i in range(len(getattr(dom, split)))]
    assert [(e["set"], e["domain"], e["index"]) for e in samples] == expected
    for e in samples:
        dom = bench.retained[e["domain"]]
        item = (dom.evaluation if e["set"] == "near" else dom.far)[e["index"]]
        assert e["prompt"] == item["question"] and e["kind"] == dom.kind and e["id"] == item.get("id")
        if dom.kind == "math":
            assert e["gold"] == extract_math_answer(item["answer"])
            assert e["changed"] == (e["base_answer"] != e["adapted_answer"])
            assert e["adapted_answer"] == extract_math_answer(e["adapted_text"])
            assert e["base_answer"] == extract_math_answer(e["base_text"])
        else:
            assert e["gold"] == item["answer_index"] and e["choices"] == item["choices"]
            assert e["changed"] == (e["base_choice"] != e["adapted_choice"])
    json.dumps(samples, allow_nan=False)  # stored as plain JSON
    for set_name, key in (("near", "retained_near"), ("far", "retained_far")):
        for name, entry in res[key].items():
            rate = entry["answer_change_rate" if bench.retained[name].kind == "math" else "choice_flip_rate"]
            mine = [e for e in samples if e["set"] == set_name and e["domain"] == name]
            assert len(mine) == rate["n"] == entry["n"]
            assert sum(e["changed"] for e in mine) == round(rate["rate"] * rate["n"])
            if bench.retained[name].kind == "choice":
                norm = entry["choice_flip_rate_norm"]
                assert sum(e["base_choice_norm"] != e["adapted_choice_norm"] for e in mine) == round(norm["rate"] * norm["n"])
    return samples


def test_retained_samples_hold_each_items_answers_and_agree_with_the_rates(lm, tmp_path, monkeypatch):
    """A perturbed model: the samples agree with whatever the rates say. Then answers forced to differ on chosen
    items: exactly those items are marked changed, with the base's stored answers beside the new ones."""
    model, tok = lm
    bench, cfg = bench_with_far(), _cfg(tmp_path)
    adapted = perturbed_copy(model, tok, scale=0.5, seed=4)
    check_samples_against_record(
        ev.evaluate_run(adapted, model, tok, bench, cfg, "tiny/e2e", chat_template=False, progress=False), bench)

    ref = ev.get_reference(model, tok, bench, cfg, "tiny/e2e", False)
    base_text = {p: t for dom in ref.domains.values() for sp in ("evaluation", "far")
                 for p, t in zip(dom.split(sp).prompts, dom.split(sp).greedy_texts or [])}
    real_generate, real_score = ev._timed_generate, ev.score_choices

    def generate(timing, m, t, prompts, **kw):  # math: item 1 of each split answers 12345, the others as the base
        if not kw.get("desc", "").startswith("greedy"):
            return real_generate(timing, m, t, prompts, **kw)
        texts = ["#### 12345" if i == 1 else base_text[p] for i, p in enumerate(prompts)]
        return GenerationOutput(texts=texts, token_ids=[[1]] * len(texts), stopped=[True] * len(texts))

    def score(m, t, items, **kw):  # choice: item 0 of each split picks the next choice, the others as the base
        out = real_score(m, t, items, **kw)
        out.choice = [(c + 1) % len(it["choices"]) if i == 0 else c for i, (c, it) in enumerate(zip(out.choice, items))]
        return out

    monkeypatch.setattr(ev, "_timed_generate", generate)
    monkeypatch.setattr(ev, "score_choices", score)
    res = ev.evaluate_run(model, model, tok, bench, cfg, "tiny/e2e", chat_template=False, progress=False)
    samples = check_samples_against_record(res, bench)
    changed = [(e["set"], e["domain"], e["index"]) for e in samples if e["changed"]]
    assert changed == [("near", "math", 1), ("near", "commonsense", 0), ("far", "math", 1), ("far", "commonsense", 0)]
    near_math = [e for e in samples if e["set"] == "near" and e["domain"] == "math"]
    assert [e["base_text"] for e in near_math] == ref.domains["math"].evaluation.greedy_texts
    assert near_math[1]["adapted_answer"] == "12345" and near_math[1]["adapted_text"] == "#### 12345"
    assert near_math[0]["adapted_text"] == near_math[0]["base_text"]
    assert res["retained_near"]["math"]["answer_change_rate"] == {"rate": pytest.approx(1 / 3), "n": 3}
    assert res["retained_far"]["commonsense"]["choice_flip_rate"] == {"rate": 1.0, "n": 1}
