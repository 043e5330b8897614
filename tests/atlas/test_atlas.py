"""ATLAS: equals LoRA with gate and filter off; centers and filter spans get ~0 residual; far inputs g > 0.99;
deterministic atlas for a seed; save/load reproduces outputs exactly."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from atlas.atlas import fit_logistic_gate, load_atlas
from atlas.kmeans import kmeans
from atlas.layer import AtlasLinear
from atlas.method import ATLAS
from experiments.backbones import load_backbone
from experiments.methods import RunContext, build_named
from experiments.prompts import code_instruction_prompt, encode_pair
from experiments.train import seed_everything
from tests.atlas.atlas_helpers import layer_site, site_atlas
from tests.conftest import backbone_config, tiny_code, tiny_math

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_model(backbone_dir):
    bb = backbone_config(backbone_dir, name="tiny", target_modules=TARGETS)
    model, tok = load_backbone(bb)
    return model, tok, bb


def fake_reference(tok, n=12, short=0):
    """A reference cache stand-in: calibration prompts + responses as token ids (math; with `short`, also a
    second domain of `short` one-word pairs, far fewer tokens than math's)."""
    items = tiny_math(n)
    split = SimpleNamespace(prompt_ids=[tok(f"Question: {m['question']}\nAnswer:")["input_ids"] for m in items],
                            response_ids=[tok(" " + m["answer"])["input_ids"] for m in items])
    domains = {"math": SimpleNamespace(split=lambda name: split)}
    if short:
        words = SimpleNamespace(prompt_ids=[tok(f"Where? {i}")["input_ids"] for i in range(short)],
                                response_ids=[tok(" shelf")["input_ids"] for _ in range(short)])
        domains["commonsense"] = SimpleNamespace(split=lambda name: words)
    return SimpleNamespace(domains=domains)


def code_items(n=8):
    return [{"instruction": "Complete the following Python function.", "input": p["prompt"],
             "response": p["canonical_solution"]} for p in tiny_code(n)]


def context(backbone_dir, run_dir, tok, bb, seed=0, short=0):
    return RunContext(tokenizer=tok, benchmark=SimpleNamespace(target_train=code_items()), run_dir=Path(run_dir),
                      seed=seed, target_modules=list(bb.target_modules), max_length=bb.max_length, progress=False,
                      reference_fn=lambda: fake_reference(tok, n=30 if short else 12, short=short))


def prepared(backbone_dir, run_dir, seed=0, short=0, **hp):
    seed_everything(seed)
    model, tok, bb = tiny_model(backbone_dir)
    method = build_named("atlas", num_centers=4, max_tokens=400, filter_rank=4, **hp)
    model = method.prepare(model, context(backbone_dir, run_dir, tok, bb, seed, short))
    return model, method, tok


def batch(tok):
    items = code_items(4)
    from experiments.prompts import collate

    return collate([encode_pair(tok, code_instruction_prompt(i), i["response"], 96) for i in items], tok.pad_token_id)


@pytest.mark.parametrize("off", [{"use_gate": False, "use_filter": False}, {"conditioning": 0.0}])
def test_gate_and_filter_off_equals_peft_lora(tiny_backbone_dir, tmp_path, off):
    """Both ways of switching the conditioning off (the ablation switches, the knob at 0) are peft's LoRA."""
    from peft import LoraConfig, get_peft_model

    seed_everything(0)
    base, tok, bb = tiny_model(tiny_backbone_dir)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0))
    atlas_model, method, _ = prepared(tiny_backbone_dir, tmp_path, rank=4, alpha=8, **off)
    # Same init: copy peft's A (Kaiming) and a non-zero B into ATLAS so outputs differ from the base.
    g = torch.Generator().manual_seed(1)
    lora_mods = {n.replace("base_model.model.", ""): m for n, m in lora.named_modules() if hasattr(m, "lora_A")}
    atlas_mods = {n: m for n, m in atlas_model.named_modules() if isinstance(m, AtlasLinear)}
    assert set(lora_mods) == set(atlas_mods) and len(atlas_mods) == 14
    with torch.no_grad():
        for name, m in lora_mods.items():
            m.lora_B["default"].weight.copy_(torch.randn(m.lora_B["default"].weight.shape, generator=g) * 0.1)
            atlas_mods[name].lora_A.copy_(m.lora_A["default"].weight)
            atlas_mods[name].lora_B.copy_(m.lora_B["default"].weight)
    b = batch(tok)
    out_l = lora(**b)
    out_a = atlas_model(**b)
    torch.testing.assert_close(out_a.logits, out_l.logits, rtol=1e-5, atol=1e-5)
    # the knob at 0, or gate and filter off, computes neither gate nor filter nor even k*: A x exactly
    site = next(iter(atlas_mods.values())).site
    assert site.condition(torch.randn(5, site.centers.shape[1])) == (None, None, None, None)
    out_l.loss.backward()
    out_a.loss.backward()
    for name, m in lora_mods.items():
        torch.testing.assert_close(atlas_mods[name].lora_A.grad, m.lora_A["default"].weight.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(atlas_mods[name].lora_B.grad, m.lora_B["default"].weight.grad, rtol=1e-4, atol=1e-6)
    # Three SGD steps on the same data stay together.
    opt_l = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.1)
    opt_a = torch.optim.SGD([p for p in atlas_model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):
        opt_l.step(); opt_a.step(); opt_l.zero_grad(); opt_a.zero_grad()
        lora(**b).loss.backward(); atlas_model(**b).loss.backward()
    torch.testing.assert_close(atlas_model(**b).logits, lora(**b).logits, rtol=1e-4, atol=1e-4)


def unit_site(d=16, k=3, r=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(200, d, generator=g) * 0.3 + 4 * torch.eye(d)[j] for j in range(k)])
    return site_atlas(x, k, 0.9, r, 0.9, seed), x


