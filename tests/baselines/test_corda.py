"""CorDA (peft, KPM): the model is the base at init although W0 is rewritten; the adapter holds the last r
components of W0 C; covariance passes run one sequence at a time; scale(alpha) interpolates the converted update
against the true W0; a resumed run rebuilds the same residual from the cached eigens."""

from __future__ import annotations

import pytest
import torch

from baselines.common import lora_layers
from experiments.calibration import reference_pairs
from tests.baselines.baseline_helpers import fresh_base, logits_of, prepared, randomize_lora_b, retained_batch


def effective_weights(model):
    """Module -> W_base + s B A of every CorDA layer (what the forward pass uses)."""
    out = {}
    for name, layer in lora_layers(model).items():
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        out[name] = layer.get_base_layer().weight.detach() + layer.scaling["default"] * (b @ a).detach()
    return out


def test_init_keeps_outputs_and_rewrites_w0(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "corda", tmp_path)
    base = fresh_base(tiny)
    batch = retained_batch(tiny)
    torch.testing.assert_close(logits_of(model, batch), logits_of(base, batch), rtol=1e-5, atol=1e-5)
    w0 = {n: m.weight.detach() for n, m in base.named_modules() if n in lora_layers(model)}
    assert len(w0) == 14
    for name, w in effective_weights(model).items():
        torch.testing.assert_close(w, w0[name], rtol=1e-5, atol=1e-6)
        layer = lora_layers(model)[name]
        assert not torch.allclose(layer.get_base_layer().weight, w0[name])  # W_res = W0 - s B0 A0
        assert layer.lora_A["default"].weight.requires_grad and layer.lora_B["default"].weight.requires_grad
    assert method.costs()["covariance_build_seconds"] > 0 and not method.costs()["eigens_reused"]


def test_kpm_adapter_holds_the_least_used_components(tiny, tmp_path):
    """s B0 A0 C carries the smallest singular values of W0 C (C = peft's covariance of the retained prompts)."""
    from peft import LoraConfig
    from peft.tuners.lora.config import CordaConfig
    from peft.tuners.lora.corda import calib_cov_distribution

    model, method, ctx = prepared(tiny, "corda", tmp_path)
    base = fresh_base(tiny)
    config = LoraConfig(r=8, target_modules=list(tiny.cfg.backbone.target_modules),
                        init_lora_weights="corda", corda_config=CordaConfig(corda_method="kpm"))
    ids = method.calibration_ids(ctx)

    def run_model():
        for seq in ids:
            base(input_ids=torch.tensor([seq]))

    calib_cov_distribution(base, config, run_model, None, None)
    name = "model.layers.0.mlp.down_proj"
    module = dict(base.named_modules())[name]
    cov = module.covariance_matrix.float()
    cov = cov + torch.eye(len(cov)) * cov.diagonal().mean() * 0.01  # peft's damping
    s_all = torch.linalg.svdvals(module.weight.detach() @ cov)
    layer = lora_layers(model)[name]
    b0, a0 = method.init_factors[name]
    s_adapter = torch.linalg.svdvals(layer.scaling["default"] * (b0 @ a0) @ cov)[:8]
    torch.testing.assert_close(s_adapter.sort().values, s_all[-8:].sort().values, rtol=1e-3, atol=1e-6)
    assert s_adapter.max() < s_all[0] / 10


def test_covariance_runs_one_sequence_per_forward(tiny, tmp_path, monkeypatch):
    from peft.tuners.lora import corda as peft_corda

    shapes = []
    original = peft_corda.calib_cov_distribution

    def spy(model, config, run_model, hooked_model, covariance_file):
        def counted():
            handle = model.register_forward_pre_hook(lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                                     with_kwargs=True)
            try:
                run_model()
            finally:
                handle.remove()
        return original(model, config, counted, hooked_model, covariance_file)

    monkeypatch.setattr(peft_corda, "calib_cov_distribution", spy)
    prepared(tiny, "corda", tmp_path, include_responses=True)
    pairs = reference_pairs(tiny.reference, 96)
    assert len(shapes) == len(pairs) == 12
    assert [s for s in shapes] == [(1, len(p.prompt_ids) + len(p.response_ids)) for p in pairs]


def test_scale_interpolates_the_converted_update_against_the_true_w0(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "corda", tmp_path)
    randomize_lora_b(model, std=0.2)  # a trained-looking adapter: B != B0
    w0 = {n: m.weight.detach() for n, m in fresh_base(tiny).named_modules() if isinstance(m, torch.nn.Linear)}
    trained = effective_weights(model)
    batch = retained_batch(tiny)
    trained_logits = logits_of(model, batch)
    for alpha in (0.0, 0.5, 0.25, 1.0):
        method.scale(model, alpha)
        for name, w in effective_weights(model).items():
            torch.testing.assert_close(w, w0[name] + alpha * (trained[name] - w0[name]), rtol=1e-5, atol=1e-5)
    method.scale(model, 0.0)
    torch.testing.assert_close(logits_of(model, batch), logits_of(fresh_base(tiny), batch), rtol=1e-5, atol=1e-5)
    method.scale(model, 1.0)
    torch.testing.assert_close(logits_of(model, batch), trained_logits, rtol=1e-5, atol=1e-5)
    method.scale(model, 0.5)
    with pytest.raises(RuntimeError, match="scale"):
        method.export(model, tmp_path / "export")


def test_resumed_prepare_rebuilds_the_same_residual_from_cached_eigens(tiny, tmp_path):
    first, m1, _ = prepared(tiny, "corda", tmp_path)
    second, m2, _ = prepared(tiny, "corda", tmp_path)
    assert m2.costs()["eigens_reused"] and (tmp_path / "corda_eigens.pt").is_file()
    assert not list(tmp_path.glob(".corda_eigens*"))
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_damaged_cached_decomposition_is_built_again(tiny, tmp_path, damage, caplog):
    """The cached decomposition carries its sha256: cut short, or with bytes changed in place (torch reads that
    without an error), it is named in one warning line and built again, the same residual."""
    first, _, _ = prepared(tiny, "corda", tmp_path)
    path = tmp_path / "corda_eigens.pt"
    raw = path.read_bytes()
    middle = len(raw) // 2
    path.write_bytes(raw[:middle] if damage == "truncated"
                     else raw[:middle] + bytes(b ^ 0xFF for b in raw[middle:middle + 16]) + raw[middle + 16:])
    with caplog.at_level("WARNING", logger="suite.train"):
        second, m2, _ = prepared(tiny, "corda", tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} is damaged: does not match its checksum (truncated or altered); building it again"]
    assert not m2.costs()["eigens_reused"] and path.read_bytes() == raw
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    assert all(torch.equal(a[k], b[k]) for k in a)
