"""EWC, normalised as avalanche's EWCPlugin: the Fisher is the mean over mini-batches of the squared gradient of each
mini-batch's mean response-token NLL of the base's own responses, w.r.t. the base weights; the penalty is
ewc_lambda * sum F (s B A)^2 (no 1/2), 0 at init; the Fisher is cached on disk, keyed, and reused without a backward
pass. The expected values are re-derived here from the definition, never from the module's helpers."""

from __future__ import annotations

import pytest
import torch

from types import SimpleNamespace

import baselines.ewc as ewc_module
from baselines.common import lora_layers
from baselines.ewc import FISHER_FORMAT_VERSION, diagonal_fisher, ewc_penalty, fisher_root
from experiments.calibration import CalibrationPair
from experiments.methods import MethodConfigError, build_named
from tests.baselines.baseline_helpers import fresh_base, prepared, randomize_lora_b, run_context, target_batch


def test_penalty_formula_on_hand_built_matrices():
    fisher = {"a": torch.tensor([[1.0, 2.0], [0.0, 4.0]]), "b": torch.tensor([[0.5]])}
    deltas = {"a": torch.tensor([[1.0, -1.0], [3.0, 0.5]]), "b": torch.tensor([[2.0]])}
    # 1*1 + 2*1 + 0*9 + 4*0.25 + 0.5*4
    assert ewc_penalty(fisher, deltas).item() == pytest.approx(6.0)


def test_bad_knobs_are_rejected():
    with pytest.raises(MethodConfigError, match="method.ewc_lambda"):
        build_named("ewc", ewc_lambda=-1)
    with pytest.raises(MethodConfigError, match="method.max_sequences"):
        build_named("ewc", max_sequences=0)
    with pytest.raises(MethodConfigError, match="method.fisher_batch_size"):
        build_named("ewc", fisher_batch_size=0)
    with pytest.raises(MethodConfigError, match="method.definition.*2026-11.*no longer runs"):
        build_named("ewc", definition="2026-11")