def test_conditioning_interpolates_gate_and_filter():
    """g_c = 1 - c + c g and A Pi_c x = A x - c (A U) z: the residual at c is the LoRA residual plus c times the
    conditioning's change to it, per token, for the gate and the filter alone."""
    site, x = unit_site()
    probe = torch.cat([x[:5], torch.randn(5, x.shape[1]) * 3])
    for kw in ({"use_filter": False}, {"use_gate": False}):
        layers = {c: residual_layer(site, conditioning=c, **kw) for c in (0.0, 0.25, 1.0)}
        torch.manual_seed(0)
        ref = layers[0.0]
        for layer in layers.values():
            with torch.no_grad():
                layer.lora_A.copy_(ref.lora_A)
                layer.lora_B.copy_(ref.lora_B)
                layer.base.load_state_dict(ref.base.state_dict())
        r = {c: layer.residual(probe) for c, layer in layers.items()}
        torch.testing.assert_close(r[0.25], r[0.0] + 0.25 * (r[1.0] - r[0.0]), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(r[1.0], r[0.0])


def test_subspace_gate_opens_off_the_retained_directions():
    """gate_signal=subspace: the gate is larger for inputs whose energy lies outside their center's filter."""
    site, x = unit_site()
    atlas_site = layer_site(site_atlas(x, 3, 0.9, 2, 0.9, 0, gate_signal="subspace"), gate_signal="subspace")
    inside = x[:20]
    outside = x[:20] + torch.randn(20, x.shape[1], generator=torch.Generator().manual_seed(3)) * 2.0
    g_in = atlas_site.condition(inside)[0].mean()
    atlas_site.clear()
    assert atlas_site.condition(outside)[0].mean() > g_in + 0.2


def residual_layer(site, **kw):
    base = torch.nn.Linear(site.centers.shape[1], 8)
    layer = AtlasLinear(base, layer_site(site, **kw), rank=4, alpha=8)
    with torch.no_grad():
        layer.lora_B.normal_()
    return layer


def test_center_gets_near_zero_residual_far_input_gets_open_gate():
    site, _ = unit_site()
    layer = residual_layer(site)
    centers = site.centers
    assert layer.residual(centers).abs().max() < 1e-4 * layer.residual(centers * 0 + 100).abs().max()
    far = torch.full((2, centers.shape[1]), 50.0)
    gate, *_ = layer.site.condition(far)
    assert (gate > 0.99).all()
    gate_c, *_ = layer_site(site).condition(centers)
    assert (gate_c < 1e-3).all()


def test_inputs_in_a_filter_span_are_filtered_out():
    site, _ = unit_site()
    layer = residual_layer(site, use_gate=False)  # filter alone
    k = 1
    u = site.filters[k, :, : int(site.ranks[k])]
    # Points near center k that lie exactly in the span of its filter.
    coeff = u.T @ site.centers[k] + 0.5 * torch.randn(5, u.shape[1], generator=torch.Generator().manual_seed(0))
    x = coeff @ u.T
    assert layer.site.condition(x)[3].eq(k).all()  # assigned to center k
    off = residual_layer(site, use_gate=False, use_filter=False)
    off.lora_A.data.copy_(layer.lora_A.data); off.lora_B.data.copy_(layer.lora_B.data)
    ratio = layer.residual(x).norm() / off.residual(x).norm()
    assert ratio < 1e-4


def test_soft_assignment_is_the_weighted_filter():
    site, x = unit_site()
    hard, soft = residual_layer(site, use_gate=False), residual_layer(site, use_gate=False, assign="soft",
                                                                        assign_temperature=1e-3)
    soft.lora_A.data.copy_(hard.lora_A.data); soft.lora_B.data.copy_(hard.lora_B.data)
    torch.testing.assert_close(soft.residual(x[:20]), hard.residual(x[:20]), rtol=1e-4, atol=1e-5)


def test_kmeans_and_atlas_are_deterministic_per_seed():
    _, x = unit_site()
    c1, a1 = kmeans(x, 3, seed=5)
    c2, a2 = kmeans(x, 3, seed=5)
    assert torch.equal(c1, c2) and torch.equal(a1, a2)
    s1 = site_atlas(x, 5, 0.9, 3, 0.9, seed=1)
    s2 = site_atlas(x, 5, 0.9, 3, 0.9, seed=1)
    s3 = site_atlas(x, 5, 0.9, 3, 0.9, seed=2)
    assert torch.equal(s1.centers, s2.centers) and torch.equal(s1.filters, s2.filters) and torch.equal(s1.log_q, s2.log_q)
    assert not torch.equal(s1.centers, s3.centers)


def test_filters_follow_energy_and_rank_cap():
    site, x = unit_site(d=16, k=3, r=8)
    for j in range(3):
        r = int(site.ranks[j])
        u = site.filters[j, :, :r]
        torch.testing.assert_close(u.T @ u, torch.eye(r), atol=1e-5, rtol=0)
        assert 1 <= r <= 8
    capped = site_atlas(x, 3, 0.999, 2, 0.9, 0)
    assert int(capped.ranks.max()) == 2


def test_gate_quantile_is_calibrated():
    site, x = unit_site()
    delta = site.delta(x).min(1).values
    assert (delta <= site.log_q.exp() * (1 + 1e-5)).float().mean().item() == pytest.approx(0.9, abs=0.01)


def test_logistic_gate_recovers_the_bayes_boundary_of_two_gaussians():
    """Retained log-signals ~ N(0, 1), target ~ N(2, 1): the posterior is sigmoid(2 (v - 1)), whatever the class
    sizes (the fit is class-balanced); slope 2, threshold 1."""
    g = torch.Generator().manual_seed(0)
    for n_r, n_t in ((20000, 20000), (30000, 3000)):
        log_q, slope = fit_logistic_gate(torch.randn(n_r, generator=g), 2 + torch.randn(n_t, generator=g))
        assert log_q == pytest.approx(1.0, abs=0.05) and slope == pytest.approx(2.0, abs=0.1)


def test_logistic_gate_never_opens_on_the_retained_side():
    """A signal that is lower on target inputs gets a flat gate (slope 1e-3) at the median, not a reversed one."""
    g = torch.Generator().manual_seed(1)
    retained, target = 2 + torch.randn(5000, generator=g), torch.randn(5000, generator=g)
    log_q, slope = fit_logistic_gate(retained, target)
    assert slope == 1e-3
    assert log_q == pytest.approx(float(torch.quantile(torch.cat([retained, target]).double(), 0.5)))


def test_balanced_calibration_takes_an_equal_share_of_tokens_per_domain(tiny_backbone_dir, tmp_path):
    """balance_domains: each retained domain gives max_tokens / 2 calibration tokens (the seeded subsample of that
    domain alone), though the second domain has under half of math's tokens; without it, math dominates."""
    from experiments.activations import collect_inputs

    model, method, tok = prepared(tiny_backbone_dir, tmp_path / "b", short=20, balance_domains=True)
    ctx = context(tiny_backbone_dir, tmp_path / "b", tok, tiny_model(tiny_backbone_dir)[2], short=20)
    groups = method.retained_groups(ctx)
    assert list(groups) == ["math", "commonsense"] and len(groups["commonsense"]) == 20
    tokens = {k: sum(len(s["input_ids"]) for s in v) for k, v in groups.items()}
    assert tokens["commonsense"] >= 200 and tokens["math"] > 2 * tokens["commonsense"]
    site = method.sites[0]
    got = method.collect(model, ctx, [site], groups, seed=5)[site.name]
    alone = [collect_inputs(model, [site], groups[k], pad_id=tok.pad_token_id, max_tokens=200, seed=5 + j,
                            progress=False)[site.name] for j, k in enumerate(groups)]
    assert got.shape[0] == 400 and torch.equal(got, torch.cat(alone))
    unbalanced = build_named("atlas", num_centers=4, max_tokens=400, filter_rank=4, balance_domains=False)
    assert list(unbalanced.retained_groups(ctx)) == ["retained"]


def test_logistic_gate_opens_more_on_target_calibration_inputs(tiny_backbone_dir, tmp_path):
    """gate_fit=logistic on the tiny backbone: every site's slope is fitted (not 1), stored with the atlas, and the
    mean gate on the target training tokens exceeds that on the retained calibration tokens at most sites."""
    model, method, tok = prepared(tiny_backbone_dir, tmp_path / "g", short=20, balance_domains=True,
                                  gate_fit="logistic", gate_signal="subspace")
    ctx = context(tiny_backbone_dir, tmp_path / "g", tok, tiny_model(tiny_backbone_dir)[2], short=20)
    retained = method.collect(model, ctx, method.sites, method.retained_groups(ctx), seed=0)
    target = method.collect(model, ctx, method.sites, method.contrast_groups(ctx), seed=101)
    named = dict(model.named_modules())
    opens = 0
    for s in method.sites:
        site = named[s.modules[0]].site
        assert float(site.gate_slope) != 1.0
        gates = []
        for x in (retained[s.name], target[s.name]):
            site.clear()
            gates.append(float(site.condition(x)[0].mean()))
        opens += gates[1] > gates[0]
    assert opens >= len(method.sites) - 1
    stored, _ = load_atlas(tmp_path / "g" / "atlas.safetensors")
    assert all(torch.equal(stored[n].gate_slope, method.atlas[n].gate_slope) for n in stored)


def test_prepare_is_deterministic_for_a_seed_and_differs_for_another(tiny_backbone_dir, tmp_path):
    _, m1, _ = prepared(tiny_backbone_dir, tmp_path / "a", seed=0)
    _, m2, _ = prepared(tiny_backbone_dir, tmp_path / "b", seed=0)
    _, m3, _ = prepared(tiny_backbone_dir, tmp_path / "c", seed=1)
    assert len(m1.sites) == 8  # 2 layers x (q/k/v, o, gate/up, down)
    for name in m1.atlas:
        assert torch.equal(m1.atlas[name].centers, m2.atlas[name].centers)
    assert any(not torch.equal(m1.atlas[n].centers, m3.atlas[n].centers) for n in m1.atlas)


def test_save_and_load_reproduces_outputs_exactly(tiny_backbone_dir, tmp_path):
    model, method, tok = prepared(tiny_backbone_dir, tmp_path / "run")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AtlasLinear):
                m.lora_B.normal_(0, 0.1)
    b = batch(tok)
    before = model(**b).logits
    stored = method.export(model, tmp_path / "export")
    assert stored == method.costs()["atlas_bytes"] + method.costs()["adapter_bytes"] > 0
    fresh, _, _ = tiny_model(tiny_backbone_dir)
    ATLAS.from_export(fresh, tmp_path / "export")
    assert torch.equal(fresh(**b).logits, before)


