"""The layer's one-matmul forms (atlas/layer.py) equal the equation of docs/method.md computed
directly in float64 — explicit differences x - c_k and explicit d x d projections
Pi = I - U_{k*} U_{k*}^T (hard) or I - sum_k w_k U_k U_k^T (soft) — in outputs and in the gradients
with respect to the input and both factors; and the cached A U of the no-autograd path follows A."""

import pytest
import torch

from atlas.atlas import EPS
from atlas.layer import AtlasLinear, AtlasSite
from tests.atlas.atlas_helpers import layer_site, site_atlas


def clustered_site(d=24, k=4, cap=3, seed=0, gate_signal="distance"):
    """An atlas of four clusters, filter ranks from 1 to the cap (zero-padded filters included)."""
    g = torch.Generator().manual_seed(seed)
    spreads = [0.2, 0.6, 1.2, 2.0]
    x = torch.cat([torch.randn(150, d, generator=g) * spreads[j] + 5 * torch.eye(d)[j] for j in range(k)])
    site = site_atlas(x, k, 0.8, cap, 0.9, seed, gate_signal=gate_signal)
    return site, x


def inputs(site, x, seed=1):
    """Calibration-like points, points near the centers, far points and plain noise, as (2, n / 2, d)."""
    g = torch.Generator().manual_seed(seed)
    d = site.centers.shape[1]
    pts = torch.cat([x[::37], site.centers + 0.05 * torch.randn(site.centers.shape, generator=g),
                     torch.randn(4, d, generator=g) * 20, torch.randn(6, d, generator=g)])
    pts = pts[: pts.shape[0] // 2 * 2]
    return pts.reshape(2, -1, d)


def layer_for(site, out=10, seed=2, **kw):
    torch.manual_seed(seed)
    layer = AtlasLinear(torch.nn.Linear(site.centers.shape[1], out), layer_site(site, **kw), rank=4, alpha=8)
    with torch.no_grad():
        layer.lora_B.normal_()
    return layer


def reference_residual(layer, x, A, B):
    """s g(x) B A Pi(x) x, term by term in float64 (x, A, B float64 leaves)."""
    site = layer.site
    flat = x.reshape(-1, x.shape[-1])
    c = site.centers.double()
    delta_k = (flat[:, None, :] - c[None]).square().sum(-1) * site.inv_sigma2.double()  # (n, K)
    delta, kstar = delta_k.min(1)
    h = flat
    if site.use_filter:
        u = site.filters.double()  # (K, d, R), zero columns past each rank
        eye = torch.eye(flat.shape[1], dtype=torch.float64)
        proj = torch.einsum("kdr,ker->kde", u, u)  # U_k U_k^T
        if site.assign == "soft":
            w = torch.softmax(-delta_k / site.assign_temperature, dim=1)
            pi = eye - torch.einsum("nk,kde->nde", w, proj)
        else:
            pi = eye - proj[kstar]
        h = torch.einsum("nde,ne->nd", pi, flat)
    res = h @ A.T @ B.T * (layer.scaling * layer.scale_factor)
    if site.use_gate:
        signal = delta
        if site.gate_signal == "subspace":  # the share of x's energy outside U_k*: ||(I - U U^T) x||^2 / ||x||^2
            u = site.filters.double()[kstar]  # (n, d, R)
            outside = flat - torch.einsum("ndr,ner,ne->nd", u, u, flat)
            signal = outside.square().sum(1) / flat.square().sum(1)
        gate = torch.sigmoid(site.gate_slope.double() * (signal.clamp_min(EPS).log() - site.log_q.double())
                             / site.gate_temperature)
        res = res * gate[:, None]
    return res.reshape(*x.shape[:-1], -1)


def reference(layer, x, A, B):
    """y = W x + b + s g(x) B A Pi(x) x in float64."""
    return x @ layer.base.weight.double().T + layer.base.bias.double() + reference_residual(layer, x, A, B)


def grads_both(layer, x):
    """(fast output, fast grads, reference output, reference grads) for loss sum(y * R)."""
    R = torch.randn(*x.shape[:-1], layer.out_features, generator=torch.Generator().manual_seed(3))
    xf = x.clone().requires_grad_(True)
    y = layer(xf)
    (y * R).sum().backward()
    fast = (xf.grad, layer.lora_A.grad, layer.lora_B.grad)
    xd = x.double().requires_grad_(True)
    A = layer.lora_A.detach().double().requires_grad_(True)
    B = layer.lora_B.detach().double().requires_grad_(True)
    yr = reference(layer, xd, A, B)
    (yr * R.double()).sum().backward()
    return y, fast, yr, (xd.grad, A.grad, B.grad)


def close(a, b, rel=1e-4):
    scale = b.abs().max().item()
    torch.testing.assert_close(a.double(), b.double(), rtol=rel, atol=rel * max(scale, 1e-6))


def assert_matches_equation(layer, pts):
    """The layer's output, residual and gradients (input, A, B) equal the float64 equation's on `pts`."""
    y, fast, yr, ref = grads_both(layer, pts)
    close(y, yr)
    close(layer.residual(pts).detach(), reference_residual(layer, pts.double(), layer.lora_A.double(), layer.lora_B.double()))
    for g_fast, g_ref in zip(fast, ref):
        close(g_fast, g_ref)


@pytest.mark.parametrize("gate_signal", ["distance", "subspace"])
@pytest.mark.parametrize("assign,temperature", [("hard", 1.0), ("soft", 1.0), ("soft", 0.3)])
@pytest.mark.parametrize("use_gate,use_filter", [(True, True), (True, False), (False, True)])
def test_outputs_and_gradients_match_the_equation(assign, temperature, use_gate, use_filter, gate_signal):
    site, x = clustered_site(gate_signal=gate_signal)
    ranks = site.ranks.tolist()
    assert min(ranks) < site.filters.shape[2], "the atlas should include zero-padded filters"
    layer = layer_for(site, assign=assign, assign_temperature=temperature, use_gate=use_gate, use_filter=use_filter,
                      gate_signal=gate_signal)
    assert_matches_equation(layer, inputs(site, x))


def test_a_fitted_gate_slope_matches_the_equation():
    """g(x) = sigmoid(slope (log s(x) - log q) / T) with the atlas's slope (a logistic gate's), outputs and gradients."""
    site, x = clustered_site(seed=7)
    site.gate_slope = torch.tensor(2.5)
    layer = layer_for(site, gate_temperature=0.7)
    y, fast, yr, ref = grads_both(layer, inputs(site, x))
    close(y, yr)
    for g_fast, g_ref in zip(fast, ref):
        close(g_fast, g_ref)


def test_modules_sharing_a_site_match_the_equation():
    site, x = clustered_site(seed=4)
    shared = layer_site(site, assign="soft", assign_temperature=0.5)
    torch.manual_seed(0)
    q = AtlasLinear(torch.nn.Linear(24, 12), shared, rank=4, alpha=8)
    k = AtlasLinear(torch.nn.Linear(24, 6), shared, rank=4, alpha=8)
    with torch.no_grad():
        q.lora_B.normal_(); k.lora_B.normal_()
    pts = inputs(site, x).requires_grad_(True)
    (q(pts).square().sum() + k(pts).sum()).backward()
    xd = pts.detach().double().requires_grad_(True)
    factors = [m.lora_A.detach().double().requires_grad_(True) for m in (q, k)] + \
              [m.lora_B.detach().double().requires_grad_(True) for m in (q, k)]
    (reference(q, xd, factors[0], factors[2]).square().sum() + reference(k, xd, factors[1], factors[3]).sum()).backward()
    close(pts.grad, xd.grad)
    for mod, a, b in ((q, factors[0], factors[2]), (k, factors[1], factors[3])):
        close(mod.lora_A.grad, a.grad)
        close(mod.lora_B.grad, b.grad)


def test_bf16_backbone_matches_the_equation_to_bf16_precision():
    site, x = clustered_site(seed=5)
    from atlas.atlas import cast

    layer = layer_for(cast(site, torch.bfloat16))
    layer.base.to(torch.bfloat16)
    pts = inputs(site, x).to(torch.bfloat16)
    with torch.no_grad():
        res = layer.residual(pts)
        ref = reference_residual(layer, pts.double(), layer.lora_A.double(), layer.lora_B.double())
    assert res.dtype == torch.bfloat16
    close(res, ref, rel=3e-2)


def test_cached_filtered_a_follows_every_change_of_a():
    site, x = clustered_site(seed=6)
    layer = layer_for(site)
    pts = inputs(site, x)

    def fresh():  # autograd path: A U recomputed from the current A
        with torch.enable_grad():
            return layer.residual(pts).detach()

    with torch.no_grad():
        first = layer.residual(pts)
        assert layer.filtered_a() is layer.filtered_a()  # kept between calls without autograd
        torch.testing.assert_close(first, fresh())
        layer.lora_A.add_(0.1)  # in place, as an optimizer step
        second = layer.residual(pts)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, fresh())
    layer.lora_A.data = torch.randn_like(layer.lora_A)  # reassigned storage
    with torch.no_grad():
        torch.testing.assert_close(layer.residual(pts), fresh())
    layer.lora_A.data = torch.randn_like(layer.lora_A)
    with torch.inference_mode():
        inf = layer.residual(pts)
    assert layer._filtered_a[1].is_inference()
    with torch.no_grad():  # a value cached under inference mode is not reused outside it
        torch.testing.assert_close(layer.residual(pts), inf)
        assert not layer.filtered_a().is_inference()
    torch.testing.assert_close(inf, fresh())


