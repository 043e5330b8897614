"""CorDA (KPM) pinned to a re-derivation of the authors' construction written here from their paper and code's
behaviour: the covariance (retained prompts only, packed into max_length windows, one window per forward, each
divided by |max|, mean over windows), the damped covariance, the smallest r components of W0 C_d, the unscaled
factors (alpha = rank) and the residual; a near-degenerate and an exactly tied boundary singular value; the model is
the base at init; scale(alpha) interpolates the converted update against the true W0; a resumed run rebuilds the
same residual from the cached eigens."""

from __future__ import annotations

import pytest
import torch

from baselines.common import lora_layers
from baselines.corda import prompt_windows, window_covariances
from experiments.calibration import reference_pairs
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import fresh_base, logits_of, prepared, randomize_lora_b, retained_batch, run_context


# -- the re-derivation (float64) ------------------------------------------------------------------------------------
def damped(cov: torch.Tensor) -> torch.Tensor:
    """C + damp mean(diag C) I, damp from 0.01 doubling until C_d C_d^-1, in float32 as the authors check it, is
    within 0.05 (Frobenius) of I; returned in float64."""
    c = cov.double()
    eye = torch.eye(len(c), dtype=torch.float64)
    damp = 0.01
    while True:
        fixed = c + eye * c.diagonal().mean() * damp
        f32 = fixed.float()
        if torch.dist(f32 @ torch.linalg.inv(f32), eye.float()) < 0.05:
            return fixed
        damp *= 2


def kpm_reference(weight: torch.Tensor, cov: torch.Tensor, rank: int, scaling: float = 1.0):
    """(B0, A0, W_res, S_all): W0 C_d = U S V^T, the last `rank` components, B0 = U sqrt(S/s), A0 = sqrt(S/s) V^T C_d^-1."""
    fixed = damped(cov)
    w = weight.double()
    u, s, vh = torch.linalg.svd(w @ fixed, full_matrices=False)
    u, sr, vh = u[:, -rank:], s[-rank:], vh[-rank:]
    root = (sr / scaling).sqrt()
    b0 = u * root
    a0 = root[:, None] * (vh @ torch.linalg.inv(fixed))
    return b0, a0, w - scaling * b0 @ a0, s


def signs_as(b: torch.Tensor, a: torch.Tensor, like_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) with each component's sign (a column of B with its row of A) flipped to agree with `like_b`: singular
    vectors are defined up to that sign."""
    sign = torch.sign((b.double() * like_b.double()).sum(0))
    return b.double() * sign, a.double() * sign[:, None]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def effective_weights(model):
    """Module -> W_base + s B A of every CorDA layer (what the forward pass uses)."""
    out = {}
    for name, layer in lora_layers(model).items():
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        out[name] = layer.get_base_layer().weight.detach() + layer.scaling["default"] * (b @ a).detach()
    return out


def given_covariances(monkeypatch, covariances: dict[str, torch.Tensor]) -> None:
    """peft's covariance pass replaced by the given (module name -> C)."""
    from peft.tuners.lora import corda as peft_corda

    def given(model, config, run_model, hooked_model, covariance_file):
        for name, module in peft_corda.target_modules(model, config):
            module.covariance_matrix = covariances[name].float().clone()

    monkeypatch.setattr(peft_corda, "calib_cov_distribution", given)