def test_an_export_from_before_the_gate_fit_and_balance_fields_loads(tiny_backbone_dir, tmp_path):
    """method.json written before `gate_fit` / `balance_domains` existed: read as the behaviour of that time."""
    import json

    model, method, tok = prepared(tiny_backbone_dir, tmp_path / "run")
    method.export(model, tmp_path / "export")
    path = tmp_path / "export" / "method.json"
    stored = json.loads(path.read_text())
    assert stored.pop("gate_fit") == "quantile" and stored.pop("balance_domains") is True
    path.write_text(json.dumps(stored))
    params = ATLAS.read_params(tmp_path / "export")
    assert params.gate_fit == "quantile" and params.balance_domains is False
    fresh, _, _ = tiny_model(tiny_backbone_dir)
    ATLAS.from_export(fresh, tmp_path / "export")
    b = batch(tok)
    assert torch.equal(fresh(**b).logits, model(**b).logits)


def test_scale_zero_is_the_base(tiny_backbone_dir, tmp_path):
    model, method, tok = prepared(tiny_backbone_dir, tmp_path)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, AtlasLinear):
                m.lora_B.normal_(0, 0.1)
    base, _, _ = tiny_model(tiny_backbone_dir)
    b = batch(tok)
    assert not torch.allclose(model(**b).logits, base(**b).logits)
    method.scale(model, 0.0)
    torch.testing.assert_close(model(**b).logits, base(**b).logits)


