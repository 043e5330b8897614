"""bench.throughput on the micro backbone at one round of one step: every method through the suite's own loop, its
tokens/s as a share of plain full fine-tuning, and the frozen floor; the plain reference trains its own weights."""

import json

import pytest
import torch

from bench import throughput
from bench.common import interval_verdict
from tests.atlas.atlas_helpers import layer_site, site_atlas


@pytest.mark.slow
def test_shares_of_plain_full_fine_tuning_and_the_frozen_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "throughput.json"
    throughput.main(["--methods", "lora", "--groups", "3,1", "--steps", "1", "--repeats", "2", "--warmup", "0",
                     "--floor", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["complete"]
    rows = {(r["method"], r["length_groups"]): r for r in payload["results"]}
    assert set(rows) == {("plain", None), ("frozen", 3), ("frozen", 1), ("lora", 3), ("lora", 1)}
    plain = rows[("plain", None)]
    assert plain["share_of_plain"] == 1.0 and plain["tokens"] % 16 == 0  # dense rows of 16
    for key, r in rows.items():
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["median_s"])
        assert r["share_of_plain"] == pytest.approx(r["tokens_per_s"] / plain["tokens_per_s"])
    # the same examples in either layout: the same real tokens
    assert rows[("lora", 3)]["tokens"] == rows[("lora", 1)]["tokens"] == rows[("frozen", 3)]["tokens"]
    # paired by round: each round's share is the method's tokens/s over plain's in that same round
    for key, r in rows.items():
        assert len(r["rounds_s"]) == len(r["share_per_round"]) == 2 and sorted(r["rounds_s"]) == r["all_s"]
        for t, p, share in zip(r["rounds_s"], plain["rounds_s"], r["share_per_round"]):
            assert share == pytest.approx((r["tokens"] / t) / (plain["tokens"] / p))
        # two rounds: the interval of the median is their range, which covers it with probability 1/2
        assert r["share_interval"]["low"] == min(r["share_per_round"])
        assert r["share_interval"]["high"] == max(r["share_per_round"])
        assert r["share_interval"]["coverage"] == pytest.approx(0.5)
    assert plain["share_per_round"] == [1.0, 1.0]
    lora = rows[("lora", 3)]
    assert lora["target"] == {"share_of_plain": 1.0, "met": lora["share_of_plain"] >= 1.0,
                              "by_rounds": interval_verdict(lora["share_interval"], 1.0, at_least=True)}


def test_plain_reference_trains_a_private_copy(tmp_path):
    from bench.common import micro_backbone_config
    from experiments.backbones import load_backbone

    model, _ = load_backbone(micro_backbone_config())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    examples = [{"input_ids": list(range(2, 40)), "labels": list(range(2, 40))} for _ in range(4)]
    plain = throughput.PlainFullFT(model, examples, batch_size=2, lr=1e-3, seed=0)
    tokens, seconds = plain.run(1, None)
    assert tokens == 76 and seconds > 0  # 2 examples of 38 tokens, cut into 2 dense rows of 38
    assert any(not torch.equal(p, before[n]) for n, p in plain.model.named_parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("argv, message", [
    (["--groups", "0"], "--groups"),
    (["--methods", "nosuch"], "not in conf/method"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--layers", "2"], "--layers needs --shape"),
    (["--shape", "nosuch"], "is not a preset"),
    (["--shape", "qwen3-cpu", "--layers", "0"], "--layers 0: must be >= 1"),
])
def test_bad_arguments_are_refused_before_any_work(argv, message):
    with pytest.raises(SystemExit, match=message):
        throughput.main(argv)


@pytest.mark.slow
def test_atlas_parts_are_timed_through_the_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "throughput.json"
    throughput.main(["--methods", "lora", "--groups", "3", "--steps", "1", "--repeats", "1", "--warmup", "0",
                     "--atlas-parts", "--out", str(out)])
    rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"plain", "lora", *throughput.ATLAS_PARTS}
    assert len({r["tokens"] for name, r in rows.items() if name != "plain"}) == 1  # the same batches


def test_detached_conditioning_has_the_same_forward_and_no_gradient_through_the_conditioning():
    from atlas.layer import AtlasLinear

    g = torch.Generator().manual_seed(0)
    site = site_atlas(torch.randn(300, 12, generator=g) * 2 + 3, 4, 0.8, 3, 0.9, 0, gate_signal="subspace")
    torch.manual_seed(1)
    layer = AtlasLinear(torch.nn.Linear(12, 5), layer_site(site, gate_signal="subspace"), rank=2, alpha=4)
    torch.nn.init.normal_(layer.lora_B)
    x = (torch.randn(7, 12, generator=g) * 2 + 3).requires_grad_(True)
    full = layer(x)
    (full.sum()).backward()
    grad_full = x.grad.clone()
    x.grad = None
    layer.site.clear()  # the site keeps its last input's conditioning
    with torch.no_grad():  # the conditioning as constants: g(x) and z of this x
        gate, _, z, _ = layer.site.condition(x)
    layer.site.clear()
    au = layer.lora_A @ layer.site.filter_cols
    expected = layer.base(x) + ((x @ layer.lora_A.T - z @ au.T) * gate) @ layer.lora_B.T * layer.scaling
    expected.sum().backward()
    grad_constants = x.grad.clone()
    x.grad = None
    layer.site.clear()
    assert throughput.detach_conditioning(torch.nn.Sequential(layer)) == 1
    assert isinstance(layer.site, throughput.DetachedConditioningSite)
    detached = layer(x)
    detached.sum().backward()
    torch.testing.assert_close(detached, full)
    torch.testing.assert_close(x.grad, grad_constants)
    assert not torch.allclose(grad_full, grad_constants, rtol=1e-3, atol=1e-5)  # the conditioning's gradient is real


def test_site_input_form_equals_the_layer_in_outputs_and_gradients():
    from atlas.layer import AtlasLinear

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(0)
        built = site_atlas(torch.randn(400, 12, generator=g) * 2 + 3, 4, 0.8, 3, 0.9, 0,
                                      gate_signal="subspace", filter_basis=6)
        torch.manual_seed(1)
        site = layer_site(built, gate_signal="subspace")
        site.basis, site.coef_cols = site.basis.double(), site.coef_cols.double()
        site.filter_cols = site.basis @ site.coef_cols  # U = V W exactly, as the per-site form computes it
        layers = [AtlasLinear(torch.nn.Linear(12, w), site, rank=2, alpha=4) for w in (5, 7)]  # two modules, one site
        for layer in layers:
            torch.nn.init.normal_(layer.lora_B)
        model = torch.nn.ModuleList(layers)
        x = (torch.randn(9, 12, generator=g) * 2 + 3).requires_grad_(True)

        def outputs_and_grads():
            site.clear()
            outs = [layer(x) for layer in layers]
            weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(outs)]
            grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)),
                                        [x, *(p for layer in layers for p in (layer.lora_A, layer.lora_B))])
            return outs, grads

        outs, grads = outputs_and_grads()
        assert throughput.site_input_form(model) == 1
        assert all(isinstance(layer, throughput.SiteInputLinear) for layer in layers)
        outs2, grads2 = outputs_and_grads()
        for a, b in zip([*outs, *grads], [*outs2, *grads2]):  # to float32 rounding: both take the gate in float32
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        # the filter and the gate are real here: without them the outputs differ
        plain = layers[0].base(x) + (x @ layers[0].lora_A.T) @ layers[0].lora_B.T * layers[0].scaling
        assert not torch.allclose(plain, outs[0], rtol=1e-3)
    finally:
        torch.set_default_dtype(previous)