def random_covariance(d: int, seed: int, rank_deficient: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d // 2 if rank_deficient else 4 * d, d, generator=g, dtype=torch.float64)
    x = x * torch.logspace(0, -0.5, d, dtype=torch.float64)  # an uneven spectrum
    return x.T @ x / len(x)


# -- the covariance -------------------------------------------------------------------------------------------------
def test_windows_pack_the_prompts_only(tiny, tmp_path):
    ctx = run_context(tiny, tmp_path)
    windows = prompt_windows(ctx, 256)
    pairs = reference_pairs(tiny.reference, 96, drop_empty=False)
    sep = tiny.tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
    stream = []
    for i, k in enumerate(order):
        stream += (sep if i else []) + pairs[k].prompt_ids
    assert sum(windows, []) == stream and len(stream) > 96
    assert [len(w) for w in windows[:-1]] == [96] * (len(windows) - 1) and 0 < len(windows[-1]) <= 96
    assert prompt_windows(ctx, 1) == windows[:1]


def test_covariance_is_the_authors_hook(tiny, tmp_path, monkeypatch):
    """The C peft decomposes = sum over windows of (X/|max X|)^T (X/|max X|) / n_windows, re-derived here from the
    base's inputs on each window, one forward each; LoRA-Null's `window_covariances` gives the same."""
    from peft.tuners.lora import corda as peft_corda

    seen, shapes = {}, []
    original = peft_corda.collect_eigens

    def spy(model, config, verbose):
        for name, module in peft_corda.target_modules(model, config):
            seen[name] = module.covariance_matrix.clone()
        return original(model, config, verbose)

    monkeypatch.setattr(peft_corda, "collect_eigens", spy)
    base = fresh_base(tiny)
    handle = base.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                            with_kwargs=True)
    method = build_named("corda")
    ctx = run_context(tiny, tmp_path)
    method.prepare(base, ctx)
    handle.remove()
    windows = prompt_windows(ctx, 256)
    assert shapes == [(1, len(w)) for w in windows]

    ref = fresh_base(tiny)
    modules = {n: m for n, m in ref.named_modules() if n in seen}
    sums = {n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64) for n, m in modules.items()}
    inputs = {}
    handles = [m.register_forward_pre_hook(lambda m, a, n=n: inputs.__setitem__(n, a[0][0].double()))
               for n, m in modules.items()]
    with torch.no_grad():
        for ids in windows:
            ref(input_ids=torch.tensor([ids]))
            for n in modules:
                x = inputs[n] / inputs[n].max().abs()
                sums[n] += x.T @ x
    for h in handles:
        h.remove()
    assert len(seen) == 14
    for name, cov in seen.items():
        assert rel(cov, sums[name] / len(windows)) < 1e-5, name
    again = fresh_base(tiny)
    ours = window_covariances(again, {n: m for n, m in again.named_modules() if n in seen}, windows, "cpu")
    for name, cov in seen.items():
        assert rel(ours[name], cov) < 1e-6, name


# -- the decomposition ----------------------------------------------------------------------------------------------
def test_factors_residual_and_scaling_from_a_given_covariance(tiny, tmp_path, monkeypatch):
    """From given covariances (one rank-deficient: only the damping makes it invertible), every layer holds the re-derived smallest-r
    factors unscaled (alpha = rank), W_res = W0 - B0 A0; alpha = 16 (s = 2) divides both factors by sqrt(2) and
    leaves s B0 A0 and W_res as they were."""
    base = fresh_base(tiny)
    linears = {n: m for n, m in base.named_modules() if n.rsplit(".", 1)[-1] in tiny.cfg.backbone.target_modules}
    covs = {n: random_covariance(m.in_features, i, rank_deficient=(i == 3)) for i, (n, m) in enumerate(linears.items())}
    given_covariances(monkeypatch, covs)
    w0 = {n: m.weight.detach().clone() for n, m in linears.items()}
    model, method, _ = prepared(tiny, "corda", tmp_path / "s1")
    scaled, _, _ = prepared(tiny, "corda", tmp_path / "s2", alpha=16)
    layers, layers2 = lora_layers(model), lora_layers(scaled)
    assert len(layers) == 14
    for name, layer in layers.items():
        assert layer.scaling["default"] == 1.0 and layers2[name].scaling["default"] == 2.0
        b, a = layer.lora_B["default"].weight.detach(), layer.lora_A["default"].weight.detach()
        b0, a0, w_res, s_all = kpm_reference(w0[name], covs[name], 8)
        b0, a0 = signs_as(b0, a0, b)
        assert rel(b, b0) < 1e-4 and rel(a, a0) < 1e-4, name
        assert rel(layer.get_base_layer().weight.detach(), w_res) < 1e-4, name
        # KPM: the adapter carries the r smallest singular values of W0 C_d
        got = torch.linalg.svdvals(b.double() @ a.double() @ damped(covs[name]))[:8]
        torch.testing.assert_close(got.sort().values, s_all[-8:].sort().values, rtol=1e-4, atol=1e-7)
        b2, a2 = layers2[name].lora_B["default"].weight.detach(), layers2[name].lora_A["default"].weight.detach()
        assert rel(b2 * 2 ** 0.5, b) < 1e-5 and rel(a2 * 2 ** 0.5, a) < 1e-5, name
        assert rel(layers2[name].get_base_layer().weight.detach(), w_res) < 1e-4, name


