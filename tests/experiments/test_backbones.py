"""Backbones load through from_pretrained from a local folder: tiny random Qwen3 and Llama configs."""

import pytest
import torch

from experiments.backbones import BackboneError, backbone_key, load_backbone, resolve_path
from tests.conftest import backbone_config, build_tiny_tokenizer


def backbone_cfg(path, **kw):
    return backbone_config(path, **{"name": "tiny", "target_modules": ["q_proj", "v_proj", "down_proj"], **kw})


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_tiny_random_model_loads_through_from_pretrained(tmp_path, arch):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = build_tiny_tokenizer(["def f(x):\n    return x + 1\n", "Question: 2 + 3?\nAnswer: 5"])
    tok.save_pretrained(tmp_path)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = (Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common)) if arch == "qwen3"
             else LlamaForCausalLM(LlamaConfig(**common)))
    model.save_pretrained(tmp_path)

    loaded, tokenizer = load_backbone(backbone_cfg(tmp_path, dtype="bfloat16"))
    assert loaded.dtype == torch.bfloat16 and not loaded.training
    assert tokenizer.pad_token_id is not None
    ids = tokenizer("Question: 2 + 3?", return_tensors="pt")
    out = loaded.generate(**ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] == ids["input_ids"].shape[1] + 3
    # Same weights as saved (bf16 cast aside).
    ref = model.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16)
    assert torch.equal(loaded.model.layers[0].self_attn.q_proj.weight, ref)


def test_missing_target_module_is_named(tiny_backbone_dir):
    with pytest.raises(BackboneError, match=r"backbone.target_modules=\['q_proj', 'wq'\] is not allowed: .*\['wq'\] not found"):
        load_backbone(backbone_cfg(tiny_backbone_dir, target_modules=["q_proj", "wq"]))


def test_missing_local_folder_is_an_error():
    with pytest.raises(BackboneError, match=r"backbone.path='assets/nope' is not allowed: an existing local folder or a hub id"):
        resolve_path("assets/nope")


def test_hub_ids_pass_through_and_key_tracks_weights(tiny_backbone_dir, tmp_path):
    assert resolve_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    key = backbone_key(backbone_cfg(tiny_backbone_dir))
    assert key == backbone_key(backbone_cfg(tiny_backbone_dir))
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_backbone_dir, copy)
    assert backbone_key(backbone_cfg(copy)) == key  # same files, same key
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"hidden_size": 32', '"hidden_size": 32 '))
    assert backbone_key(backbone_cfg(copy)) != key


def test_a_backbone_that_can_be_neither_read_nor_fetched_fails_in_one_line(tiny_backbone_dir, tmp_path, monkeypatch):
    import shutil

    import huggingface_hub.constants

    from experiments.backbones import require_available

    require_available(backbone_config(tiny_backbone_dir))  # a complete local folder
    bare = tmp_path / "bare"
    shutil.copytree(tiny_backbone_dir, bare)
    for weights in bare.glob("model*.safetensors*"):
        weights.unlink()
    with pytest.raises(BackboneError, match="lacks model weights"):
        require_available(backbone_config(bare))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(BackboneError, match="backbone.path='nobody/no-such-model' is not allowed: a backbone in the local hub cache while HF_HUB_OFFLINE"):
        require_available(backbone_config("nobody/no-such-model"))


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True])
def test_the_mission_command_without_weights_stops_before_any_job(tmp_path, sweep):
    """`python run.py -m method=atlas,lora backbone=qwen3-8b seed=0,1,2` on a machine without the weights: one line
    naming the model id, exit 2, no run directory left (it took 171 s and six tracebacks before)."""
    from tests.conftest import run_cli

    args = ["-m", "method=atlas,lora", "seed=0,1,2"] if sweep else []
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")}
    done = run_cli([*args, "backbone=qwen3-8b", f"run_root={tmp_path / 'runs'}"], env=env)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == ["error: backbone.path='Qwen/Qwen3-8B' is not allowed: a backbone in the local hub cache while "
                     "HF_HUB_OFFLINE is set; "
                     "download it first (`huggingface-cli download Qwen/Qwen3-8B` where the hub is reachable, then "
                     "copy the hub cache here) or set backbone.path to a local folder holding it"], done.stderr
    left = [p for p in (tmp_path / "runs").rglob("*") if p.is_dir()] if (tmp_path / "runs").exists() else []
    assert not [p for p in left if p.name != ".sweeps" and ".sweeps" not in p.parts], left
