"""The weightless storage/FLOPs estimate agrees with a real built atlas and a real peft LoRA adapter."""

import json

import pytest

from atlas.footprint import footprint, main, module_shapes
from tests.atlas.test_atlas import TARGETS, prepared, tiny_model


def test_module_shapes_match_a_real_model(tiny_backbone_dir):
    model, _, _ = tiny_model(tiny_backbone_dir)
    c = model.config
    shapes = module_shapes({k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                       "num_key_value_heads", "head_dim")})
    layer = model.model.layers[0]
    for name, (din, dout) in shapes.items():
        mod = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
        assert (mod.in_features, mod.out_features) == (din, dout)


def test_counts_match_a_built_atlas_and_peft_lora(tiny_backbone_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, method, _ = prepared(tiny_backbone_dir, tmp_path, rank=4, alpha=8)
    c = model.config
    shapes = {k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "head_dim")}
    sites = method.atlas.values()
    k = method.params.num_centers
    # d-weighted mean filter rank, so that sum_sites d * K * mean = the stored filter columns exactly
    mean_rank = sum(s.centers.shape[1] * int(s.ranks.sum()) for s in sites) / (k * sum(s.centers.shape[1] for s in sites))
    est = footprint(shapes, 4, k, method.params.filter_rank, TARGETS, bytes_per_value=4, mean_filter_rank=mean_rank)
    real_atlas = sum(s.centers.numel() + s.sigma2.numel() + s.centers.shape[1] * int(s.ranks.sum()) + 1 for s in sites)
    assert est["atlas_params"] == pytest.approx(real_atlas)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    base, _, _ = tiny_model(tiny_backbone_dir)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    assert est["lora_params"] == trainable == sum(p.numel() for p in lora.parameters() if p.requires_grad)


def test_cli_reports_qwen3_8b(capsys):
    main(["--backbone", "qwen3-8b", "--num-centers", "16", "--filter-rank", "8", "--rank", "8"])
    out = json.loads(capsys.readouterr().out)
    # Qwen3-8B: 36 layers; LoRA r=8 on all seven projections = 606,208 params per layer.
    assert out["lora_params"] == 36 * 8 * (8192 + 5120 + 5120 + 8192 + 16384 + 16384 + 16384)
    assert out["ratio_to_lora"] > 1