# -- one row without autograd (batch-1 decoding): AtlasSite.condition_row, AtlasLinear.forward_row ------------------
def reference_at(layer, x, lam):
    """y = W x + b + s (1 - lam + lam g(x)) B A (x - lam U_k* U_k*^T x) in float64, hard assignment, per row of x."""
    site = layer.site
    flat = x.double().reshape(-1, x.shape[-1])
    delta, kstar = ((flat[:, None, :] - site.centers.double()[None]).square().sum(-1)
                    * site.inv_sigma2.double()).min(1)
    u = site.filters.double()[kstar]  # (n, d, R)
    inside = torch.einsum("ndr,ner,ne->nd", u, u, flat)  # U_k* U_k*^T x
    h = flat - lam * inside if site.use_filter else flat
    res = h @ layer.lora_A.double().T @ layer.lora_B.double().T * (layer.scaling * layer.scale_factor)
    if site.use_gate:
        signal = delta if site.gate_signal == "distance" else (flat - inside).square().sum(1) / flat.square().sum(1)
        g = torch.sigmoid(site.gate_slope.double() * (signal.clamp_min(EPS).log() - site.log_q.double())
                          / site.gate_temperature)
        res = res * (1 - lam + lam * g)[:, None]
    return flat @ layer.base.weight.double().T + layer.base.bias.double() + res


