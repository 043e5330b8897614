"""The fused LoRA forward equals peft's own: outputs, gradients, scales, and every case it leaves to peft."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora.layer import Linear as PeftLinear

from baselines.fused_lora import FusedLoraLinear
from experiments.methods import build_named


def tiny(dtype=torch.float32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8)
    return Qwen3ForCausalLM(config).to(dtype)


def pair(dropout=0.0, dtype=torch.float32):
    """(the suite's LoRA model, plain peft's) with identical non-zero factors."""
    targets = ["q_proj", "v_proj", "down_proj"]
    ours = get_peft_model(tiny(dtype), build_named("lora", rank=4, alpha=8, dropout=dropout).lora_config(targets))
    theirs = get_peft_model(tiny(dtype), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets,
                                                    bias="none", task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
                q.copy_(p)
    return ours, theirs


def batch():
    ids = torch.randint(1, 64, (3, 11), generator=torch.Generator().manual_seed(2))
    return {"input_ids": ids, "labels": ids}


def test_the_suite_lora_layers_are_the_fused_subclass_and_the_fused_path_runs(monkeypatch):
    ours, _ = pair()
    layers = [m for m in ours.modules() if isinstance(m, PeftLinear)]
    assert len(layers) == 6 and all(isinstance(m, FusedLoraLinear) for m in layers)

    def refuse(*a, **k):
        raise AssertionError("peft's forward ran in the plain case")

    monkeypatch.setattr(PeftLinear, "forward", refuse)
    ours.train()(**batch())  # no fallback: the fused form alone


def test_fused_forward_and_gradients_equal_peft():
    ours, theirs = pair()
    out_a, out_b = ours(**batch()), theirs(**batch())
    torch.testing.assert_close(out_a.logits, out_b.logits, rtol=1e-5, atol=1e-6)
    out_a.loss.backward()
    out_b.loss.backward()
    grads_b = {n: p.grad for n, p in theirs.named_parameters() if p.requires_grad}
    for n, p in ours.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, grads_b[n], rtol=1e-5, atol=1e-7)
    for model in (ours, theirs):  # a post-hoc scale goes through peft's own `scaling`
        for m in model.modules():
            if isinstance(m, PeftLinear):
                m.set_scale("default", 0.4)
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch()).logits, theirs(**batch()).logits, rtol=1e-5, atol=1e-6)


def test_cases_left_to_peft_give_peft_outputs():
    ours, theirs = pair()
    with torch.no_grad():
        with ours.disable_adapter(), theirs.disable_adapter():  # adapters off: the base
            torch.testing.assert_close(ours(**batch()).logits, theirs(**batch()).logits)
        ours.merge_adapter()
        theirs.merge_adapter()
        torch.testing.assert_close(ours(**batch()).logits, theirs(**batch()).logits, rtol=1e-5, atol=1e-5)
    # dropout in training: peft's forward, the same random masks from the same seed
    ours, theirs = pair(dropout=0.3)
    ours.train(), theirs.train()
    torch.manual_seed(5)
    a = ours(**batch()).logits
    torch.manual_seed(5)
    b = theirs(**batch()).logits
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_a_half_precision_base_takes_peft_casts(dtype):
    ours, theirs = pair(dtype=dtype)
    layer = next(m for m in ours.modules() if isinstance(m, FusedLoraLinear))
    assert layer.lora_A["default"].weight.dtype == torch.float32  # peft keeps adapters in float32
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch()).logits, theirs(**batch()).logits)