def test_site_input_form_refuses_settings_it_does_not_compute():
    from atlas.layer import AtlasLinear, AtlasSite

    built = site_atlas(torch.randn(200, 8) + 2, 3, 0.8, 2, 0.9, 0, gate_signal="subspace")  # no basis
    layer = AtlasLinear(torch.nn.Linear(8, 4), layer_site(built, gate_signal="subspace"), rank=2, alpha=4)
    with pytest.raises(ValueError, match="default conditioning only"):
        throughput.site_input_form(torch.nn.Sequential(layer))
    with_basis = site_atlas(torch.randn(200, 8) + 2, 3, 0.8, 2, 0.9, 0, gate_signal="subspace", filter_basis=4)
    for setting in ({"gate_temperature": 2.0}, {"conditioning": 0.5}, {"assign": "soft"}):
        site = layer_site(with_basis, gate_signal="subspace", **setting)
        layer = AtlasLinear(torch.nn.Linear(8, 4), site, rank=2, alpha=4)
        with pytest.raises(ValueError, match="default conditioning only"):
            throughput.site_input_form(torch.nn.Sequential(layer))
    good = AtlasLinear(torch.nn.Linear(8, 4), layer_site(with_basis, gate_signal="subspace"), rank=2, alpha=4)
    with pytest.raises(ValueError, match="default conditioning only"):
        throughput.site_input_form(torch.nn.Sequential(good, layer))
    assert type(good) is AtlasLinear and type(good.site) is AtlasSite  # a refused model is left as it was


@pytest.mark.slow
def test_shape_widens_the_model_and_keeps_the_backbone_data(tmp_path, monkeypatch):
    from bench.common import RANDOM_PRESETS

    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    overrides = throughput.widened_backbone("micro", "qwen3-cpu", 1, tmp_path / "wide")
    assert overrides[0] == f"backbone.path={tmp_path / 'wide'}"
    variant = throughput.LoopVariant("lora", "micro", overrides, tmp_path / "runs")
    config = variant.model.get_base_model().config
    preset = RANDOM_PRESETS["qwen3-cpu"]
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.head_dim) == \
        (preset["hidden_size"], preset["intermediate_size"], 1, preset["head_dim"])
    assert config.vocab_size == len(variant.tokenizer)  # micro's tokenizer, so micro's examples
    assert variant.backbone_cfg.shapes.hidden_size == preset["hidden_size"]
    micro = throughput.LoopVariant("lora", "micro", [], tmp_path / "runs")
    assert [e["input_ids"] for e in variant.examples] == [e["input_ids"] for e in micro.examples]
    tokens, seconds = variant.run(1, 3)
    assert tokens > 0 and seconds > 0