@pytest.mark.parametrize("gate_signal", ["distance", "subspace"])
@pytest.mark.parametrize("use_gate,use_filter", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("basis", [None, 6])
@pytest.mark.parametrize("lam", [1.0, 0.4, 0.0])
def test_one_row_without_autograd_matches_the_equation_and_the_batched_forms(gate_signal, use_gate, use_filter, basis,
                                                                             lam):
    """Each row alone (as in batch-1 decoding) gives the float64 equation's output, the batched forward's to float32
    rounding, and the batched search's nearest center; with autograd, or soft-assigned filters, a row takes the
    batched forms."""
    site, x = clustered_site(seed=3, gate_signal=gate_signal) if basis is None else (None, None)
    if basis is not None:
        g = torch.Generator().manual_seed(3)
        x = torch.cat([torch.randn(150, 24, generator=g) * s + 5 * torch.eye(24)[j]
                       for j, s in enumerate([0.2, 0.6, 1.2, 2])])
        site = site_atlas(x, 4, 0.8, 3, 0.9, 3, gate_signal=gate_signal, filter_basis=basis)
        assert site.basis is not None
    layer = layer_for(site, use_gate=use_gate, use_filter=use_filter, gate_signal=gate_signal, conditioning=lam)
    pts = inputs(site, x).reshape(-1, 24)
    with torch.no_grad():
        batched = layer(pts.unsqueeze(0))[0]
        rows = torch.cat([layer(p.reshape(1, 1, 24)).reshape(1, -1) for p in pts])
        kstar = layer.site.nearest(pts)
        if lam != 0.0:
            assert [layer.site.condition_row(p.reshape(1, 1, 24))[1] for p in pts] == kstar.tolist()
    close(rows, reference_at(layer, pts, lam))
    close(rows, batched, rel=1e-5)
    calls = []
    layer.site.condition_row = lambda x: calls.append(x) or AtlasSite.condition_row(layer.site, x)
    with torch.no_grad():
        layer(pts[:1].reshape(1, 1, 24))
    assert len(calls) == 1
    layer(pts[:1].reshape(1, 1, 24))  # with autograd: the batched forms
    layer.site.assign = "soft"
    with torch.no_grad():
        layer(pts[:1].reshape(1, 1, 24))
    assert len(calls) == 1 + (not use_filter)  # soft assignment needs every filter, unless there is none


def test_one_row_follows_changes_of_a_and_of_the_gate():
    """The kept per-center blocks of A U and the gate's constants are recomputed once A, the slope or the threshold
    change (in place, as an optimizer step or a fitted gate would)."""
    site, x = clustered_site(seed=8, gate_signal="subspace")
    layer = layer_for(site, gate_signal="subspace")
    row = inputs(site, x)[0, :1].reshape(1, 1, 24)
    with torch.no_grad():
        first = layer(row)
        close(first.reshape(1, -1), reference_at(layer, row.reshape(1, -1), 1.0))
        layer.lora_A.add_(0.1)
        layer.site.gate_slope.mul_(3.0)
        layer.site.log_q.sub_(0.5)
        second = layer(row.clone())
    assert not torch.allclose(first, second)
    close(second.reshape(1, -1), reference_at(layer, row.reshape(1, -1), 1.0))


def test_one_row_follows_the_conditioning_knob_a_move_and_replaced_filters():
    """The per-center A Pi_k and the site's constants are rebuilt when the knob c changes, when the layer moves to
    another dtype, and when a buffer is replaced by another tensor (whose version counter may equal the old one's)."""
    site, x = clustered_site(seed=9, gate_signal="subspace")
    layer = layer_for(site, gate_signal="subspace")
    row = inputs(site, x)[0, :1].reshape(1, 1, 24)
    with torch.no_grad():
        close(layer(row).reshape(1, -1), reference_at(layer, row.reshape(1, -1), 1.0))
        layer.site.conditioning = 0.5
        close(layer(row.clone()).reshape(1, -1), reference_at(layer, row.reshape(1, -1), 0.5))
        layer.site.conditioning = 1.0
        layer.double()
        row64 = row.double()
        out64 = layer(row64)
        assert out64.dtype == torch.float64 and layer.filtered_a_rows()[0].dtype == torch.float64
        close(out64.reshape(1, -1), reference_at(layer, row64.reshape(1, -1), 1.0))
        g = torch.Generator().manual_seed(4)
        q, _ = torch.linalg.qr(torch.randn(site.filters.shape[0], 24, site.filters.shape[2], dtype=torch.float64,
                                           generator=g))
        layer.site.filters = q  # a new tensor in place of the buffer
        close(layer(row64.clone()).reshape(1, -1), reference_at(layer, row64.reshape(1, -1), 1.0))