def boundary_weight(out: int, d: int, sigmas: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """(out, d) U diag(sigmas) V^T with random orthonormal U, V."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(out, len(sigmas), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d, len(sigmas), generator=g, dtype=torch.float64))
    return (u * sigmas) @ v.T, u, v


@pytest.mark.parametrize("gap", [1e-3, 0.0])
def test_near_degenerate_and_tied_boundary_singular_values(tiny, tmp_path, monkeypatch, gap):
    """C = I (so C_d = 1.01 I) and one layer's W0 with sigma_{n-r} / sigma_{n-r+1} = 1 + gap at the KPM boundary.
    With gap 1e-3 the adapter is the exact smallest-r part (float32 resolves it); with an exact tie the kept
    subspace is not unique: the invariants hold and the adapter's row space stays inside the tied block plus the
    strictly smaller components (the order float32 SVD returns, as in the authors' code)."""
    base = fresh_base(tiny)
    name = "model.layers.0.self_attn.o_proj"
    layer0 = dict(base.named_modules())[name]
    out, d = layer0.weight.shape
    n = min(out, d)
    sigmas = torch.linspace(2.0, 1.0, n, dtype=torch.float64)
    r = 8
    sigmas[n - r:] = torch.linspace(0.5, 0.3, r, dtype=torch.float64)  # the smallest r
    sigmas[n - r - 1] = sigmas[n - r] * (1 + gap)  # the largest frozen one, gap above the largest kept one
    w, u, v = boundary_weight(out, d, sigmas)
    with torch.no_grad():
        layer0.weight.copy_(w.float())
    w32 = layer0.weight.detach().double().clone()
    covs = {nm: torch.eye(m.in_features, dtype=torch.float64) for nm, m in base.named_modules()
            if nm.rsplit(".", 1)[-1] in tiny.cfg.backbone.target_modules}
    given_covariances(monkeypatch, covs)
    model = build_named("corda").prepare(base, run_context(tiny, tmp_path))
    layer = lora_layers(model)[name]
    b, a = layer.lora_B["default"].weight.detach().double(), layer.lora_A["default"].weight.detach().double()
    adapter = b @ a
    torch.testing.assert_close(layer.get_base_layer().weight.double() + adapter, w32, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.linalg.svdvals(adapter)[:r].sort().values, sigmas[n - r:].sort().values,
                               atol=1e-4, rtol=1e-4)
    if gap:
        exact = (u[:, n - r:] * sigmas[n - r:]) @ v[:, n - r:].T
        assert rel(adapter, exact) < 1e-3
    else:
        allowed = v[:, n - r - 1:]  # the tied pair and the smaller components
        outside = adapter - adapter @ allowed @ allowed.T
        assert outside.norm() < 1e-4 * adapter.norm()


# -- the model ------------------------------------------------------------------------------------------------------
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


def test_bad_hyperparameters_are_rejected():
    with pytest.raises(MethodConfigError, match=r'method.definition=\'2026-11\' is not allowed: "authors"'):
        build_named("corda", definition="2026-11")
    with pytest.raises(MethodConfigError, match="method.max_windows"):
        build_named("corda", max_windows=0)
    assert build_named("corda", rank=16).params.alpha == 16.0 and build_named("corda", alpha=4).params.alpha == 4