def token_nll_sum(model, pair) -> torch.Tensor:
    """sum over the response tokens of -log p(y_t | x, y_<t), one unpadded sequence, written out token by token."""
    ids = torch.tensor([pair.prompt_ids + pair.response_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    n = len(pair.prompt_ids)
    return -sum(logp[n - 1 + t, tok] for t, tok in enumerate(pair.response_ids))


def fisher_by_hand(model, weight, pairs, batch_size):
    """avalanche's importance, re-derived: for each mini-batch of consecutive pairs, the gradient of its mean token NLL
    (sum of each sequence's token NLLs, computed alone without padding, over the batch's token count), squared,
    averaged over the mini-batches (the last, smaller one counts as one)."""
    out, batches = torch.zeros_like(weight), [pairs[i: i + batch_size] for i in range(0, len(pairs), batch_size)]
    for chunk in batches:
        tokens = sum(len(p.response_ids) for p in chunk)
        loss = sum(token_nll_sum(model, p) for p in chunk) / tokens
        (grad,) = torch.autograd.grad(loss, weight)
        out += grad.pow(2)
    return out / len(batches)


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_fisher_is_the_mean_squared_gradient_of_each_mini_batch_mean_loss(tiny, tmp_path, batch_size):
    """5 sequences of different lengths: batches of 2 are padded (the last holds 1), so this also pins that padding
    changes nothing."""
    model, method, ctx = prepared(tiny, "ewc", tmp_path / "run", max_sequences=5, seed=5, fisher_batch_size=batch_size)
    pairs = method.fisher_pairs(ctx)
    assert len(pairs) == 5 and len({len(p.prompt_ids) + len(p.response_ids) for p in pairs}) > 1
    assert method.costs()["fisher_batches"] == -(-5 // batch_size)
    base = fresh_base(tiny)
    for name in ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"):
        by_hand = fisher_by_hand(base, dict(base.named_modules())[name].weight, pairs, batch_size)
        assert by_hand.abs().sum() > 0
        torch.testing.assert_close(method.fisher[name], by_hand, rtol=1e-4, atol=1e-12)
    assert set(method.fisher) == set(lora_layers(model)) and len(method.fisher) == 14


def test_fisher_batch_size_defaults_to_the_runs_train_batch_size(tiny, tmp_path):
    ctx = run_context(tiny, tmp_path)
    assert ctx.batch_size == tiny.cfg.backbone.train_batch_size == 4
    targets = list(tiny.cfg.backbone.target_modules)
    key_null, comp = build_named("ewc").fisher_key(ctx, targets)
    key_4, _ = build_named("ewc", fisher_batch_size=4).fisher_key(ctx, targets)
    key_2, _ = build_named("ewc", fisher_batch_size=2).fisher_key(ctx, targets)
    assert comp["fisher_batch_size"] == 4 and comp["format_version"] == FISHER_FORMAT_VERSION == 2
    assert key_null == key_4 != key_2
    ctx.batch_size = None  # a context built outside a run
    with pytest.raises(MethodConfigError, match="method.fisher_batch_size"):
        build_named("ewc").fisher_key(ctx, targets)


class ConstantInputLM(torch.nn.Module):
    """Every position sees the same input vector h (ones), so every response token of the same id has the same
    gradient: logits = W h. Takes the keyword arguments `sft_loss_sum` passes."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(width, vocab, bias=False)
        torch.nn.init.zeros_(self.head.weight)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=None, use_cache=None):
        h = torch.ones(*input_ids.shape, self.head.in_features)
        logits = self.head(h)
        return SimpleNamespace(logits=logits if logits_to_keep is None else logits[:, logits_to_keep])


def test_old_over_new_is_L_squared_on_identical_token_gradients():
    """One sequence of L identical response tokens y, W = 0 (p uniform over V): each token's NLL gradient is
    g = (p - e_y) h^T. New (mean over tokens): F = g^2. Old (summed log p, batch 1): F = (L g)^2 = L^2 g^2; with the
    old 1/2 in the penalty, the old penalty at lambda equals the new one at lambda * L^2 / 2."""
    vocab, width, L, y = 5, 3, 7, 2
    model = ConstantInputLM(vocab, width)
    pairs = [CalibrationPair("d", 0, [1, 4], [y] * L)]
    fisher = diagonal_fisher(model, {"head": model.head}, pairs, torch.device("cpu"), batch_size=1, pad_id=0)["head"]
    g = (torch.full((vocab,), 1.0 / vocab) - torch.nn.functional.one_hot(torch.tensor(y), vocab)).unsqueeze(1)
    g = g * torch.ones(1, width)
    torch.testing.assert_close(fisher, g.pow(2))
    old = (L * g).pow(2)
    torch.testing.assert_close(old / fisher, torch.full_like(fisher, float(L * L)))
    # Two such sequences of lengths L and 2L in one padded batch of 2: the mean over 3L tokens has gradient g again.
    pairs2 = [CalibrationPair("d", 0, [1, 4], [y] * L), CalibrationPair("d", 1, [3], [y] * (2 * L))]
    both = diagonal_fisher(model, {"head": model.head}, pairs2, torch.device("cpu"), batch_size=2, pad_id=0)["head"]
    torch.testing.assert_close(both, g.pow(2))
    # Batches of 1 instead: two batches, each g^2, averaged: g^2.
    ones = diagonal_fisher(model, {"head": model.head}, pairs2, torch.device("cpu"), batch_size=1, pad_id=0)["head"]
    torch.testing.assert_close(ones, g.pow(2))


def test_degenerate_fisher_cases():
    """A response token the model already predicts with probability 1 has gradient 0: F = 0; no pairs: F = 0."""
    model = ConstantInputLM(3, 2)
    with torch.no_grad():
        model.head.weight[1] = 100.0  # p(token 1) = 1 up to float32
    pairs = [CalibrationPair("d", 0, [0], [1, 1, 1])]
    fisher = diagonal_fisher(model, {"head": model.head}, pairs, torch.device("cpu"), batch_size=4, pad_id=0)["head"]
    assert fisher.abs().max().item() < 1e-30
    empty = diagonal_fisher(model, {"head": model.head}, [], torch.device("cpu"), batch_size=4, pad_id=0)["head"]
    assert torch.equal(empty, torch.zeros(3, 2))


def test_penalty_is_zero_at_init_and_the_formula_after(tiny, tmp_path):
    model, method, ctx = prepared(tiny, "ewc", tmp_path, ewc_lambda=250.0)
    batch = target_batch(tiny)
    assert method.extra_loss(model, batch, ctx).item() == 0.0  # B = 0: no update yet
    randomize_lora_b(model)
    by_hand = 0.0
    for name, layer in lora_layers(model).items():
        s = layer.scaling["default"]
        delta = s * layer.lora_B["default"].weight.detach() @ layer.lora_A["default"].weight.detach()
        assert s == 16 / 8
        by_hand += float((method.fisher[name] * delta.pow(2)).sum())
    loss = method.extra_loss(model, batch, ctx)
    assert by_hand > 0 and loss.item() == pytest.approx(250.0 * by_hand, rel=1e-5)  # avalanche: lambda, no 1/2
    loss.backward()
    # d/dB lambda sum F (s B A)^2 = 2 lambda s (F * s B A) A^T; d/dA = 2 lambda s B^T (F * s B A)
    for name, layer in lora_layers(model).items():
        s, B, A = layer.scaling["default"], layer.lora_B["default"].weight, layer.lora_A["default"].weight
        weighted = method.fisher[name] * (s * B.detach() @ A.detach())
        for got, want in ((B.grad, 2 * 250.0 * s * weighted @ A.detach().T),
                          (A.grad, 2 * 250.0 * s * B.detach().T @ weighted)):  # float32 sums: tolerance of the scale
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
        assert B.grad.abs().sum() > 0


def test_fisher_is_cached_on_disk_and_reused_without_a_backward_pass(tiny, tmp_path, monkeypatch):
    _, first, _ = prepared(tiny, "ewc", tmp_path / "a", max_sequences=4, seed=11)
    assert not first.costs()["fisher_cache_hit"] and first.costs()["fisher_build_seconds"] > 0
    root = fisher_root(tiny.cfg.eval.cache_dir)
    assert root == tiny.cache_dir / "fisher" and first.fisher_path.parent == root
    assert (first.fisher_path / "manifest.json").is_file() and not list(root.glob(".*tmp*"))

    def no_fisher(*args, **kwargs):
        raise AssertionError("the Fisher was recomputed although it is cached")

    monkeypatch.setattr(ewc_module, "diagonal_fisher", no_fisher)
    model, second, ctx = prepared(tiny, "ewc", tmp_path / "b", max_sequences=4, seed=11)  # another run, same key
    assert second.costs()["fisher_cache_hit"] and second.fisher_path == first.fisher_path
    for name in first.fisher:
        assert torch.equal(first.fisher[name], second.fisher[name])
    # The key holds the seed (it picks the sequences) and the settings: another seed is another Fisher.
    targets = list(tiny.cfg.backbone.target_modules)
    key_a, _ = second.fisher_key(run_context(tiny, tmp_path / "c", seed=11), targets)
    key_b, _ = second.fisher_key(run_context(tiny, tmp_path / "c", seed=12), targets)
    key_c, _ = build_named("ewc", max_sequences=5).fisher_key(run_context(tiny, tmp_path / "c", seed=11), targets)
    key_d, _ = build_named("ewc", max_sequences=4, fisher_batch_size=1).fisher_key(
        run_context(tiny, tmp_path / "c", seed=11), targets)
    monkeypatch.setattr(ewc_module, "FISHER_FORMAT_VERSION", 1)  # a Fisher cached by the earlier definition
    key_old, _ = second.fisher_key(run_context(tiny, tmp_path / "c", seed=11), targets)
    assert len({key_a, key_b, key_c, key_d, key_old}) == 5
    with pytest.raises(AssertionError, match="recomputed"):
        prepared(tiny, "ewc", tmp_path / "d", max_sequences=4, seed=12)