def test_bf16_backbone_trains_float32_factors(tiny_backbone_dir, tmp_path):
    seed_everything(0)
    bb = backbone_config(tiny_backbone_dir, name="tiny", target_modules=TARGETS, dtype="bfloat16")
    model, tok = load_backbone(bb)
    method = build_named("atlas", num_centers=4, max_tokens=400, filter_rank=4)
    model = method.prepare(model, context(tiny_backbone_dir, tmp_path, tok, bb))
    layers = [m for m in model.modules() if isinstance(m, AtlasLinear)]
    assert all(m.lora_A.dtype == torch.float32 and m.base.weight.dtype == torch.bfloat16 for m in layers)
    with torch.no_grad():
        for m in layers:
            m.lora_B.normal_(0, 0.1)
    out = model(**batch(tok))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(m.lora_A.grad is not None and torch.isfinite(m.lora_A.grad).all() for m in layers)


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_damaged_atlas_in_the_run_folder_is_built_again_and_a_damaged_export_is_refused(tiny_backbone_dir, tmp_path,
                                                                                          damage, caplog):
    """The run folder's atlas carries its digest: cut short, or with bytes changed in place (safetensors reads that
    without an error), it is named in one warning line and built again, the same atlas; a damaged export is refused
    naming its file. Both get the mode records get."""
    from safetensors.torch import load_file

    from experiments.records import file_mode
    from experiments.tensor_files import DamagedFile

    model, first, _ = prepared(tiny_backbone_dir, tmp_path / "run")
    path = tmp_path / "run" / "atlas.safetensors"
    first.export(model, tmp_path / "export")
    for file in (path, tmp_path / "export" / "atlas.safetensors", tmp_path / "export" / "adapter.safetensors"):
        assert file.stat().st_mode & 0o777 == file_mode(), file
    for file in (path, tmp_path / "export" / "atlas.safetensors"):
        raw = file.read_bytes()
        if damage == "truncated":
            file.write_bytes(raw[: len(raw) // 2])
        else:
            at = len(raw) - len(raw) // 4
            file.write_bytes(raw[:at] + bytes(b ^ 0x55 for b in raw[at:at + 8]) + raw[at + 8:])
            load_file(str(file))
    with caplog.at_level("WARNING", logger="suite.atlas"):
        _, again, _ = prepared(tiny_backbone_dir, tmp_path / "run")
    what = "does not match its digest (truncated or altered)" if damage == "altered" else "cannot be read ("
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith(f"{path} is damaged: {what}"), messages
    assert messages[0].endswith("; building it again")
    assert load_atlas(path)[0].keys() == first.atlas.keys()
    for name in first.atlas:
        assert torch.equal(again.atlas[name].centers, first.atlas[name].centers)
        assert torch.equal(again.atlas[name].filters, first.atlas[name].filters)
    fresh, _, _ = tiny_model(tiny_backbone_dir)
    with pytest.raises(DamagedFile, match=f"{tmp_path / 'export' / 'atlas.safetensors'} is damaged: "):
        ATLAS.from_export(fresh, tmp_path / "export")


@pytest.mark.parametrize("fit_tokens, counted", [("all", "attention_mask"), ("scored", "labels")])
def test_fit_tokens_picks_the_calibration_tokens_the_atlas_is_fitted_on(tiny_backbone_dir, tmp_path, monkeypatch,
                                                                      fit_tokens, counted):
    """`fit_tokens=all` fits on every token of prompt and response; `scored` on the positions the retained KL scores
    (one per response token: the position before it), so with room for every token a site sees exactly that many."""
    import atlas.method as atlas_method

    seen = []
    collect = atlas_method.collect_inputs

    def spy(model, sites, sequences, **kw):
        out = collect(model, sites, sequences, **kw)
        if counted == "labels":
            expected = sum(sum(1 for t in s["labels"] if t != -100) for s in sequences)
        else:
            expected = sum(len(s["input_ids"]) for s in sequences)
        seen.append((expected, {v.shape[0] for v in out.values()}))
        return out

    monkeypatch.setattr(atlas_method, "collect_inputs", spy)
    seed_everything(0)
    model, tok, bb = tiny_model(tiny_backbone_dir)
    method = build_named("atlas", num_centers=4, max_tokens=10**6, filter_rank=4, fit_tokens=fit_tokens)
    method.prepare(model, context(tiny_backbone_dir, tmp_path, tok, bb))
    assert seen and all(rows == {expected} for expected, rows in seen), seen
    assert method.params.fit_tokens == fit_tokens


def test_an_unknown_fit_tokens_value_is_refused_before_any_compute():
    with pytest.raises(ValueError, match=r"fit_tokens.*answers.*one of \['all', 'scored'\]"):
        build_named("atlas", fit_tokens="answers")
