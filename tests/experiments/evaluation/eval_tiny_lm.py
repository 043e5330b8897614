"""Tiny offline language models and tokenizers for the evaluation tests (no hub access)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

# The tiny models are far too small to gain from intra-op threads; with the machine's cores busy,
# extra threads only spin. One thread keeps these tests fast and their timing stable.
torch.set_num_threads(1)

CORPUS = [
    "Question: What is 12 + 7?\nAnswer: 12 + 7 = 19\n#### 19",
    "Question: Where do you sleep?\nChoices: bedroom, court, ocean\nAnswer: bedroom",
    "### Instruction:\nComplete the following Python function.\ndef add(a, b):\n    return a + b\n### Response:\n",
    "0 1 2 3 4 5 6 7 8 9 the a of and is what where kitchen garden car",
]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocab ~300) with `<eos>` and `<pad>`, trained on a few strings."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def tiny_model(tokenizer, seed: int = 0, hidden: int = 32) -> Qwen3ForCausalLM:
    """A 2-layer random Qwen3 in eval mode whose vocabulary covers `tokenizer`."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(cfg)
    # Random init at std 0.02 gives near-uniform next-token distributions; sharpen them so
    # greedy and sampled decoding differ and KL values are not all tiny.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def perturbed_copy(model: Qwen3ForCausalLM, tokenizer, scale: float = 0.05, seed: int = 1) -> Qwen3ForCausalLM:
    """A second model: `model`'s weights plus seeded Gaussian noise (an 'adapted' model)."""
    other = tiny_model(tokenizer, seed=0)
    other.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.detach().std() + 1e-3))
    return other.eval()
